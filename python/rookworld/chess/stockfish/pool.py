"""The pool: Stockfish processes analysing FENs in the background, one per worker thread, behind futures.

Each worker owns one `Engine`. An engine that dies, says nothing for `ANSWER_S`, gives no ``bestmove`` within
``timeout_s`` or answers nonsense (`BadAnswer`) is killed and restarted, and the position is tried again behind the
others (``retries`` times, then its future raises `StockfishError`); the other positions are never lost. Once
`GIVE_UP_AFTER` positions in a row have failed, none analysed between, the engine has shown that it cannot
analyse: the pool gives up, every waiting future and every later `submit` raising one `StockfishError` that says
so. A bad FEN makes its own future raise ``ValueError``. Identical positions share one analysis, and answers come
from a `MemoryCache` (and a `DiskCache`, when given) before any engine.
"""

from __future__ import annotations

import enum
import os
import sqlite3
import threading
from collections.abc import Iterable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass

from rookworld.chess import rules as _chess
from rookworld.io.quote import quoted
from rookworld.chess.stockfish.analysis import Analysis
from rookworld.chess.stockfish.cache import DiskCache, MemoryCache
from rookworld.chess.stockfish.engine import StockfishError, find_stockfish
from rookworld.chess.stockfish.limits import default_timeout, search_problem, workers_count_problem, workers_problem
from rookworld.chess.stockfish.workers import Job, Search, Workers


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
        problem = search_problem(depth, nodes)
        if problem is not None:
            raise ValueError(problem)
        if not 1 <= multipv <= 500:
            raise ValueError(f"multipv must be in 1..500, got {multipv}")
        if hash_mb < 1 or threads < 1:
            raise ValueError(f"hash_mb and threads must be >= 1, got {hash_mb}, {threads}")
        if workers is None:  # the callers analyse while torch waits, not beside it
            workers = os.cpu_count() or 1
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        too_many = workers_problem("--stockfish-workers", workers)
        if too_many is not None:
            raise StockfishError(too_many)
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
        self.search = search = Search(f"go nodes {nodes}" if nodes is not None else f"go depth {self.depth}",
                        {"Threads": threads, "Hash": hash_mb, "MultiPV": multipv}, self.timeout_s,
                        max(10.0, min(self.timeout_s, 60.0)), multipv)

        self._lock = threading.Lock()
        self._counts = dict.fromkeys(StockfishStats.__dataclass_fields__, 0)
        self._memory = MemoryCache(max_cached)
        self._inflight: dict[tuple, Future] = {}
        self._closed = False
        self._disk = DiskCache(cache_path) if cache_path is not None else None
        self._workers = Workers(self.path, workers, search, self.retries, self)
        problems = self._workers.start()  # fails here if the binary is no UCI engine
        if problems:
            self.close()
            cores = os.cpu_count() or 1
            crowd = f" (starting {workers} engines at once on {cores} cores)" if workers > cores else ""
            raise StockfishError(f"could not start Stockfish {self.path!r}{crowd}: {problems[0]}") from problems[0]

    # ---- public API --------------------------------------------------------------------------

    def submit(self, fens: Iterable[str]) -> list[Future]:
        """One future per FEN, returned at once; each resolves to an :class:`Analysis`.

        A bad FEN's future raises ``ValueError`` naming it. Identical positions share one analysis.
        """
        fens = list(fens)
        if self._closed:
            raise RuntimeError("StockfishPool is closed")
        if self.failure is not None:
            raise StockfishError(str(self.failure))
        for fen in fens:
            if not isinstance(fen, str):
                raise TypeError(f"FENs must be str, got {type(fen).__name__}: {quoted(fen)}")
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
        jobs: list[Job] = []
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
                jobs.append(Job(key, norm, moves, future))
                futures.append(future)
        for job in jobs:
            self._workers.put(job)
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
        return self._workers.pids()

    @property
    def failure(self) -> StockfishError | None:
        """Why the pool gave up on its engine (`GIVE_UP_AFTER` positions failed in a row), or ``None``."""
        return self._workers.failure

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
        self._workers.close(cancel_pending)
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
        future.set_exception(ValueError(f"bad FEN {quoted(fen)}: {why}"))
        return future

    # ---- what the workers tell (`workers.Front`) --------------------------------------------------------

    def tally(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def forget(self, job: Job) -> None:
        with self._lock:
            if self._inflight.get(job.key) is job.future:
                del self._inflight[job.key]

    def finish(self, job: Job, analysis: Analysis | None = None, exc: BaseException | None = None,
               cancel: bool = False) -> None:
        if analysis is not None and self._disk is not None:
            try:
                self._disk.put(job.key, analysis)
            except sqlite3.Error:
                pass  # the disk cache is an optimisation; the result stands
        with self._lock:
            if self._inflight.get(job.key) is job.future:
                del self._inflight[job.key]
            if analysis is not None:
                self._memory.put(job.key, analysis)
                self._counts["engine_analyses"] += 1
            elif not cancel:
                self._counts["errors"] += 1
        if cancel and job.future.cancel():
            job.future.set_running_or_notify_cancel()  # wake wait()/as_completed()
        elif cancel:  # tried before, so running: a running future cannot be cancelled, only ended
            job.future.set_exception(CancelledError("the Stockfish pool was closed before this analysis ended"))
        elif analysis is not None:
            job.future.set_result(analysis)
        else:
            job.future.set_exception(exc)


def _done(value: Analysis) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future



class Role(enum.Enum):
    """What a pool analyses for, which decides how many engines it runs (`pool_workers`)."""

    REWARDS = "rewards"  # a GRPO run's rewards
    ANALYSIS = "analysis"  # evaluations, positions, served tasks, other trainers' rewards
    GAME = "game"  # one game's analyses


def pool_workers(role: Role, workers: int | None = None, *, cores: int | None = None, beside_gpu: bool = False) -> int:
    """The engines a pool runs: as many as asked for; one for a game; otherwise one a core (`cores`: this
    process's share), since they analyse while torch waits, not beside it, except a GRPO run's rewards beside a
    GPU, which analyse the next step's prompts while it samples and leave the core that drives it."""
    if workers:
        return workers
    if role is Role.GAME:
        return 1
    cores = cores or os.cpu_count() or 1
    return max(1, cores - 1) if role is Role.REWARDS and beside_gpu else cores


def pool_for(role: Role, *, cores: int | None = None, beside_gpu: bool = False, **settings) -> StockfishPool:
    """The one builder of a `StockfishPool` for a role: `settings` are the pool's (path, depth, nodes, workers,
    cache_path, multipv), its workers decided by `pool_workers`."""
    if problem := workers_count_problem("stockfish_workers", settings.get("workers")):
        raise ValueError(problem)
    workers = pool_workers(role, settings.pop("workers", None), cores=cores, beside_gpu=beside_gpu)
    return StockfishPool(workers=workers, **settings)


class LazyPool:
    """A `StockfishPool` for a role, started the first time it is asked for, once, whichever thread asks (a
    reward function awaited in several threads, a server's sessions): what a user of the rewards that never needs
    an analysis never starts. `close` ends it, and a later `get` starts none."""

    def __init__(self, role: Role, **settings):
        problem = search_problem(settings.get("depth", 10), settings.get("nodes")) \
            or workers_count_problem("stockfish_workers", settings.get("workers"))
        if problem is not None:  # said where the pool is asked for, not at its first analysis
            raise ValueError(problem)
        self._role, self._settings = role, settings
        self._pool: StockfishPool | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def started(self) -> bool:
        return self._pool is not None

    def get(self) -> StockfishPool:
        with self._lock:
            if self._closed:
                raise StockfishError("the Stockfish pool is closed")
            if self._pool is None:
                self._pool = pool_for(self._role, **self._settings)
            return self._pool

    def close(self, cancel_pending: bool = False, *, final: bool = False) -> None:
        """Ends the pool if it started; with `final`, none starts again (a server shutting down)."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._closed = self._closed or final
        if pool is not None:
            pool.close(cancel_pending=cancel_pending)
