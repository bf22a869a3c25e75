"""Position files: what `rookworld positions` writes and what training and evaluation read.

One position a line of UTF-8 text (a byte-order mark is read past), in any of three forms (blank lines and lines
starting with ``#`` are skipped):

- JSON: ``{"fen": ..., "history": [...], "move": ..., "phase": ..., "analysis": {...}}``; only ``fen``
  is required. ``rookworld positions --annotate`` adds ``analysis`` and the P:/A: prompts and targets.
- FEN: ``rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1``
- EPD: four FEN fields then operations, ``... w KQkq - bm e4; id "x";`` (``hmvc``/``fmvn`` are used).

A bad line is a ``DataError`` naming the file and line, or, with ``skip_bad=True``, skipped and counted. A line
longer than `rookworld.io.files.MAX_LINE` bytes, and a PGN file (`PgnGiven`), are a ``DataError`` either way.
"""

from __future__ import annotations

import codecs
import json
import math
import numbers
import os
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rookworld.chess import rules
from rookworld.io.errors import RookworldError
from rookworld.io.files import MAX_LINE, LineTooLong, atomic_write, read_bounded
from rookworld.io.json_line import json_value
from rookworld.io.quote import ECHO_LIMIT, quoted, shortened
from rookworld.chess.rewards import GroundTruth, policy_prompt, policy_targets

__all__ = ["DataError", "PgnGiven", "Record", "assign_moves", "playable", "read_records", "write_records"]


#: The byte-order mark, as a decoded character.
BOM = "\ufeff"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
#: A PGN tag pair, `[Event "Paris"]`: what a file of games starts with.
_PGN_TAG = re.compile(r'^\[[A-Za-z0-9_]+\s+".*"\]$')


class DataError(RookworldError, ValueError):
    """A position file that cannot be read, with the file and line."""


class PgnGiven(DataError):
    """A file of games (PGN) given where positions are read: no line of it is a position."""


@dataclass(frozen=True)
class Record:
    fen: str
    #: Moves before ``fen``, oldest first (may be empty).
    history: tuple[str, ...] = ()
    #: The A: task's move; ``None`` until ``assign_moves`` picks one.
    move: str | None = None
    phase: str | None = None
    #: Stockfish's analysis: ``{"moves": [...], "evals": [...], "depth": int}``, best first.
    analysis: dict | None = None
    #: ``file:line`` the record came from, for messages.
    source: str = field(default="", compare=False)

    @classmethod
    def from_position(cls, p: rules.Position) -> "Record":
        """A generated position (`rookworld.chess.rules.generate_positions`) as a record."""
        return cls(fen=p.fen, history=p.history, move=p.move, phase=p.phase)

    @property
    def truth(self) -> GroundTruth | None:
        """The ground truth the reward scorer takes from ``analysis``: (moves best first, evals in pawns), or None."""
        if self.analysis is None:
            return None
        return list(self.analysis["moves"]), [float(e) for e in self.analysis["evals"]]

    @property
    def policy_prompt(self) -> str:
        return policy_prompt(self.fen)

    @property
    def env_prompt(self) -> str:
        if self.move is None:
            raise ValueError(f"no A: move for {quoted(self.fen)} ({self.source}); call assign_moves first")
        return rules.env_prompt(self.fen, self.move, self.history)

    def to_dict(self) -> dict:
        d: dict = {"fen": self.fen, "history": list(self.history)}
        if self.move is not None:
            d["move"] = self.move
        if self.phase is not None:
            d["phase"] = self.phase
        if self.analysis is not None:
            d["analysis"] = self.analysis
        return d


#: The longest A: move a record may give: a UCI move has 4 or 5 characters, and the task asks about malformed ones too.
MAX_MOVE_CHARS = 16


def _kind(value) -> str:
    """What a JSON value is, for a message: short whatever the file holds (a value may be nested or huge)."""
    if isinstance(value, str):
        return repr(shortened(value, 40))
    if isinstance(value, (bool, int, float)) or value is None:
        return shortened(json.dumps(value), 40)
    return "a list" if isinstance(value, list) else "an object"


