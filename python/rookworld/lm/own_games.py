"""Positions from the model's own games: the distribution where it plays, and fails to play, a legal move.

Positions of Stockfish's games are not where a weak model goes wrong: its own games drift into boards no strong
player reaches, and there it writes illegal moves. Here the model plays both sides (sampled, so that games from one
opening differ), with the fall-back that keeps a game going past an illegal B: move (its likeliest legal move at its B:,
`ModelPlayer(fallback=True)`), and every position it moved in is kept with its game's
history: all of them, or (`failures_only`) those where its own B: move was illegal or missing. Training on them is
kn1ght-bullet's legality self-training, with Stockfish's analysis as the labels (`rookworld positions --from-model
MODEL --annotate`).
"""

from __future__ import annotations

from collections.abc import Iterator

from rookworld.chess import rules
from rookworld.chess.data import Record
from rookworld.lm.answers import ROOKWORLD, Decoding, RookWorldLM
from rookworld.lm.games import Game, ModelPlayer, play_games
from rookworld.lm.moves import BEST
from rookworld.lm.suites import opening_fens

#: Games a round: the model answers them in one batch a move.
ROUND_GAMES = 64


def game_records(game: Game, source: str, failures_only: bool) -> list[Record]:
    """The positions `game` was played through, each with the moves before it from the game's start as history and
    the move played as its A: move; with `failures_only`, only where the model's own B: move was not played."""
    records, fen = [], game.start_fen
    steps = []
    for move in game.moves:  # the FENs one move at a time: each depends on the last
        steps.append(fen)
        fen = rules.env_steps([fen], [move])[0].fen
    for i, (before, move) in enumerate(zip(steps, game.moves)):
        if failures_only and game.sources[i] == BEST:
            continue
        records.append(Record(fen=before, history=tuple(game.moves[:i]), move=move, source=f"{source}:{i}"))
    return records


def own_game_rounds(lm: RookWorldLM, *, seed: int, failures_only: bool = True, max_plies: int = 200,
                    decoding: Decoding = ROOKWORLD) -> Iterator[list[Record]]:
    """Rounds of `ROUND_GAMES` self-play games from the start and the opening book (round r: seed + r), without end;
    yields each round's records. The caller stops, and bounds how many rounds may bring nothing new."""
    round_ = 0
    while True:
        starts = opening_fens(ROUND_GAMES, seed + round_)
        games = [Game(start_fen=f) for f in starts]
        play_games(games, [ModelPlayer(lm, decoding, seed=seed + 7_919 * round_, fallback=True)], lambda g: 0,
                   max_plies=max_plies)
        yield [r for i, g in enumerate(games)
               for r in game_records(g, f"model-game:{seed}:{round_}:{i}", failures_only)]
        round_ += 1
