"""Caches of analyses keyed by (normalized FEN, depth, nodes, multipv): in memory and in an sqlite file.

Neither is a correctness concern: a miss is an engine run. The sqlite file comes from outside the run, so what
it says is checked: a row that does not check out (an illegal or repeated move, an eval out of range, another
position) is a miss, recomputed and overwritten; a file that is no sqlite database, a damaged one or another
program's is moved aside (``<name>.corrupt-<time>``) and a fresh one started, each said once on stderr.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from rookworld.chess import rules
from rookworld.chess.stockfish.analysis import MATE_SCORE, Analysis
from rookworld.chess.stockfish.engine import StockfishError

COLUMNS = ("fen", "depth", "nodes", "multipv", "result")


class StockfishCacheError(StockfishError):
    """A cache file that cannot be made or written where it was asked for."""


def cache_path_problem(path: str | os.PathLike) -> str | None:
    """Why an sqlite cache cannot be kept at ``path`` (a directory in the way, a folder that cannot be written),
    or ``None``. Checked before any work, so that a run does not analyse for an hour and then fail to save."""
    target = Path(os.path.abspath(path))
    if target.is_dir():
        return f"Stockfish cache {path} is a directory; give a file name"
    if target.exists() and not os.access(target, os.W_OK):
        return f"Stockfish cache {path} cannot be written (permissions); give another file"
    # The nearest folder that exists must be a folder we can create the rest in (and the file itself).
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"Stockfish cache {path} cannot be made: {parent} is a file, not a directory; give another path"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"Stockfish cache {path} cannot be made: cannot write in {parent} (permissions); give another path"
    return None


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


class MemoryCache:
    """The most recently used analyses, at most `max_entries`. Not locked: the pool holds its own lock."""

    def __init__(self, max_entries: int = 500_000):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, Analysis] = OrderedDict()

    def get(self, key: tuple) -> Analysis | None:
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
        return hit

    def __contains__(self, key: tuple) -> bool:
        return key in self._entries

    def put(self, key: tuple, analysis: Analysis) -> None:
        self._entries[key] = analysis
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class DiskCache:
    """sqlite file of analyses keyed by (fen, depth, nodes, multipv); safe across threads and processes.

    ``StockfishCacheError`` when the file cannot be made at ``path``; a file there that cannot be read as a cache
    is moved aside and replaced, with one warning line.
    """

    def __init__(self, path: str | os.PathLike):
        path = os.fspath(path)
        problem = cache_path_problem(path)
        if problem is not None:
            raise StockfishCacheError(problem)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError as e:
            raise StockfishCacheError(f"Stockfish cache {path} cannot be made: {e.strerror}; give another path") \
                from None
        self.path = path
        self._lock = threading.Lock()
        self._warned_rows = False
        self._db = self._open()

    # -- opening, and setting aside what is not a cache ---------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
        try:
            # Checked before anything is written: switching to WAL alone rewrites the header of another's file.
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            if tables and "analyses" not in tables:
                raise _NotACache(f"it holds other tables ({', '.join(sorted(tables)[:5])}), not analyses")
            if "analyses" in tables:
                columns = tuple(r[1] for r in db.execute("PRAGMA table_info(analyses)"))
                if columns != COLUMNS:
                    raise _NotACache(f"its analyses table has the columns {', '.join(columns)}, not "
                                     f"{', '.join(COLUMNS)}")
                # Reads every page once: a truncated or damaged file fails here, not in the middle of a run.
                status = db.execute("PRAGMA quick_check").fetchone()[0]
                if status != "ok":
                    raise _NotACache(f"it is damaged ({status})")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS analyses ("
                " fen TEXT NOT NULL, depth INTEGER NOT NULL, nodes INTEGER NOT NULL, multipv INTEGER NOT NULL,"
                " result TEXT NOT NULL, PRIMARY KEY (fen, depth, nodes, multipv)) WITHOUT ROWID"
            )
        except BaseException:
            db.close()
            raise
        return db

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except _NotACache as e:
            why = str(e)
        except sqlite3.DatabaseError as e:
            if not _damaged(e):
                raise StockfishCacheError(f"Stockfish cache {self.path} cannot be opened: {e}") from None
            why = str(e)
        self._set_aside(why)
        return self._connect()

    def _set_aside(self, why: str) -> None:
        """Moves the file (and its journal) out of the way, never deleting what might be someone's data."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside, n = f"{self.path}.corrupt-{stamp}", 1
        while os.path.exists(aside):
            n += 1
            aside = f"{self.path}.corrupt-{stamp}-{n}"
        os.replace(self.path, aside)
        for suffix in ("-wal", "-shm"):
            if os.path.exists(self.path + suffix):
                os.replace(self.path + suffix, aside + suffix)
        _warn(f"Stockfish cache {self.path} cannot be used as one ({why}): moved it to {aside} and started a "
              f"fresh cache")

    def _recover(self, error: sqlite3.DatabaseError) -> None:
        """A file damaged while in use (by another process): set it aside and start afresh; if even that fails,
        go on without a disk cache (it only saves time). Called with the lock held."""
        if not _damaged(error):
            raise error
        self._db.close()
        try:
            self._set_aside(str(error))
            self._db = self._connect()
        except (OSError, sqlite3.Error, _NotACache) as e:
            _warn(f"Stockfish cache {self.path} cannot be replaced ({e}); going on without it")
            self._db = _NoDatabase()

    # -- reading and writing -------------------------------------------------------------------------------

    @staticmethod
    def _row_key(key: tuple) -> tuple:
        fen, depth, nodes, multipv = key
        return fen, depth or 0, nodes or 0, multipv

    def get_many(self, keys: Sequence[tuple]) -> dict[tuple, Analysis]:
        """The cached analyses of ``keys`` that check out; the others are misses."""
        rows: dict[tuple, str] = {}
        if not keys:
            return {}
        with self._lock:
            try:
                for key in keys:
                    row = self._db.execute(
                        "SELECT result FROM analyses WHERE fen=? AND depth=? AND nodes=? AND multipv=?",
                        self._row_key(key),
                    ).fetchone()
                    if row is not None:
                        rows[key] = row[0]
            except sqlite3.DatabaseError as e:
                self._recover(e)
                return {}
        return self._checked(rows)

    def _checked(self, rows: dict[tuple, str]) -> dict[tuple, Analysis]:
        found: dict[tuple, Analysis] = {}
        problems: dict[tuple, str] = {}
        for key, text in rows.items():
            analysis, problem = _read_row(key, text)
            if analysis is None:
                problems[key] = problem
            else:
                found[key] = analysis
        by_multipv: dict[int, list[tuple]] = {}
        for key in found:
            by_multipv.setdefault(key[3], []).append(key)
        for multipv, keys in by_multipv.items():
            verdicts = rules.analysis_problems([k[0] for k in keys], [found[k].moves for k in keys],
                                               [found[k].evals for k in keys], max_moves=multipv)
            for key, problem in zip(keys, verdicts):
                if problem is not None:
                    problems[key] = problem
                    del found[key]
        if problems and not self._warned_rows:
            self._warned_rows = True
            key, problem = next(iter(problems.items()))
            _warn(f"Stockfish cache {self.path} holds analyses that do not check out ({key[0]}: {problem}); they "
                  f"are analysed again and overwritten")
        return found

    def put(self, key: tuple, analysis: Analysis) -> None:
        text = json.dumps(analysis.to_dict(), separators=(",", ":"))
        with self._lock:
            try:
                self._db.execute("INSERT OR REPLACE INTO analyses VALUES (?, ?, ?, ?, ?)",
                                 (*self._row_key(key), text))
            except sqlite3.DatabaseError as e:
                self._recover(e)

    def __len__(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM analyses").fetchone()
        return row[0] if row else 0

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _NoDatabase:
    """Stands in for the connection once the file is gone for good: nothing is found, nothing is kept."""

    def execute(self, sql: str, params=()):
        return self

    def fetchone(self):
        return None

    def close(self) -> None:
        pass


class _NotACache(Exception):
    """An sqlite database, but not one of ours."""


def _damaged(error: sqlite3.DatabaseError) -> bool:
    """Whether sqlite says the file is no database or a damaged one (not busy, locked or out of disk)."""
    name = getattr(error, "sqlite_errorname", "")
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or type(error) is sqlite3.DatabaseError


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_row(key: tuple, text: str) -> tuple[Analysis | None, str]:
    """The analysis in a cache row if its shape is right (the chess is checked by the caller), else why not."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError, RecursionError) as e:  # RecursionError: a row nested past the parser's depth
        return None, f"not JSON ({e})"
    if not isinstance(data, dict) or data.get("fen") != key[0] or not _is_int(data.get("depth")) \
            or data["depth"] < 0 or not isinstance(data.get("candidates"), list):
        return None, "not an analysis of this position"
    for c in data["candidates"]:
        cp, mate = (c.get("cp"), c.get("mate")) if isinstance(c, dict) else (None, None)
        score = cp if mate is None else mate
        # Exactly one score, a whole number no bigger than a mate's; a mate of 0 (the side to move is mated) has
        # no move to go with it. The eval's exact range is the chess check's.
        if not isinstance(c, dict) or not isinstance(c.get("move"), str) or (cp is None) == (mate is None) \
                or not _is_int(score) or abs(score) > MATE_SCORE or mate == 0:
            return None, f"a candidate is malformed: {c!r:.80}"
    return Analysis.from_dict(data), ""