def _from_json(text: str) -> dict:
    obj = json_value(text)
    if not isinstance(obj, dict) or not isinstance(obj.get("fen"), str):
        raise ValueError('a JSON line must be an object with a "fen" string')
    history = obj.get("history", [])
    if isinstance(history, str):
        history = history.split()
    if not isinstance(history, list) or not all(isinstance(m, str) for m in history):
        raise ValueError('"history" must be a list of UCI moves')
    move = obj.get("move")
    if move is not None and not isinstance(move, str):
        raise ValueError('"move" must be a string')
    if move is not None and len(move) > MAX_MOVE_CHARS:  # else it fills the model's context, said with no line
        raise ValueError(f'"move" is {len(move):,} characters: a UCI move has 4 or 5 (a malformed one, which an A: '
                         f'prompt may ask about, at most {MAX_MOVE_CHARS})')
    phase = obj.get("phase")
    if phase is not None and not isinstance(phase, str):
        raise ValueError(f'"phase" must be a string, got {_kind(phase)}')
    analysis = obj.get("analysis")
    if analysis is not None:
        ok = (isinstance(analysis, dict) and isinstance(analysis.get("moves"), list)
              and isinstance(analysis.get("evals"), list)
              and all(isinstance(m, str) for m in analysis["moves"])
              and all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in analysis["evals"]))
        if not ok:
            raise ValueError('"analysis" must hold a "moves" list of UCI strings and an "evals" list of numbers')
        depth = analysis.get("depth", 0)
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise ValueError(f'"analysis" "depth" must be a whole number >= 0, got {_kind(depth)}')
        # Only what is checked goes on: a record is written out again (positions --from), any other key unread.
        analysis = {"depth": depth, "moves": analysis["moves"], "evals": analysis["evals"]}
    return {"fen": obj["fen"], "history": tuple(history), "move": move, "phase": phase, "analysis": analysis}


