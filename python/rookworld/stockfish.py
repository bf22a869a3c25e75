"""Stockfish analysis service: a pool of UCI engines behind futures, with a memory and disk cache.

Each worker thread owns one Stockfish process and talks UCI to it over pipes::

    with StockfishPool(depth=10) as pool:
        futures = pool.submit(fens)          # returns at once; analysis runs in the background
        ...                                  # GPU work overlaps the analysis
        analyses = [f.result() for f in futures]

An :class:`Analysis` holds up to ``multipv`` (5) :class:`Candidate` moves ranked best first, with
scores from the side to move's view, as the RookWorld ``P:`` task prints them (``Candidate.eval_text``).
Positions without legal moves (checkmate, stalemate) get no candidates and never reach an engine.

Robustness: an engine that dies or gives no ``bestmove`` within ``timeout_s`` is killed and restarted
and the position is retried (``retries`` times, then its future raises :class:`StockfishError`);
the other positions are never lost. A bad FEN makes its own future raise ``ValueError``.

Only the standard library and :mod:`rookworld.chess` are used here.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import sqlite3
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rookworld import chess as _chess

__all__ = [
    "Analysis",
    "Candidate",
    "MATE_SCORE",
    "StockfishError",
    "StockfishNotFoundError",
    "StockfishPool",
    "StockfishStats",
    "default_timeout",
    "find_stockfish",
]

#: Centipawn value of a mate, as python-chess ``score(mate_score=100000)`` and the RookWorld data use it.
MATE_SCORE = 100_000
#: Where Debian/Ubuntu's ``stockfish`` package installs the binary (often not on PATH).
_FALLBACK_PATHS: tuple[str, ...] = ("/usr/games/stockfish",)
_ENV_VAR = "ROOKWORLD_STOCKFISH"
_INSTALL_HINT = (
    "pass its location with --stockfish-path (or the path= argument), or install it: "
    "`apt-get install stockfish` (Debian/Ubuntu, installs /usr/games/stockfish), `brew install stockfish`, "
    "or download a binary from https://stockfishchess.org/download/ "
    f"(the {_ENV_VAR} environment variable may also name it)"
)


class StockfishNotFoundError(FileNotFoundError):
    """No usable Stockfish binary was found."""


class StockfishError(RuntimeError):
    """An engine failed to analyse a position (after restarts and retries), or misbehaved."""


# --------------------------------------------------------------------------------------------------
# Locating the binary


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_stockfish(path: str | None = None) -> str:
    """The Stockfish binary to run.

    ``path`` if given (a file that must exist and be executable, or a command name on PATH); otherwise the
    ``ROOKWORLD_STOCKFISH`` environment variable, then ``stockfish`` on PATH, then ``/usr/games/stockfish``.
    Raises :class:`StockfishNotFoundError` (a ``FileNotFoundError``) saying how to get one.
    """
    if path is not None:
        path = os.path.expanduser(os.fspath(path))
        if _executable(path):
            return os.path.abspath(path)
        if os.sep not in path:
            found = shutil.which(path)
            if found:
                return found
        why = "is not executable" if os.path.exists(path) else "does not exist"
        raise StockfishNotFoundError(f"Stockfish binary {path!r} {why}; {_INSTALL_HINT}")
    env = os.environ.get(_ENV_VAR)
    if env:  # a setting beats what happens to be installed
        env = os.path.expanduser(env)
        if _executable(env):
            return os.path.abspath(env)
        found = shutil.which(env) if os.sep not in env else None
        if found:
            return found
        raise StockfishNotFoundError(f"{_ENV_VAR}={env!r} is not an executable file; {_INSTALL_HINT}")
    found = shutil.which("stockfish")
    if found:
        return found
    for candidate in _FALLBACK_PATHS:
        if _executable(candidate):
            return candidate
    raise StockfishNotFoundError(
        f"Stockfish not found (not on PATH, not at {', '.join(_FALLBACK_PATHS)}, {_ENV_VAR} unset); "
        + _INSTALL_HINT
    )


# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True)
class Candidate:
    """One MultiPV line: a move and its score from the side to move's view (exactly one of cp/mate set)."""

    move: str
    cp: int | None
    #: Moves to mate: ``n > 0`` the side to move mates in n, ``n <= 0`` it is mated in ``-n``.
    mate: int | None

    @property
    def pawns(self) -> float:
        """The score in pawns; mates as python-chess ``score(mate_score=100000) / 100`` (mate in 3: 999.97)."""
        if self.mate is not None:
            centipawns = MATE_SCORE - self.mate if self.mate > 0 else -MATE_SCORE - self.mate
            return centipawns / 100
        if self.cp is None:
            raise ValueError(f"candidate {self.move} has no score")
        return self.cp / 100

    @property
    def eval_text(self) -> str:
        """The score as the RookWorld data prints it: a Python float, ``-2.3``, ``0.0``, ``999.97``."""
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
        """Each candidate's score in pawns, side to move's view."""
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


