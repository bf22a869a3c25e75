"""A pool's back: worker threads each owning one `Engine` (its life: started, killed, restarted, aborted, quit) and
the failure policy (a position tried again behind the others; the engine given up on once positions keep failing).
The front, `pool.StockfishPool`, queues jobs here and is told how each ends through `finish`.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from rookworld.io.quote import quoted
from rookworld.chess.stockfish.analysis import Analysis
from rookworld.chess.stockfish.engine import Engine, EngineFailure, EngineHung, StockfishError

#: Positions that fail in a row, none analysed between, before the pool takes its engine for one that cannot
#: analyse. More than one: a position may fail alone (it is retried behind the others, which go on).
GIVE_UP_AFTER = 3


@dataclass
class Job:
    key: tuple
    fen: str
    legal: list[str]
    future: Future
    attempts: int = field(default=0)


@dataclass(frozen=True)
class Search:
    """What each analysis asks of an engine: its `go` command, its options, the time limits, the candidates."""

    go: str
    options: dict
    timeout_s: float
    startup_timeout_s: float
    multipv: int


class Front(Protocol):
    """What the workers tell the pool's front: how a job ended (`finish`: an analysis, an exception, or cancelled),
    a job whose holder cancelled it while it waited (`forget`), and restarts and timeouts (`tally`)."""

    def finish(self, job: Job, analysis: Analysis | None = None, exc: BaseException | None = None,
               cancel: bool = False) -> None: ...

    def forget(self, job: Job) -> None: ...

    def tally(self, **deltas: int) -> None: ...


_STOP = object()


class Workers:
    """`count` threads, each with its own engine of `path`, taking `Job`s from one queue and telling `front` how
    each ended. A try that fails puts the job behind the others, up to `retries` more; `GIVE_UP_AFTER` positions
    failing in a row ends every job with `failure`."""

    def __init__(self, path: str, count: int, search: Search, retries: int, front: Front):
        self.path, self.search, self.retries, self.front = path, search, retries, front
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._engines: list[Engine | None] = [None] * count
        self._closed = self._cancelling = False
        #: The positions that failed since the last analysis that succeeded.
        self._failing: set[tuple] = set()
        self.failure: StockfishError | None = None
        self._started: list[Future] = [Future() for _ in range(count)]
        self._threads = [threading.Thread(target=self._work, args=(i, self._started[i]), name=f"stockfish-worker-{i}",
                                          daemon=True) for i in range(count)]

    def start(self) -> list[BaseException]:
        """Starts the engines in parallel in their threads: why each that could not start did not (none: all
        did)."""
        for t in self._threads:
            t.start()
        return [e for f in self._started if (e := f.exception()) is not None]

    def put(self, job: Job) -> None:
        self._queue.put(job)

    def pids(self) -> list[int | None]:
        """Process id of each worker's engine right now (``None`` while it is being restarted)."""
        with self._lock:
            return [e.pid if e is not None else None for e in self._engines]

    def close(self, cancel_pending: bool) -> None:
        """Stops the workers and their engines; queued jobs finish first unless `cancel_pending`."""
        with self._lock:
            self._closed, self._cancelling = True, cancel_pending
        if cancel_pending:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, Job):
                    self.front.finish(item, cancel=True)
            self._abort_engines()  # the analyses under way end now, not at their time limit
        for _ in self._threads:
            self._queue.put(_STOP)
        for t in self._threads:
            if t is not threading.current_thread() and t.is_alive():
                t.join()

    # ---- one worker ----------------------------------------------------------------------------------------

    def _set_engine(self, index: int, engine: Engine | None) -> None:
        with self._lock:
            self._engines[index] = engine

    def _new_engine(self, index: int) -> Engine:
        engine = Engine(self.path, self.search.options, self.search.startup_timeout_s)
        self._set_engine(index, engine)
        return engine

    def _work(self, index: int, started: Future) -> None:
        engine: Engine | None = None
        try:
            engine = self._new_engine(index)
            started.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - reported to the pool's start
            started.set_exception(exc)
            return
        try:
            while True:
                job = self._queue.get()
                if job is _STOP:
                    break
                # A job tried before comes back running; a new one may have been cancelled while it waited.
                if job.attempts == 0 and not job.future.set_running_or_notify_cancel():
                    self.front.forget(job)
                    continue
                engine = self._run(index, engine, job)
        finally:
            self._set_engine(index, None)
            if engine is not None:
                engine.quit()

    def _run(self, index: int, engine: Engine | None, job: Job) -> Engine | None:
        """Analyse ``job`` on ``engine``, started again as needed; a failed try puts the job behind the others (or
        tries again at once when nothing else will take it). Returns the engine to keep using."""
        s = self.search
        while True:
            if self._cancelling:
                self.front.finish(job, cancel=True)
                return engine
            if self.failure is not None:
                self.front.finish(job, exc=self.failure)
                return engine
            job.attempts += 1
            try:
                if engine is None:
                    engine = self._new_engine(index)
                analysis = engine.analysis(job.fen, job.legal, s.go, s.timeout_s, s.multipv)
            except EngineFailure as exc:
                self.front.tally(restarts=1, timeouts=int(isinstance(exc, EngineHung)))
                if engine is not None:
                    engine.kill()
                    self._set_engine(index, None)
                engine = None
                if self._failed(job, exc) or self._requeue(job):
                    return engine
                continue
            except BaseException as exc:  # noqa: BLE001 - never let a worker die with a job unanswered
                self.front.finish(job, exc=exc)
                return engine
            with self._lock:
                self._failing.clear()
            self.front.finish(job, analysis=analysis)
            return engine

    def _failed(self, job: Job, error: EngineFailure) -> bool:
        """Counts a failed try of ``job``; True when the job is over: failed for good, cancelled, or the pool gave up
        on the engine."""
        with self._lock:
            self._failing.add(job.key)
            give_up = self.failure is None and len(self._failing) >= GIVE_UP_AFTER
            if give_up:
                self.failure = StockfishError(
                    f"Stockfish {self.path} cannot analyse: {len(self._failing)} positions in a row failed, none "
                    f"analysed between, the engine restarted after each (the last: {error}); check that it is a "
                    f"working UCI engine, or give another with --stockfish-path")
            failure, cancelling = self.failure, self._cancelling
        if give_up:
            self._abort_engines()  # the other workers' tries end now; they then see the failure
        if cancelling:
            self.front.finish(job, cancel=True)
        elif failure is not None:
            self.front.finish(job, exc=failure)
        elif job.attempts > self.retries:
            self.front.finish(job, exc=StockfishError(
                f"Stockfish failed on {quoted(job.fen)} {job.attempts} times; last: {error}"))
        else:
            return False
        return True

    def _requeue(self, job: Job) -> bool:
        """Puts a job that failed a try behind the others: the next try is another position's, so that one position
        that fails is told from an engine that fails. False once closed (the workers stop at the end of the
        queue)."""
        with self._lock:
            if self._closed:
                return False
            self._queue.put(job)
            return True

    def _abort_engines(self) -> None:
        with self._lock:
            engines = [e for e in self._engines if e is not None]
        for engine in engines:
            engine.abort()
