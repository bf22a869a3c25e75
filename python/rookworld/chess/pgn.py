"""Real games from PGN files, read by the Rust core: their mainlines, and training positions sampled from them;
and a game written as PGN (`game_pgn`), for the games rookworld plays.

Files may be plain, gzip or zstd (Lichess's ``.pgn.zst`` dumps); they are read as a stream, so a
multi-gigabyte dump never sits in memory (the positions kept do). A game's every mainline move must
be legal SAN: a bad game (an illegal or unreadable move, a bad FEN header, a variant other than
standard chess) raises ``ValueError`` naming file, first line, game and move, e.g.
``games.pgn:123: game 7: move 14 "Nf9" (line 130) is no move in SAN (position ...)``, unless
``skip_bad`` counts it instead. Comments, variations, NAGs and move numbers are read past.

Bounded by the reader's limits, not the file's: a line longer than 4 MiB (``/dev/zero``, a binary file) stops the
reading with a ``ValueError`` naming file and line, and a game longer than any game of chess can be (over 18,000
plies: the 75-move and fivefold-repetition rules end every game within 17,697) is a bad game.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from rookworld import _core
from rookworld.chess import rules

__all__ = ["PgnGame", "PgnPosition", "PgnSample", "game_pgn", "read_games", "pgn_positions"]

PathLike = str | os.PathLike

#: The moves of a position's history `pgn_positions` keeps by default: those an A: prompt shows before its move.
#: All of them (``history_len=None``) make memory grow with the square of a game's length.
HISTORY_WINDOW = _core.HISTORY_LEN - 1


@dataclass(frozen=True, slots=True)
class PgnGame:
    """One game whose mainline moves are all legal."""

    #: 0-based among all games read (bad ones too), counting on across files.
    index: int
    #: ``file:line`` of the game's first tag or move.
    source: str
    #: The headers that choose games, as present: Event, Site, WhiteElo, BlackElo, TimeControl, Result, FEN.
    headers: dict[str, str]
    #: The start position in ``board.fen()`` form (the FEN header's, or the standard one).
    start_fen: str
    #: The mainline in UCI (castling ``e1g1``, promotions in lower case).
    moves: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PgnPosition:
    """A position of a real game, with the moves that led to it and the move the game played next."""

    fen: str
    #: The moves that led to ``fen``, oldest first: the last ``history_len`` of them (`HISTORY_WINDOW` unless
    #: asked), or every one from the game's start (its FEN header's position, if it has one).
    history: tuple[str, ...]
    #: The move the game played here; ``None`` after its last move.
    move: str | None
    #: ``opening`` (before ply 16 from the standard start), ``endgame`` (fewer than 14 pieces) or ``middlegame``.
    phase: str
    #: The game's index, and the plies played from its start to ``fen``.
    game: int
    ply: int
    #: ``file:line`` of the game's first line.
    source: str = field(compare=False)

    def to_dict(self) -> dict:
        """As `rookworld.chess.rules.Position.to_dict` writes a position (``move`` may be ``None`` here)."""
        return {"fen": self.fen, "history": list(self.history), "move": self.move, "phase": self.phase}


@dataclass(frozen=True, slots=True)
class PgnSample:
    positions: list[PgnPosition]
    #: Positions of the held-out games none of whose positions occurs in a training game.
    held_out: list[PgnPosition]
    #: Games read, bad and filtered ones included.
    games: int
    #: Bad games skipped (``skip_bad``), and the first few errors.
    bad_games: int
    bad_reasons: list[str]
    #: Games left out by the rating and time-control filters.
    filtered_games: int
    #: Positions dropped as already kept (held-out ones that occur in a training game too).
    duplicates: int
    held_out_games: int


def _sources(paths: PathLike | Iterable[PathLike] | None, text: str | None) -> list[str]:
    if (paths is None) == (text is None):
        raise ValueError("give either paths or text")
    if paths is None:
        return []
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return [os.fspath(p) for p in paths]


def read_games(paths: PathLike | Iterable[PathLike] | None = None, *, text: str | None = None,
               name: str = "<text>", skip_bad: bool = False,
               max_games: int | None = None) -> tuple[list[PgnGame], int, list[str]]:
    """The games of PGN files (or of ``text``, called ``name`` in messages), at most ``max_games`` read.

    Returns ``(games, bad games skipped, the first few errors)``; with ``skip_bad`` false the first bad game raises.
    """
    raw, bad, reasons = _core.pgn_games(_sources(paths, text), text, name, skip_bad, max_games)
    games = [PgnGame(index, f"{source}:{line}", dict(headers), start, tuple(moves))
             for index, source, line, headers, start, moves in raw]
    return games, bad, reasons


def pgn_positions(paths: PathLike | Iterable[PathLike] | None = None, *, text: str | None = None,
                  name: str = "<text>", min_ply: int = 0, per_game: int | None = None, seed: int = 0,
                  min_elo: int | None = None, max_elo: int | None = None,
                  min_base_seconds: int | None = None, dedup: bool = True, held_out: float = 0.0,
                  skip_bad: bool = False, max_games: int | None = None,
                  max_positions: int | None = None, history_len: int | None = HISTORY_WINDOW) -> PgnSample:
    """Positions of real games with their real histories, read from PGN files (or ``text``).

    Each game gives its positions after ply ``min_ply`` to its end (the start position counts at 0: a
    FEN header's study position, or the standard start, kept once by de-duplication), ``per_game`` of
    them drawn by ``seed`` and the game's index, or all. Filters: both players' Elo within
    ``[min_elo, max_elo]`` and the TimeControl's base at least ``min_base_seconds`` (``300+3``:
    300); a game without the header is left out while its filter is set. ``dedup`` keeps a position the
    first time only (board, side to move, castling, en passant; not the clocks, as
    `rookworld.chess.data.position_key`). ``held_out`` is the share of games held out whole, chosen by a
    seeded hash of their moves (copies of a game fall together); a held-out position that occurs in any
    training game is dropped. Reading stops after ``max_games`` games or ``max_positions`` positions. Each
    position keeps the last ``history_len`` moves of its history, or all when it is None.
    """
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must lie in [0, 2**64), got {seed}")
    for label, value in (("min_ply", min_ply), ("per_game", per_game), ("min_elo", min_elo),
                         ("max_elo", max_elo), ("min_base_seconds", min_base_seconds),
                         ("max_games", max_games), ("max_positions", max_positions), ("history_len", history_len)):
        if value is not None and value < 0:
            raise ValueError(f"{label} must be >= 0, got {value}")
    train, held, (games, bad, reasons, filtered, duplicates, held_games) = _core.pgn_positions(
        _sources(paths, text), text, name, min_ply, per_game, seed, min_elo, max_elo, min_base_seconds,
        dedup, held_out, skip_bad, max_games, max_positions, history_len)
    return PgnSample(
        positions=[_position(t) for t in train],
        held_out=[_position(t) for t in held],
        games=games, bad_games=bad, bad_reasons=reasons, filtered_games=filtered, duplicates=duplicates,
        held_out_games=held_games,
    )


def _position(t: tuple) -> PgnPosition:
    fen, history, move, phase, game, ply, source = t
    return PgnPosition(fen, tuple(history), move, phase, game, ply, source)


def game_pgn(headers: dict[str, str], start_fen: str, moves: Iterable[str], result: str | None) -> str:
    """One game as PGN text: the seven-tag roster first (from `headers`, "?" where not given), then the other
    headers, the start position as a FEN tag when it is not the standard one, the moves (legal UCI) in SAN with
    their numbers, and the result ("1-0", "0-1", "1/2-1/2"; None for a game stopped before its end, PGN's "*").
    ValueError for an illegal move."""
    result = result or "*"
    roster = ("Event", "Site", "Date", "Round", "White", "Black")
    tags = {**{k: headers.get(k, "?") for k in roster}, "Result": result,
            **{k: v for k, v in headers.items() if k not in roster and k != "Result"}}
    if start_fen != rules.START_FEN:
        tags |= {"SetUp": "1", "FEN": start_fen}
    words, fen = [], start_fen
    for move in moves:
        number, side = int(fen.split()[5]), fen.split()[1]
        if side == "w" or not words:
            words.append(f"{number}." if side == "w" else f"{number}...")
        words.append(rules.san(fen, move))
        fen = rules.env_steps([fen], [move])[0].fen
    words.append(result)
    lines, line = [], ""
    for word in words:  # PGN's export format keeps lines under 80 characters
        if line and len(line) + 1 + len(word) > 79:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    quote = lambda v: str(v).replace("\\", "\\\\").replace('"', '\\"')  # noqa: E731
    return "".join(f'[{k} "{quote(v)}"]\n' for k, v in tags.items()) + "\n" + "\n".join(lines) + "\n"
