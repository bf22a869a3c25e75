"""The pool: Stockfish processes analysing FENs in the background, one per worker thread, behind futures.

Each worker owns one `Engine`. An engine that dies or gives no ``bestmove`` within ``timeout_s`` is killed
and restarted and the position is retried (``retries`` times, then its future raises `StockfishError`); the
other positions are never lost. A bad FEN makes its own future raise ``ValueError``. Identical positions
share one analysis, and answers come from a `MemoryCache` (and a `DiskCache`, when given) before any engine.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from rookworld.ground import chess as _chess
from rookworld.ground.stockfish.analysis import Analysis
from rookworld.ground.stockfish.cache import DiskCache, MemoryCache
from rookworld.ground.stockfish.engine import (Engine, EngineFailure, EngineHung, StockfishError, find_stockfish,
                                               ranked_candidates)


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
    ``go depth N``); ``multipv`` candidates per position; ``workers`` defaults to one per core.
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
        if workers is None:  # the callers analyse while torch waits, not beside it
            workers = os.cpu_count() or 1
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
        self._memory = MemoryCache(max_cached)
        self._inflight: dict[tuple, Future] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._disk = DiskCache(cache_path) if cache_path is not None else None
        self._engines: list[Engine | None] = [None] * workers

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
                    self._memory.put(key, hit)
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

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def _set_engine(self, index: int, engine: Engine | None) -> None:
        with self._lock:
            self._engines[index] = engine

    def _finish(self, job: _Job, analysis: Analysis | None = None, exc: BaseException | None = None,
                cancel: bool = False) -> None:
        with self._lock:
            if self._inflight.get(job.key) is job.future:
                del self._inflight[job.key]
            if analysis is not None:
                self._memory.put(job.key, analysis)
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
        engine: Engine | None = None
        try:
            engine = Engine(self.path, self._options, self._startup_timeout)
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

    def _run(self, index: int, engine: Engine | None, job: _Job) -> Engine | None:
        """Analyse ``job`` on ``engine``, restarting it as needed; returns the engine to keep using."""
        last_error = None
        while job.attempts <= self.retries:
            job.attempts += 1
            try:
                if engine is None:
                    engine = Engine(self.path, self._options, self._startup_timeout)
                    self._set_engine(index, engine)
                lines = engine.analyse(job.fen, self._go, self.timeout_s)
                candidates, depth = ranked_candidates(lines, job.legal, self.multipv)
                if not candidates:
                    raise EngineFailure(f"engine pid {engine.pid} returned no usable line for {job.fen!r}")
                analysis = Analysis(job.fen, candidates, depth)
            except EngineFailure as exc:
                last_error = exc
                self._count(restarts=1, timeouts=int(isinstance(exc, EngineHung)))
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

