"""The rules of chess as the RookWorld data uses them, computed in batches by the Rust core.

FENs come back in python-chess ``board.fen()`` form. Batch functions take any sequence of
``str`` and run in parallel outside the GIL; prefer them to loops over the single-item helpers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rookworld import _core
from rookworld.io.quote import quoted

__all__ = [
    "HISTORY_LEN",
    "MAX_EVAL",
    "START_FEN",
    "EnvStep",
    "MateInOne",
    "Position",
    "env_prompt",
    "env_prompts",
    "env_steps",
    "env_targets",
    "analysis_problems",
    "generate_positions",
    "history_problem",
    "history_problems",
    "is_legal",
    "legal_moves",
    "legal_moves_batch",
    "mate_in_one_positions",
    "mating_moves",
    "mating_moves_batch",
    "normalize_fen",
    "normalize_fens",
    "parse_move",
    "perft",
    "san",
]

#: Moves kept in an A: prompt's history field, the move itself included.
HISTORY_LEN: int = _core.HISTORY_LEN
START_FEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
#: The largest eval in pawns an analysis may hold: a mate in 1 (999.99), as the P: text prints it.
MAX_EVAL: float = _core.MAX_EVAL


def _list(items: Iterable[str]) -> list[str]:
    if isinstance(items, str):  # a lone string would be read as a batch of characters
        raise TypeError("expected a list of strings, got a single str")
    return items if isinstance(items, list) else list(items)


def perft(fen: str, depth: int) -> int:
    """Leaf nodes of the legal move tree to ``depth``; ``ValueError`` for a bad FEN."""
    if not 0 <= depth <= 64:
        raise ValueError(f"perft depth must lie in [0, 64], got {depth}")
    return _core.perft(fen, depth)


def normalize_fens(fens: Iterable[str]) -> list[str | None]:
    """Each FEN in ``board.fen()`` form, or ``None`` where it is not a legal position."""
    return [text if ok else None for ok, text in _core.normalize_fens(_list(fens))]


def normalize_fen(fen: str) -> str:
    """``fen`` in ``board.fen()`` form; ``ValueError`` saying what is wrong otherwise."""
    ((ok, text),) = _core.normalize_fens([fen])
    if not ok:
        raise ValueError(f"{text}: {quoted(fen)}")
    return text


def fen_problem(fen: str) -> str | None:
    """What is wrong with ``fen`` (missing king, pawn on the back rank, ...), or ``None`` for a legal position."""
    ((ok, text),) = _core.normalize_fens([fen])
    return None if ok else text


def history_problems(fens: Iterable[str], histories: Iterable[Sequence[str]]) -> list[str | None]:
    """What is wrong with each position's history (UCI moves before it, oldest first), or ``None``.

    Without the game's start only this can be checked: every entry is a UCI move some piece could
    make, and the last one was played by the side not to move (the square it left is empty, its
    destination holds the mover's piece, the promoted one for a promotion, and that piece has a way
    there: its kind of move, with the squares between empty). A bad FEN is its own problem.
    """
    return _core.history_problems(_list(fens), [_list(h) for h in histories])


def history_problem(fen: str, history: Sequence[str]) -> str | None:
    """`history_problems` for one position."""
    return history_problems([fen], [history])[0]


def analysis_problems(fens: Iterable[str], moves: Iterable[Sequence[str]], evals: Iterable[Sequence[float]],
                      max_moves: int | None = None) -> list[str | None]:
    """What is wrong with each analysis that came from outside this run (a data file, a cache), or ``None``.

    Its moves (best first) must be legal UCI in the position and distinct, one eval a move, evals finite
    pawns within ``MAX_EVAL``; at least one move where the position has one, at most ``max_moves``.
    """
    evals = [[float(e) for e in row] for row in evals]
    return _core.analysis_problems(_list(fens), [_list(m) for m in moves], evals, max_moves)


def legal_moves_batch(fens: Iterable[str]) -> list[list[str]]:
    """Legal moves (UCI) of each position; ``ValueError`` naming the first bad FEN."""
    fens = _list(fens)
    out = []
    for fen, (ok, moves, error) in zip(fens, _core.legal_moves(fens)):
        if not ok:
            raise ValueError(f"{error}: {quoted(fen)}")
        out.append(moves)
    return out


def legal_moves(fen: str) -> list[str]:
    """Legal moves of one position in UCI (castling as ``e1g1``)."""
    return legal_moves_batch([fen])[0]


def mating_moves_batch(fens: Iterable[str]) -> list[list[str]]:
    """The moves (UCI) that checkmate at once in each position; ``ValueError`` naming the first bad FEN."""
    fens = _list(fens)
    out = []
    for fen, (ok, moves, error) in zip(fens, _core.mating_moves(fens)):
        if not ok:
            raise ValueError(f"{error}: {quoted(fen)}")
        out.append(moves)
    return out


def mating_moves(fen: str) -> list[str]:
    """The moves of one position (UCI) that checkmate at once, in legal-move order."""
    return mating_moves_batch([fen])[0]


def parse_move(fen: str, text: str) -> str:
    """The UCI of the legal move that ``text`` names, in UCI or SAN, as a person types it.

    SAN may carry ``+`` or ``#`` (right or not), castle as ``O-O`` or ``0-0``, promote as ``e8=Q``
    or ``e8Q``, and may get ``x`` wrong. ``ValueError`` says why otherwise: "not a move in UCI or
    SAN", "illegal move in this position", or "ambiguous move (Nbd2, Nfd2)", then the text; a bad
    FEN raises the error of ``normalize_fen``.
    """
    ((ok, result),) = _core.parse_moves([fen], [text])
    if not ok:
        normalize_fen(fen)  # a bad FEN raises its own error, naming the FEN
        raise ValueError(f"{result}: {quoted(text)}")
    return result


def san(fen: str, uci: str) -> str:
    """A legal UCI move in SAN, as python-chess's ``board.san()`` writes it (``Nf3``, ``exd5``, ``O-O``,
    ``e8=Q+``, ``Qxf7#``); ``ValueError`` for an illegal or malformed move or a bad FEN."""
    ((ok, result),) = _core.san_moves([fen], [uci])
    if not ok:
        normalize_fen(fen)
        raise ValueError(f"{result}: {quoted(uci)}")
    return result