@dataclass(frozen=True, slots=True)
class StockfishStats:
    """Counters of a :class:`StockfishPool` (a snapshot)."""

    #: FENs passed to ``submit``/``analyse``.
    requests: int = 0
    #: Answered from the memory or disk cache without an engine.
    cache_hits: int = 0
    #: The part of ``cache_hits`` that came from the sqlite file.
    disk_hits: int = 0
    #: Joined an identical analysis already queued or running.
    deduplicated: int = 0
    #: Checkmate/stalemate positions answered without an engine.
    no_legal_moves: int = 0
    #: Positions a Stockfish process analysed to completion.
    engine_analyses: int = 0
    #: Engines killed and restarted after dying or hanging.
    restarts: int = 0
    #: Of which: no ``bestmove`` within the timeout.
    timeouts: int = 0
    #: Futures that ended with an exception (bad FEN, or retries exhausted).
    errors: int = 0


# --------------------------------------------------------------------------------------------------
# UCI


def _parse_info(line: str) -> tuple[int, int, int, int | None, int | None, str] | None:
    """``(multipv, depth, seldepth, cp, mate, first_move)`` of a scored PV line, else ``None``.

    ``info string`` lines, bound-only scores (``lowerbound``/``upperbound``) and lines without a
    score or PV are ignored.
    """
    tokens = line.split()
    if len(tokens) < 2 or tokens[0] != "info":
        return None
    multipv, depth, seldepth = 1, None, 0
    cp = mate = None
    move = None
    i, n = 1, len(tokens)
    try:
        while i < n:
            tok = tokens[i]
            if tok == "string":
                return None
            if tok == "score":
                kind, value = tokens[i + 1], int(tokens[i + 2])
                if kind == "cp":
                    cp = value
                elif kind == "mate":
                    mate = value
                else:
                    return None
                i += 3
                if i < n and tokens[i] in ("lowerbound", "upperbound"):
                    return None
                continue
            if tok == "pv":
                if i + 1 < n:
                    move = tokens[i + 1]
                break
            if tok == "multipv":
                multipv = int(tokens[i + 1])
            elif tok == "depth":
                depth = int(tokens[i + 1])
            elif tok == "seldepth":
                seldepth = int(tokens[i + 1])
            elif tok == "wdl":
                i += 4
                continue
            elif tok in ("lowerbound", "upperbound"):
                return None
            i += 2
    except (IndexError, ValueError):
        return None
    if depth is None or move is None or (cp is None and mate is None):
        return None
    return multipv, depth, seldepth, cp, mate, move


def _candidates(lines: dict[int, tuple[int, int, int | None, int | None, str]], legal: Sequence[str], k: int):
    """Candidates ranked by MultiPV index: distinct, legal, at most ``k``; and the best line's depth."""
    legal_set = set(legal)
    out: list[Candidate] = []
    seen: set[str] = set()
    for index in sorted(lines):
        depth, _sel, cp, mate, move = lines[index]
        if move in seen or move not in legal_set:
            continue
        seen.add(move)
        out.append(Candidate(move, cp, mate))
        if len(out) == k:
            break
    best_depth = lines[min(lines)][0] if lines else 0
    return tuple(out), best_depth


class _EngineFailure(Exception):
    """The engine died, hung or spoke nonsense; it must be killed and restarted."""


class _EngineHung(_EngineFailure):
    pass


