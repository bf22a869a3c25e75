"""What Stockfish says about a position: ranked candidate moves with their evals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Centipawn value of a mate, as python-chess ``score(mate_score=100000)`` and the RookWorld data use it.
MATE_SCORE = 100_000


@dataclass(frozen=True, slots=True)
class Candidate:
    """One MultiPV line: a move and its eval from the side to move's view (exactly one of cp/mate set)."""

    move: str
    cp: int | None
    #: Moves to mate: ``n > 0`` the side to move mates in n, ``n <= 0`` it is mated in ``-n``.
    mate: int | None

    @property
    def pawns(self) -> float:
        """The eval in pawns; mates as python-chess ``score(mate_score=100000) / 100`` (mate in 3: 999.97)."""
        if self.mate is not None:
            centipawns = MATE_SCORE - self.mate if self.mate > 0 else -MATE_SCORE - self.mate
            return centipawns / 100
        if self.cp is None:
            raise ValueError(f"candidate {self.move} has no eval")
        return self.cp / 100

    @property
    def eval_text(self) -> str:
        """The eval as the RookWorld data prints it: a Python float, ``-2.3``, ``0.0``, ``999.97``."""
        return repr(round(self.pawns, 2))

    def to_dict(self) -> dict[str, Any]:
        return {"move": self.move, "cp": self.cp, "mate": self.mate}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        cp, mate = data.get("cp"), data.get("mate")
        return cls(str(data["move"]), None if cp is None else int(cp), None if mate is None else int(mate))


@dataclass(frozen=True, slots=True)
class Analysis:
    """Stockfish's view of one position: ``candidates`` ranked best first (MultiPV 1..k)."""

    #: The position in normalized (python-chess ``board.fen()``) form.
    fen: str
    candidates: tuple[Candidate, ...]
    #: Search depth the best line reached (0 when the position has no legal moves).
    depth: int

    @property
    def best_move(self) -> str | None:
        """Stockfish's best move, or ``None`` when there are no legal moves."""
        return self.candidates[0].move if self.candidates else None

    @property
    def moves(self) -> tuple[str, ...]:
        return tuple(c.move for c in self.candidates)

    @property
    def evals(self) -> tuple[float, ...]:
        """Each candidate's eval in pawns, side to move's view."""
        return tuple(c.pawns for c in self.candidates)

    def candidate(self, move: str) -> Candidate | None:
        """The candidate for ``move``, or ``None`` if Stockfish did not rank it."""
        for c in self.candidates:
            if c.move == move:
                return c
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"fen": self.fen, "depth": self.depth, "candidates": [c.to_dict() for c in self.candidates]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Analysis:
        return cls(
            str(data["fen"]),
            tuple(Candidate.from_dict(c) for c in data["candidates"]),
            int(data["depth"]),
        )
