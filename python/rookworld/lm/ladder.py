"""The ladder: a model rated against a pool of opponents whose rungs a small model can climb.

The rungs, weakest first (`RUNGS`):
- `random`: a uniformly random legal move;
- `material`: a mate if it has one, else the move that leaves it the most material one ply on (ties at random);
- Stockfish searching 1 node a move at full strength;
- Stockfish at Skill Level 0, searching 1,000 nodes a move, then 20,000;
- Stockfish at UCI_Elo 1350 (its lowest calibrated level in Stockfish 15.1), 20,000 nodes a move: the anchor;
- Stockfish at UCI_Elo 1600.

Each neighbouring pair of rungs plays its own games, so that the pool is rated on one scale. The model plays every
rung. One joint fit of every game (`rookworld.lm.rating`) rates the model and the rungs, with the anchor at 1350.
Games are played in pairs from the same start position (the start, then opening-book positions), colours swapped.
The model's moves are chosen as `rookworld uci` chooses them (never illegal: its own B: move when legal, else its
likeliest legal one), and how often its own move was illegal is counted.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rookworld.chess import rules
from rookworld.chess.pgn import game_pgn
from rookworld.lm.games import BLACK, WHITE, Choice, Game, Player, StockfishPlayer, model_score, play_games
from rookworld.lm.moves import LIKELIEST
from rookworld.lm.rating import fit_ratings

#: The rung held at a known rating, and that rating: Stockfish's UCI_Elo is calibrated in Elo.
ANCHOR, ANCHOR_ELO = "stockfish-elo-1350", 1350.0
#: Pieces' worth in pawns, for the material rung (the king is never taken).
PIECE_VALUES = {"p": 1, "n": 3, "b": 3, "r": 5, "q": 9, "k": 0}


class RandomPlayer:
    """A uniformly random legal move (seeded: the same games every run)."""

    def __init__(self, seed: int = 0):
        self.name, self.rng = "random", random.Random(seed)

    def choose(self, games: Sequence[Game]) -> list[Choice]:
        return [Choice(self.rng.choice(moves)) for moves in rules.legal_moves_batch([g.fen for g in games])]


def material(fen: str, colour: str) -> int:
    """`colour`'s material less its opponent's, in pawns, from a FEN's placement."""
    total = 0
    for c in fen.split()[0]:
        if c.lower() in PIECE_VALUES:
            worth = PIECE_VALUES[c.lower()]
            total += worth if c.isupper() == (colour == WHITE) else -worth
    return total


class MaterialPlayer:
    """One ply of search by material: a mating move first, else the move after which its material most exceeds
    the opponent's; ties at random (seeded)."""

    def __init__(self, seed: int = 0):
        self.name, self.rng = "material", random.Random(seed)

    def choose(self, games: Sequence[Game]) -> list[Choice]:
        out = []
        for g, moves in zip(games, rules.legal_moves_batch([g.fen for g in games])):
            steps = rules.env_steps([g.fen] * len(moves), moves)
            worth = [1000 if s.terminated and s.reward == 1.0 else material(s.fen, g.turn) for s in steps]
            best = max(worth)
            out.append(Choice(self.rng.choice([m for m, w in zip(moves, worth) if w == best])))
        return out


@dataclass(frozen=True)
class Rung:
    """One opponent of the ladder: its name in reports, and how to make it (given the Stockfish path and a seed)."""

    name: str
    make: Callable[[str | None, int], Player]


RUNGS = (
    Rung("random", lambda path, seed: RandomPlayer(seed)),
    Rung("material", lambda path, seed: MaterialPlayer(seed)),
    Rung("stockfish-1-node", lambda path, seed: StockfishPlayer(path, nodes=1)),
    Rung("stockfish-skill-0-1k", lambda path, seed: StockfishPlayer(path, skill=0, nodes=1_000)),
    Rung("stockfish-skill-0-20k", lambda path, seed: StockfishPlayer(path, skill=0, nodes=20_000)),
    Rung(ANCHOR, lambda path, seed: StockfishPlayer(path, elo=1350, nodes=20_000)),
    Rung("stockfish-elo-1600", lambda path, seed: StockfishPlayer(path, elo=1600, nodes=20_000)),
)


@dataclass
class Pairing:
    """Games between two players, `first` playing white in the even ones."""

    first: str
    second: str
    games: list[Game]

    def scores(self) -> list[float]:
        """The first player's score in each game (a game stopped at the ply limit is a draw)."""
        return [model_score(g, WHITE if i % 2 == 0 else BLACK) for i, g in enumerate(self.games)]