def _pawns(value: int | float) -> float:
    """An eval as a float; a JSON integer too large for one is infinite, which the check then refuses."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def analysis_problems(fens: Sequence[str], moves: Sequence, evals: Sequence) -> list[str | None]:
    """What is wrong with each analysis from outside this run (a positions file's line, a dataset's row), or None:
    its moves a list of UCI strings and its evals a list of numbers, then `rules.analysis_problems`: legal and
    distinct moves, best first, one finite eval in pawns a move. `--data` and the reward functions both ask it."""
    problems = [_analysis_shape(m, e) for m, e in zip(moves, evals)]
    typed = [i for i, problem in enumerate(problems) if problem is None]
    verdicts = rules.analysis_problems([fens[i] for i in typed], [list(moves[i]) for i in typed],
                                       [[_pawns(e) for e in evals[i]] for i in typed])
    for i, verdict in zip(typed, verdicts):
        problems[i] = verdict
    return problems


def _analysis_shape(moves, evals) -> str | None:
    for what, values in (("moves", moves), ("evals", evals)):
        if not isinstance(values, (list, tuple)):
            return f"{what} must be a list, got {_any_kind(values)}"
    for k, move in enumerate(moves, 1):
        if not isinstance(move, str):
            return f"move {k} is {_any_kind(move)}, not a UCI string"
    for k, e in enumerate(evals, 1):
        if not isinstance(e, numbers.Real) or isinstance(e, bool):
            return f"eval {k} is {_any_kind(e)}, not a number of pawns"
    return None


def _any_kind(value) -> str:
    """`_kind` of a JSON value; the type of any other (a dataset's column may hold one)."""
    json_types = (str, bool, int, float, list, dict, type(None))
    return _kind(value) if isinstance(value, json_types) else f"a {type(value).__name__}"


def _is_int(text: str) -> bool:
    return text.isdigit()


def _from_fen_or_epd(text: str) -> dict:
    fields = text.split()
    if len(fields) == 6 and _is_int(fields[4]) and _is_int(fields[5]):
        return {"fen": " ".join(fields)}
    if len(fields) < 4:
        raise ValueError("expected a FEN (6 fields), an EPD (4 fields and operations) or a JSON object")
    if len(fields) >= 6 and _is_int(fields[4]):
        raise ValueError("a FEN has 6 fields; found text after it")
    halfmoves, fullmoves = "0", "1"
    for op in " ".join(fields[4:]).split(";"):
        parts = op.split()
        if len(parts) == 2 and parts[0] == "hmvc" and _is_int(parts[1]):
            halfmoves = parts[1]
        elif len(parts) == 2 and parts[0] == "fmvn" and _is_int(parts[1]):
            fullmoves = parts[1]
    return {"fen": " ".join(fields[:4] + [halfmoves, fullmoves])}


def read_lines(path: str | os.PathLike) -> list[str]:
    """A data file's lines, for every reader of position and sample files: UTF-8 with or without a byte-order mark
    (Windows editors write one at the start, and `cat` of such files leaves one at the start of a line). Lines end
    where an editor ends them (not at the other breaks `str.splitlines` knows), so that line numbers are an editor's.
    A file that cannot be read is a DataError naming it."""
    path = Path(path)
    try:
        raw = read_bounded(path, MAX_LINE)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except LineTooLong as e:
        raise DataError(f"{path}: {e}") from None
    except OSError as e:
        raise DataError(f"{path}: {e.strerror or e}") from None
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise DataError(f"{path}: not UTF-8 text (UTF-16, by its byte-order mark): save it as UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return [line.removeprefix(BOM) for line in _LINE_BREAK.split(text)]


def read_records(path: str | os.PathLike, *, skip_bad: bool = False) -> tuple[list[Record], int]:
    """Reads a position file; returns the records and how many bad lines were skipped."""
    path = Path(path)
    lines = read_lines(path)
    parsed: list[tuple[int, dict]] = []
    skipped = 0

    def bad(lineno: int, why: str) -> None:
        nonlocal skipped
        if not skip_bad:
            line = lines[lineno - 1].strip()
            raise DataError(f"{path}:{lineno}: {shortened(why, 300)}: {shortened(line, ECHO_LIMIT)}")  # as written
        skipped += 1

    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if _PGN_TAG.match(text):  # every line of a file of games would be bad, skipped or not: said at once
            raise PgnGiven(f"{path}:{lineno}: {shortened(text, 80)} is a PGN tag: this file holds games, not "
                           "positions")
        try:
            parsed.append((lineno, _from_json(text) if text.startswith("{") else _from_fen_or_epd(text)))
        except ValueError as e:
            bad(lineno, str(e))

    # The whole file's FENs, histories and analyses in batches through the Rust core.
    normalized = rules.normalize_fens([d["fen"] for _, d in parsed])
    fens = [fen or d["fen"] for (_, d), fen in zip(parsed, normalized)]
    history_problems = rules.history_problems(fens, [d.get("history", ()) for _, d in parsed])
    with_analysis = [i for i, (_, d) in enumerate(parsed) if d.get("analysis") is not None]
    bad_analyses = dict(zip(with_analysis, analysis_problems(
        [fens[i] for i in with_analysis], [parsed[i][1]["analysis"]["moves"] for i in with_analysis],
        [parsed[i][1]["analysis"]["evals"] for i in with_analysis])))
    records = []
    for i, ((lineno, d), fen) in enumerate(zip(parsed, normalized)):
        if fen is None:
            bad(lineno, f"not a legal position ({rules.fen_problem(d['fen'])})")
            continue
        if history_problems[i] is not None:
            bad(lineno, f"bad history: {history_problems[i]}")
            continue
        if bad_analyses.get(i) is not None:
            bad(lineno, f"bad analysis: {bad_analyses[i]}")
            continue
        records.append(Record(fen=fen, history=d.get("history", ()), move=d.get("move"), phase=d.get("phase"),
                              analysis=d.get("analysis"), source=f"{path}:{lineno}"))
    if not records and not skipped:
        raise DataError(f"{path}: no positions in the file")
    return records, skipped


def position_key(fen: str) -> str:
    """What makes two FENs one position: board, side to move, castling and en passant (not the clocks)."""
    return " ".join(fen.split()[:4])


def playable(records: Sequence[Record]) -> tuple[list[Record], list[Record]]:
    """(positions with a legal move, finished ones: checkmate or stalemate, which no task can be asked about)."""
    moves = rules.legal_moves_batch([r.fen for r in records])
    return [r for r, m in zip(records, moves) if m], [r for r, m in zip(records, moves) if not m]


def finished_message(finished: Sequence[Record], total: int) -> str:
    where = ", ".join(r.source for r in finished[:3]) + (", ..." if len(finished) > 3 else "")
    return (f"left out {len(finished)} of {total} positions that are finished games (checkmate or stalemate, no "
            f"legal move): {where}")


def assign_moves(records: Sequence[Record], seed: int) -> list[Record]:
    """Gives every record without an A: move a random legal one (records without legal moves keep none)."""
    rng = random.Random(seed)
    need = [i for i, r in enumerate(records) if r.move is None]
    moves = rules.legal_moves_batch([records[i].fen for i in need])
    out = list(records)
    for i, legal in zip(need, moves):
        if legal:
            out[i] = replace(records[i], move=rng.choice(sorted(legal)))
    return out


def cut_histories(records: Sequence[Record], seed: int, lengths: str) -> list[Record]:
    """The records with the history their A: prompts show. ``lengths="full"``: each history as it is (a prompt shows
    its last nine moves and the move); ``"every"``: the last k moves, k drawn per position from 0 (the move alone,
    as a position set up from a FEN gives it) to nine, so that the next state has to be read from the board."""
    if lengths not in ("full", "every"):
        raise ValueError(f'history lengths must be "full" or "every", got {lengths!r}')
    if lengths == "full":
        return list(records)
    out = []
    for r in records:
        keep = random.Random(f"{seed}:history:{r.fen}").randint(0, rules.HISTORY_LEN - 1)
        out.append(replace(r, history=r.history[-keep:] if keep else ()))
    return out


def write_records(lines: Iterable[dict], path: str | os.PathLike) -> int:
    """Writes JSON lines atomically (a temporary file renamed into place); returns the count."""
    n = 0
    with atomic_write(path) as f:
        for obj in lines:
            f.write(json.dumps(obj) + "\n")
            n += 1
    return n


def annotated(records: Sequence[Record], analyses: Sequence, seed: int = 0, layout: str = "rookworld") -> list[dict]:
    """JSON lines with each record's Stockfish analysis and its P: and A: prompts and targets.

    The P: target lists Stockfish's moves in a shuffled order (as the training data does), each
    with its eval, and Stockfish's best move as B:, in `layout` (`policy_targets`).
    """
    orders = []
    for r, a in zip(records, analyses):
        order = list(range(len(a.candidates)))
        random.Random(f"{seed}:{r.fen}").shuffle(order)
        orders.append(order)
    targets = policy_targets(
        [r.fen for r in records],
        [[a.candidates[i].move for i in o] for a, o in zip(analyses, orders)],
        [[a.candidates[i].pawns for i in o] for a, o in zip(analyses, orders)],
        [a.best_move or "" for a in analyses],
        layout,
    )
    with_move = [r for r in records if r.move is not None]
    env_targets = iter(rules.env_targets([r.env_prompt for r in with_move]))
    lines = []
    for r, a, target in zip(records, analyses, targets):
        d = r.to_dict()
        d["analysis"] = {"depth": a.depth, "moves": [c.move for c in a.candidates],
                         "evals": [c.pawns for c in a.candidates]}
        d["p_prompt"] = r.policy_prompt
        d["p_target"] = target
        if r.move is not None:
            d["a_prompt"] = r.env_prompt
            d["a_target"] = next(env_targets)
        lines.append(d)
    return lines


def write_json(obj, path: str | os.PathLike) -> None:
    """Writes one JSON document atomically."""
    with atomic_write(path) as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