def is_legal(fens: Sequence[str], moves: Sequence[str]) -> list[bool]:
    """Whether each UCI move is legal in its position (False for a bad FEN or malformed move)."""
    return _core.is_legal(_list(fens), _list(moves))


@dataclass(frozen=True, slots=True)
class EnvStep:
    """One A: transition. ``reward`` is 0.001 (legal), 1.0 (mate), 0.5 (draw) or -1.0 (illegal)."""

    fen: str
    reward: float
    terminated: bool
    truncated: bool

    @property
    def target(self) -> str:
        """The A: target text: ``{fen}+{reward}+{terminated}+{truncated}``."""
        return f"{self.fen}+{self.reward!r}+{int(self.terminated)}+{int(self.truncated)}"


def env_steps(fens: Sequence[str], moves: Sequence[str]) -> list[EnvStep]:
    """Plays each move in its position; ``ValueError`` naming the first bad FEN."""
    fens = _list(fens)
    out = []
    for fen, (ok, text, reward, terminated, truncated) in zip(fens, _core.env_steps(fens, _list(moves))):
        if not ok:
            raise ValueError(f"{text}: {quoted(fen)}")
        out.append(EnvStep(text, reward, terminated, truncated))
    return out


def env_prompt(fen: str, move: str, history: Sequence[str] = ()) -> str:
    """The A: prompt for playing ``move`` in ``fen`` after ``history`` (oldest first, without ``move``)."""
    return _core.env_prompts([fen], [move], [_list(history)])[0]


def env_prompts(fens: Sequence[str], moves: Sequence[str], histories: Sequence[Sequence[str]]) -> list[str]:
    return _core.env_prompts(_list(fens), _list(moves), [_list(h) for h in histories])


def env_targets(prompts: Iterable[str]) -> list[str]:
    """A: prompt text -> exact target text ``new_fen+reward+terminated+truncated``.

    An illegal or malformed move is a valid prompt (its target says -1.0, 0, 1); a prompt that
    cannot be parsed raises ``ValueError`` naming it.
    """
    prompts = _list(prompts)
    targets, errors = _core.env_targets(prompts)
    if errors:
        i, message = errors[0]
        raise ValueError(f"{message}: {quoted(prompts[i])}")
    return targets


@dataclass(frozen=True, slots=True)
class Position:
    """A generated training position."""

    fen: str
    #: Every move from the start position to ``fen``, oldest first.
    history: tuple[str, ...]
    #: The move of the A: task: usually legal, sometimes a well-formed illegal one.
    move: str
    #: ``opening``, ``middlegame`` or ``endgame``.
    phase: str = field(default="middlegame")

    @property
    def env_prompt(self) -> str:
        return env_prompt(self.fen, self.move, self.history)

    def to_dict(self) -> dict:
        return {"fen": self.fen, "history": list(self.history), "move": self.move, "phase": self.phase}


def generate_positions(
    n: int,
    seed: int,
    *,
    start: int = 0,
    opening_share: float = 0.2,
    endgame_share: float = 0.2,
    illegal_share: float = 0.01,
) -> list[Position]:
    """``n`` legal, unfinished positions; position ``i`` depends only on ``(seed, start + i)``.

    About ``opening_share`` come from well-known opening lines, ``endgame_share`` have fewer
    than 14 pieces, the rest are 8-20 plies of development-minded random play. A share
    ``illegal_share`` of the A: moves are well-formed but illegal.
    """
    if n < 0 or not 0 <= seed < 2**64 or not 0 <= start < 2**64:
        raise ValueError(f"n must be >= 0 and seed, start in [0, 2**64), got {n}, {seed}, {start}")
    raw = _core.generate_positions(n, seed, start, opening_share, endgame_share, illegal_share)
    return [Position(fen, tuple(history), move, phase) for fen, history, move, phase in raw]


@dataclass(frozen=True, slots=True)
class MateInOne:
    """A position whose side to move can checkmate at once."""

    fen: str
    #: Every move from the start position to ``fen``, oldest first.
    history: tuple[str, ...]
    #: Every move (UCI) that mates, sorted.
    mates: tuple[str, ...]


def mate_in_one_positions(n: int, seed: int, *, start: int = 0) -> list[MateInOne]:
    """``n`` unfinished positions with at least one mate in one; position ``i`` depends only on ``(seed, start + i)``.

    They come from semi-random games that differ in their taste for checks and captures: openings,
    middlegames and endgames, either side to move, one mating move or several.
    """
    if n < 0 or not 0 <= seed < 2**64 or not 0 <= start < 2**64:
        raise ValueError(f"n must be >= 0 and seed, start in [0, 2**64), got {n}, {seed}, {start}")
    raw = _core.mate_in_one_positions(n, seed, start)
    return [MateInOne(fen, tuple(history), tuple(mates)) for fen, history, mates in raw]