class _Engine:
    """One Stockfish process. Not thread-safe: owned by one worker thread."""

    def __init__(self, path: str, options: dict[str, int], startup_timeout: float):
        self.path = path
        self._lines: queue.Queue[str | None] = queue.Queue()
        try:
            self.proc = subprocess.Popen(
                [path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
                errors="replace",
                start_new_session=True,  # a Ctrl-C in the terminal must not kill the engines under us
            )
        except OSError as exc:
            raise _EngineFailure(f"cannot start {path!r}: {exc}") from exc
        self.pid = self.proc.pid
        self._reader = threading.Thread(
            target=self._read, args=(self.proc.stdout, self._lines), name=f"stockfish-reader-{self.pid}", daemon=True
        )
        self._reader.start()
        try:
            deadline = time.monotonic() + startup_timeout
            self._send("uci")
            self._wait_for("uciok", deadline)
            for name, value in options.items():
                self._send(f"setoption name {name} value {value}")
            self._send("isready")
            self._wait_for("readyok", deadline)
        except BaseException:
            self.kill()
            raise

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        try:
            for line in stream:
                lines.put(line)
        except (OSError, ValueError):
            pass
        finally:
            lines.put(None)

    def _send(self, command: str) -> None:
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError when the process is gone
            raise _EngineFailure(f"engine pid {self.pid} is gone ({exc!r}; exit code {self.proc.poll()})") from exc

    def _readline(self, deadline: float) -> str:
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise queue.Empty
            line = self._lines.get(timeout=remaining)
        except queue.Empty:
            raise _EngineHung(f"engine pid {self.pid} gave no answer in time") from None
        if line is None:
            code = self.proc.poll()
            if code is None:
                try:
                    code = self.proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
            raise _EngineFailure(f"engine pid {self.pid} died (exit code {code})")
        return line

    def _wait_for(self, token: str, deadline: float) -> None:
        while True:
            line = self._readline(deadline)
            if line.split()[:1] == [token]:
                return

    def analyse(self, fen: str, go: str, timeout: float):
        """Deepest scored line per MultiPV index: ``{index: (depth, seldepth, cp, mate, move)}``."""
        deadline = time.monotonic() + timeout
        # ucinewgame clears the hash and history (~1 ms): results then depend only on the position.
        self._send("ucinewgame")
        self._send(f"position fen {fen}")
        self._send(go)
        lines: dict[int, tuple[int, int, int | None, int | None, str]] = {}
        while True:
            line = self._readline(deadline)
            if line.startswith("bestmove"):
                return lines
            parsed = _parse_info(line)
            if parsed is None:
                continue
            index, depth, seldepth, cp, mate, move = parsed
            old = lines.get(index)
            if old is None or depth >= old[0]:  # deepest wins; among equals the latest
                lines[index] = (depth, seldepth, cp, mate, move)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            try:
                proc.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._close_pipes()

    def quit(self, timeout: float = 2.0) -> None:
        if self.proc.poll() is None:
            try:
                self._send("quit")
                self.proc.wait(timeout=timeout)
            except (_EngineFailure, subprocess.TimeoutExpired):
                pass
        self.kill()

    def _close_pipes(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self._reader.join(timeout=1)


# --------------------------------------------------------------------------------------------------
# Disk cache


class _DiskCache:
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


# --------------------------------------------------------------------------------------------------
# The pool


def default_timeout(depth: int | None, nodes: int | None) -> float:
    """A generous per-position limit: at least 30 s, more for deep or many-node searches."""
    if nodes is not None:
        return max(30.0, nodes / 20_000)
    return max(30.0, 2.0 ** ((depth or 0) / 2) / 10)


@dataclass
class _Job:
    key: tuple
    fen: str
    legal: list[str]
    future: Future
    attempts: int = field(default=0)


_STOP = object()


class StockfishPool:
    """Stockfish processes analysing FENs in the background, one per worker thread.

    ``depth`` or ``nodes`` limits each search (``go nodes N`` when ``nodes`` is given, else
    ``go depth N``); ``multipv`` candidates per position; ``workers`` defaults to one per spare core.
    Results are cached in memory (LRU of ``max_cached`` entries) keyed by the normalized FEN and the
    search limits, and in the sqlite file ``cache_path`` when given.
    """

    def __init__(
        self,
        path: str | None = None,
        workers: int | None = None,
        depth: int | None = 10,
        nodes: int | None = None,
        multipv: int = 5,
        hash_mb: int = 16,
        threads: int = 1,
        cache_path: str | os.PathLike | None = None,
        timeout_s: float | None = None,
        *,
        retries: int = 3,
        max_cached: int = 500_000,
    ):
        if nodes is not None and nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        if nodes is None and (depth is None or depth < 1):
            raise ValueError(f"depth must be >= 1 (or give nodes), got {depth}")
        if not 1 <= multipv <= 500:
            raise ValueError(f"multipv must be in 1..500, got {multipv}")
        if hash_mb < 1 or threads < 1:
            raise ValueError(f"hash_mb and threads must be >= 1, got {hash_mb}, {threads}")
        if workers is None:
            workers = max(1, (os.cpu_count() or 1) - 1)
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.path = find_stockfish(path)
        self.workers = workers
        self.nodes = nodes
        self.depth = None if nodes is not None else depth
        self.multipv = multipv
        self.hash_mb = hash_mb
        self.threads = threads
        self.timeout_s = float(timeout_s) if timeout_s is not None else default_timeout(self.depth, nodes)
        self.retries = max(0, retries)
        self._go = f"go nodes {nodes}" if nodes is not None else f"go depth {self.depth}"
        self._options = {"Threads": threads, "Hash": hash_mb, "MultiPV": multipv}
        self._startup_timeout = max(10.0, min(self.timeout_s, 60.0))

        self._lock = threading.Lock()
        self._counts = dict.fromkeys(StockfishStats.__dataclass_fields__, 0)
        self._memory: OrderedDict[tuple, Analysis] = OrderedDict()
        self._max_cached = max_cached
        self._inflight: dict[tuple, Future] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._disk = _DiskCache(cache_path) if cache_path is not None else None
        self._engines: list[_Engine | None] = [None] * workers

        # Start the engines in parallel in their worker threads; fail here if the binary is no UCI engine.
        started: list[Future] = [Future() for _ in range(workers)]
        self._threads = [
            threading.Thread(target=self._worker, args=(i, started[i]), name=f"stockfish-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()
        problems = []
        for f in started:
            exc = f.exception()
            if exc is not None:
                problems.append(exc)
        if problems:
            self.close()
            raise StockfishError(f"could not start Stockfish {self.path!r}: {problems[0]}") from problems[0]

    # ---- public API --------------------------------------------------------------------------

    def submit(self, fens: Iterable[str]) -> list[Future]:
        """One future per FEN, returned at once; each resolves to an :class:`Analysis`.

        A bad FEN's future raises ``ValueError`` naming it. Identical positions share one analysis.
        """
        fens = list(fens)
        if self._closed:
            raise RuntimeError("StockfishPool is closed")
        for fen in fens:
            if not isinstance(fen, str):
                raise TypeError(f"FENs must be str, got {type(fen).__name__}: {fen!r}")
        normalized = _chess.normalize_fens(fens)
        good = sorted({n for n in normalized if n is not None})
        legal = dict(zip(good, _chess.legal_moves_batch(good))) if good else {}
        keys = {n: (n, self.depth, self.nodes, self.multipv) for n in good}

        disk_found: dict[tuple, Analysis] = {}
        if self._disk is not None:
            with self._lock:
                missing = [k for k in keys.values() if k not in self._memory and k not in self._inflight]
            disk_found = self._disk.get_many(missing)

        futures: list[Future] = []
        jobs: list[_Job] = []
        with self._lock:
            if self._closed:
                raise RuntimeError("StockfishPool is closed")
            counts = self._counts
            counts["requests"] += len(fens)
            for fen, norm in zip(fens, normalized):
                if norm is None:
                    futures.append(self._bad_fen(fen))
                    continue
                moves = legal[norm]
                if not moves:
                    counts["no_legal_moves"] += 1
                    futures.append(_done(Analysis(norm, (), 0)))
                    continue
                key = keys[norm]
                hit = self._memory.get(key)
                if hit is not None:
                    self._memory.move_to_end(key)
                    counts["cache_hits"] += 1
                    futures.append(_done(hit))
                    continue
                running = self._inflight.get(key)
                if running is not None:
                    counts["deduplicated"] += 1
                    futures.append(running)
                    continue
                hit = disk_found.get(key)
                if hit is not None:
                    counts["cache_hits"] += 1
                    counts["disk_hits"] += 1
                    self._remember(key, hit)
                    futures.append(_done(hit))
                    continue
                future: Future = Future()
                self._inflight[key] = future
                jobs.append(_Job(key, norm, moves, future))
                futures.append(future)
        for job in jobs:
            self._queue.put(job)
        return futures

    def analyse(self, fens: Iterable[str]) -> list[Analysis]:
        """Blocking :meth:`submit`: the analyses in order (raises the first failure)."""
        return [f.result() for f in self.submit(fens)]

    def analyse_one(self, fen: str) -> Analysis:
        return self.submit([fen])[0].result()

    def cached(self, fen: str) -> Analysis | None:
        """The cached analysis of ``fen`` under this pool's limits, without running an engine."""
        try:
            key = (_chess.normalize_fen(fen), self.depth, self.nodes, self.multipv)
        except ValueError:
            return None
        with self._lock:
            hit = self._memory.get(key)
        if hit is None and self._disk is not None:
            hit = self._disk.get_many([key]).get(key)
        return hit

    @property
    def stats(self) -> StockfishStats:
        with self._lock:
            return StockfishStats(**self._counts)

    def engine_pids(self) -> list[int | None]:
        """Process id of each worker's engine right now (``None`` while it is being restarted)."""
        with self._lock:
            return [e.pid if e is not None else None for e in self._engines]

    @property
    def pending(self) -> int:
        """Analyses queued or running."""
        with self._lock:
            return len(self._inflight)

    def close(self, cancel_pending: bool = False) -> None:
        """Stop the workers and engines. Queued analyses finish first unless ``cancel_pending``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if cancel_pending:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Job):
                    self._finish(item, exc=None, cancel=True)
        for _ in self._threads:
            self._queue.put(_STOP)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
        if self._disk is not None:
            self._disk.close()

    def __enter__(self) -> StockfishPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel_pending=exc_type is not None)

    # ---- internals ---------------------------------------------------------------------------

    def _bad_fen(self, fen: str) -> Future:
        try:
            _chess.normalize_fen(fen)
            why = "not a legal position"
        except ValueError as exc:
            why = str(exc)
        self._counts["errors"] += 1
        future: Future = Future()
        future.set_exception(ValueError(f"bad FEN {fen!r}: {why}"))
        return future

    def _remember(self, key: tuple, analysis: Analysis) -> None:
        # caller holds self._lock
        self._memory[key] = analysis
        self._memory.move_to_end(key)
        while len(self._memory) > self._max_cached:
            self._memory.popitem(last=False)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def _set_engine(self, index: int, engine: _Engine | None) -> None:
        with self._lock:
            self._engines[index] = engine

    def _finish(self, job: _Job, analysis: Analysis | None = None, exc: BaseException | None = None,
                cancel: bool = False) -> None:
        with self._lock:
            if self._inflight.get(job.key) is job.future:
                del self._inflight[job.key]
            if analysis is not None:
                self._remember(job.key, analysis)
                self._counts["engine_analyses"] += 1
            elif not cancel:
                self._counts["errors"] += 1
        if cancel:
            job.future.cancel()
            job.future.set_running_or_notify_cancel()  # wake wait()/as_completed()
        elif analysis is not None:
            job.future.set_result(analysis)
        else:
            job.future.set_exception(exc)

    def _worker(self, index: int, started: Future) -> None:
        engine: _Engine | None = None
        try:
            engine = _Engine(self.path, self._options, self._startup_timeout)
            self._set_engine(index, engine)
            started.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - reported to __init__
            started.set_exception(exc)
            return
        try:
            while True:
                job = self._queue.get()
                if job is _STOP:
                    break
                if not job.future.set_running_or_notify_cancel():
                    with self._lock:
                        if self._inflight.get(job.key) is job.future:
                            del self._inflight[job.key]
                    continue
                engine = self._run(index, engine, job)
        finally:
            self._set_engine(index, None)
            if engine is not None:
                engine.quit()

    def _run(self, index: int, engine: _Engine | None, job: _Job) -> _Engine | None:
        """Analyse ``job`` on ``engine``, restarting it as needed; returns the engine to keep using."""
        last_error = None
        while job.attempts <= self.retries:
            job.attempts += 1
            try:
                if engine is None:
                    engine = _Engine(self.path, self._options, self._startup_timeout)
                    self._set_engine(index, engine)
                lines = engine.analyse(job.fen, self._go, self.timeout_s)
                candidates, depth = _candidates(lines, job.legal, self.multipv)
                if not candidates:
                    raise _EngineFailure(f"engine pid {engine.pid} returned no usable line for {job.fen!r}")
                analysis = Analysis(job.fen, candidates, depth)
            except _EngineFailure as exc:
                last_error = exc
                self._count(restarts=1, timeouts=int(isinstance(exc, _EngineHung)))
                if engine is not None:
                    engine.kill()
                    self._set_engine(index, None)
                engine = None
                continue
            except BaseException as exc:  # noqa: BLE001 - never let a worker die with a job unanswered
                self._finish(job, exc=exc)
                return engine
            if self._disk is not None:
                try:
                    self._disk.put(job.key, analysis)
                except sqlite3.Error:
                    pass  # the disk cache is an optimisation; the result stands
            self._finish(job, analysis=analysis)
            return engine
        self._finish(
            job,
            exc=StockfishError(f"Stockfish failed on {job.fen!r} {job.attempts} times; last: {last_error}"),
        )
        return engine


def _done(value: Analysis) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future

