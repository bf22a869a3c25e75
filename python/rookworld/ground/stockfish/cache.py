"""Caches of analyses keyed by (normalized FEN, depth, nodes, multipv): in memory and in an sqlite file.

Neither is a correctness concern: a miss is an engine run, and a corrupt sqlite row is recomputed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence

from rookworld.ground.stockfish.analysis import Analysis


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
    """sqlite file of analyses keyed by (fen, depth, nodes, multipv); safe across threads and processes."""

    def __init__(self, path: str | os.PathLike):
        path = os.fspath(path)
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS analyses ("
            " fen TEXT NOT NULL, depth INTEGER NOT NULL, nodes INTEGER NOT NULL, multipv INTEGER NOT NULL,"
            " result TEXT NOT NULL, PRIMARY KEY (fen, depth, nodes, multipv)) WITHOUT ROWID"
        )

    @staticmethod
    def _row_key(key: tuple) -> tuple:
        fen, depth, nodes, multipv = key
        return fen, depth or 0, nodes or 0, multipv

    def get_many(self, keys: Sequence[tuple]) -> dict[tuple, Analysis]:
        found: dict[tuple, Analysis] = {}
        if not keys:
            return found
        with self._lock:
            for key in keys:
                row = self._db.execute(
                    "SELECT result FROM analyses WHERE fen=? AND depth=? AND nodes=? AND multipv=?",
                    self._row_key(key),
                ).fetchone()
                if row is not None:
                    try:
                        found[key] = Analysis.from_dict(json.loads(row[0]))
                    except (ValueError, KeyError, TypeError):
                        pass  # a corrupt row is simply recomputed and overwritten
        return found

    def put(self, key: tuple, analysis: Analysis) -> None:
        text = json.dumps(analysis.to_dict(), separators=(",", ":"))
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO analyses VALUES (?, ?, ?, ?, ?)", (*self._row_key(key), text))

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM analyses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