def paired_games(starts: Sequence[str], games: int) -> list[Game]:
    """`games` games, two from each start position (the first player white, then black)."""
    return [Game(start_fen=starts[i // 2]) for i in range(games)]


def play_pairings(pairings: Sequence[Pairing], players: dict[str, Player], *, max_plies: int, progress=None
                  ) -> None:
    """Every pairing's games at once, so that each player answers all of its games to move in one batch."""
    order = list(players)
    games = [g for p in pairings for g in p.games]
    side: dict[int, tuple[str, str]] = {}  # a game's (white, black)
    for p in pairings:
        for i, g in enumerate(p.games):
            side[id(g)] = (p.first, p.second) if i % 2 == 0 else (p.second, p.first)
    play_games(games, [players[n] for n in order],
               lambda g: order.index(side[id(g)][0 if g.turn == WHITE else 1]), max_plies=max_plies,
               progress=progress)


def pgn_of(pairing: Pairing, index: int, round_: int) -> str:
    game = pairing.games[index]
    white, black = (pairing.first, pairing.second) if index % 2 == 0 else (pairing.second, pairing.first)
    headers = {"Event": "rookworld ladder", "Date": "????.??.??", "Round": str(round_), "White": white,
               "Black": black}
    if game.reason:
        headers["Termination"] = game.reason
    return game_pgn(headers, game.start_fen, game.moves, game.result)


def own_move_illegal(pairings: Sequence[Pairing]) -> tuple[int, float | None]:
    """The model's moves, and the share of them whose own B: move was illegal (its likeliest legal move played)."""
    sources = [s for p in pairings for g in p.games for s in g.sources if s is not None]
    return len(sources), (sum(s == LIKELIEST for s in sources) / len(sources) if sources else None)


def ladder_games(games: int, rungs: Sequence[Rung] = RUNGS) -> int:
    """The games a ladder plays: the model's against each rung, and each neighbouring pair of rungs'."""
    return games * (2 * len(rungs) - 1)


def run_ladder(model: Player, starts: Sequence[str], *, games: int, seed: int, max_plies: int,
               stockfish_path: str | None = None, rungs: Sequence[Rung] = RUNGS, progress=None
               ) -> tuple[dict[str, dict], list[dict], str]:
    """The model's `games` games against each rung and each neighbouring pair of rungs' `games`, two from each of
    `starts`, every game in one rating fit: the report's sections (the model's rating and illegal moves; each
    rung's score and rating), one item per game (with its PGN), and what the ladder was."""
    players: dict[str, Player] = {"model": model}
    try:
        for rung in rungs:
            players[rung.name] = rung.make(stockfish_path, seed)
        against = [Pairing("model", r.name, paired_games(starts, games)) for r in rungs]
        pool = [Pairing(a.name, b.name, paired_games(starts, games)) for a, b in zip(rungs, rungs[1:])]
        play_pairings(against + pool, players, max_plies=max_plies, progress=progress)
    finally:
        for player in players.values():
            if hasattr(player, "close"):
                player.close()
    played = [(p.first, p.second, s) for p in against + pool for s in p.scores()]
    ratings = fit_ratings(played, ANCHOR, ANCHOR_ELO)
    moves, illegal = own_move_illegal(against)
    r = ratings["model"]
    sections = {"ladder": {"n": r.games, "rating": r.elo, "rating_low": r.low, "rating_high": r.high,
                           "score": r.points / r.games, "model_moves": moves, "own_move_illegal": illegal,
                           "ply_limit": sum(g.reason == "ply limit" for p in against for g in p.games) / r.games}}
    for p in against:
        sections[f"ladder/{p.second}"] = {"n": len(p.games), "score": sum(p.scores()) / len(p.games),
                                          "rating": ratings[p.second].elo}
    items = [{"white": p.first if i % 2 == 0 else p.second, "black": p.second if i % 2 == 0 else p.first,
              "pgn": pgn_of(p, i, k + 1), **g.to_dict()}
             for k, p in enumerate(against + pool) for i, g in enumerate(p.games)]
    about = (f"{len(rungs)} rungs from {rungs[0].name} to {rungs[-1].name}, {games} games a pairing, up to "
             f"{max_plies} plies; rated in one fit, {ANCHOR} held at {ANCHOR_ELO:.0f}")
    return sections, items, about
