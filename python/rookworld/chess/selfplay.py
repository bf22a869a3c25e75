"""Engine self-play: games Stockfish plays against itself, each move drawn among its MultiPV candidates with a
temperature, so that every position has the history of a game a strong player could have played, and the analysis
that chose its move labels its P: sample.

A game's moves are drawn with its own generator (seeded by the run's seed and the game's index), so which games
are played does not depend on how the pool's engines share the work. Stockfish's hash table carries between the
positions an engine analyses, so a low-depth analysis, and with it a game, can differ between runs at the margin.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from rookworld.chess import rules
from rookworld.chess.data import Record, position_key
from rookworld.chess.stockfish.analysis import Analysis, Candidate


@dataclass(frozen=True)
class SelfPlay:
    """How the games are played. Temperatures are in pawns: a candidate `t` pawns worse than the best is drawn
    e^-1 as often. The opening's higher temperature spreads the games over many openings."""

    temperature: float = 0.3
    opening_temperature: float = 1.0
    opening_plies: int = 12
    max_plies: int = 200

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.opening_temperature < 0:
            raise ValueError("self-play temperatures must be >= 0 (0: always Stockfish's best move)")
        if self.opening_plies < 0 or self.max_plies < 1:
            raise ValueError("self-play needs opening_plies >= 0 and max_plies >= 1")


@dataclass
class Game:
    """One self-play game: each position a move was played in, with its full history from the start and the move,
    and the analysis that chose the move. The position the game ended in is not among them."""

    index: int
    rng: random.Random
    fen: str = rules.START_FEN
    moves: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    analyses: list[Analysis] = field(default_factory=list)
    reason: str | None = None
    _seen: Counter = field(default_factory=Counter)

    @property
    def ended(self) -> bool:
        return self.reason is not None


def draw(candidates: Sequence[Candidate], temperature: float, rng: random.Random) -> str:
    """A candidate move, drawn with weights exp((eval - best eval) / temperature); the best at temperature 0."""
    if temperature == 0 or len(candidates) == 1:
        return candidates[0].move
    best = max(c.pawns for c in candidates)
    weights = [math.exp((c.pawns - best) / temperature) for c in candidates]
    return rng.choices([c.move for c in candidates], weights)[0]


def play(pool, games: int | None, seed: int, how: SelfPlay = SelfPlay(), *, in_flight: int = 64) -> Iterator[Game]:
    """Plays `games` games (without end when None) with `pool` (a StockfishPool, whose depth and MultiPV are the
    analyses'), `in_flight` at a time so that every engine stays busy; yields each game when it ends."""
    next_index = 0
    live: list[Game] = []
    while live or games is None or next_index < games:
        while len(live) < in_flight and (games is None or next_index < games):
            g = Game(next_index, random.Random(f"selfplay:{seed}:{next_index}"))
            g._seen[position_key(g.fen)] += 1
            live.append(g)
            next_index += 1
        analyses = [f.result() for f in pool.submit([g.fen for g in live])]
        playing = []
        for g, analysis in zip(live, analyses):
            if not analysis.candidates:  # only a start position can be finished: a move into one ends the game
                g.reason = "no legal move"
                continue
            hot = len(g.moves) < how.opening_plies
            move = draw(analysis.candidates, how.opening_temperature if hot else how.temperature, g.rng)
            g.records.append(Record(fen=g.fen, history=tuple(g.moves), move=move,
                                    source=f"selfplay:{seed}:{g.index}:{len(g.moves)}"))
            g.analyses.append(analysis)
            playing.append((g, move))
        steps = rules.env_steps([g.fen for g, _ in playing], [m for _, m in playing])
        for (g, move), step in zip(playing, steps):
            g.moves.append(move)
            g.fen = step.fen
            g._seen[position_key(step.fen)] += 1
            if step.terminated:
                g.reason = "checkmate" if step.reward == 1.0 else "draw"
            elif g._seen[position_key(step.fen)] >= 3:
                g.reason = "threefold repetition"
            elif len(g.moves) >= how.max_plies:
                g.reason = "ply limit"
        done = [g for g in live if g.ended]
        live = [g for g in live if not g.ended]
        yield from sorted(done, key=lambda g: g.index)
