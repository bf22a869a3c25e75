"""Data parallelism under torchrun: which rank this is, and reductions over ranks that are no-ops alone.

The environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) is checked
before it is used, and the start-up waits for the other ranks for a bounded time (ROOKWORLD_DIST_TIMEOUT seconds),
saying so when the wait lasts: a rank that never comes, or a rank 0 that is not there, is one line naming it."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from rookworld.io.errors import RookworldError
from rookworld.settings.base import ConfigError


#: How long a rank waits in a collective before the run is ended. The other ranks wait in a barrier while rank 0
#: runs the held-out evaluation, which with games against Stockfish or a large --eval-size outlasts the defaults
#: (10 minutes for NCCL, 30 for gloo); a rank that really died still ends the run, in at most this long.
COLLECTIVE_TIMEOUT = timedelta(hours=2)
#: The environment variable that bounds the start-up: how long, in seconds, a rank waits for all the others.
STARTUP_TIMEOUT_VAR = "ROOKWORLD_DIST_TIMEOUT"
#: Ranks start together (torchrun starts them; each imports torch and reaches here in seconds): minutes is plenty,
#: and a rank that never came is said long before a collective's two hours.
STARTUP_TIMEOUT_S = 300.0
#: A start-up that takes longer than this says what it waits for.
NOTICE_AFTER_S = 2.0
_POLL_S = 0.1
_ONE_PROCESS = "for one process set none of RANK and WORLD_SIZE; torchrun sets them all"


class DistributedError(RookworldError, RuntimeError):
    """The ranks could not work together: a rank that never joined, or one lost on the way. One line, without what
    to run next (the command adds that). An environment that cannot work is a ConfigError."""


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def init_distributed(device_kind: str) -> DistInfo:
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; start the process group (NCCL on CUDA, gloo on CPU) once every rank
    has joined. ConfigError for an environment that cannot work, DistributedError for a rank that does not come."""
    info = dist_info()
    if info.world > 1 and not dist.is_initialized():
        if device_kind == "cuda":
            if info.local_rank >= torch.cuda.device_count():
                raise ConfigError(f"LOCAL_RANK is {info.local_rank} but this machine has "
                                  f"{torch.cuda.device_count()} GPUs: start at most that many ranks on it")
            torch.cuda.set_device(info.local_rank)
        store = rendezvous(info)
        try:
            if device_kind == "cuda":
                # Bound to its GPU (torch >= 2.3), NCCL never guesses a rank's device, as a barrier otherwise does.
                dist.init_process_group(backend="nccl", store=store, rank=info.rank, world_size=info.world,
                                        timeout=COLLECTIVE_TIMEOUT, device_id=torch.device("cuda", info.local_rank))
            else:
                dist.init_process_group(backend="gloo", store=store, rank=info.rank, world_size=info.world,
                                        timeout=COLLECTIVE_TIMEOUT)
        except dist.DistError as e:
            raise DistributedError(f"rank {info.rank}: the process group did not start: {reason(e)}") from None
        store.set_timeout(COLLECTIVE_TIMEOUT)  # from here on the store serves collectives, which may wait long
    return info


# -- the environment ------------------------------------------------------------------------------------------------

def dist_info() -> DistInfo:
    """This process's place among the ranks, from torchrun's environment, checked; one process without it."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None and world is None:
        return DistInfo()
    if rank is None or world is None:
        given, missing = ("RANK", "WORLD_SIZE") if world is None else ("WORLD_SIZE", "RANK")
        raise ConfigError(f"{given} is set but {missing} is not: {_ONE_PROCESS}")
    world_size = _whole("WORLD_SIZE", low=1)
    info = DistInfo(_whole("RANK", low=0, high=world_size - 1), world_size,
                    _whole("LOCAL_RANK", low=0), _whole("LOCAL_WORLD_SIZE", low=1, default=world_size))
    if info.local_rank >= info.local_world:
        raise ConfigError(f"LOCAL_RANK must be below LOCAL_WORLD_SIZE ({info.local_world}), got {info.local_rank}")
    if info.world > 1:
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(name, "").strip():
                raise ConfigError(f"WORLD_SIZE is {info.world} but {name} is not set: every rank needs rank 0's "
                                  f"address (MASTER_ADDR) and port (MASTER_PORT); {_ONE_PROCESS}")
        _whole("MASTER_PORT", low=1, high=65535)
        startup_timeout()
    return info


def _whole(name: str, *, low: int, high: int | None = None, default: int = 0) -> int:
    """An environment variable that must be a whole number from low (to high); `default` when it is not set."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {text[:40]!r}; {_ONE_PROCESS}") from None
    if high is not None and not low <= value <= high:
        why = " (0 to WORLD_SIZE - 1)" if name == "RANK" else ""
        raise ConfigError(f"{name} must lie in {low}..{high}{why}, got {value}")
    if value < low:
        raise ConfigError(f"{name} must be at least {low}, got {value}")
    return value


def startup_timeout() -> float:
    """ROOKWORLD_DIST_TIMEOUT in seconds, else STARTUP_TIMEOUT_S."""
    text = os.environ.get(STARTUP_TIMEOUT_VAR)
    if text is None:
        return STARTUP_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"{STARTUP_TIMEOUT_VAR} must be a number of seconds above 0, got {text[:40]!r}")
    return seconds


# -- the start-up ---------------------------------------------------------------------------------------------------

class _Wait:
    """The start-up's one deadline, and the line it says once the wait lasts."""

    def __init__(self, info: DistInfo):
        self.info, self.timeout = info, startup_timeout()
        self.start = time.monotonic()
        self.said = False

    def left(self) -> float:
        return self.timeout - (time.monotonic() - self.start)

    def tick(self, awaited: str) -> None:
        """A pause in the wait for `awaited` (what is missing, in words)."""
        if not self.said and time.monotonic() - self.start >= NOTICE_AFTER_S:
            self.said = True
            print(f"rookworld: rank {self.info.rank} of {self.info.world}: waiting for {awaited} at {_address()} "
                  f"(up to {self.timeout:g} s, {STARTUP_TIMEOUT_VAR} sets it)", file=sys.stderr, flush=True)
        time.sleep(_POLL_S)


def rendezvous(info: DistInfo) -> dist.Store:
    """The store every rank meets in, once all `info.world` ranks are in it; DistributedError naming the missing
    ranks when they are not, within the start-up timeout. torch's own rendezvous would wait for half an hour (the
    gloo default) or the collectives' two hours, silently."""
    host, port = os.environ["MASTER_ADDR"].strip(), int(os.environ["MASTER_PORT"])
    wait = _Wait(info)
    # Under torchrun the agent serves the store and every rank is its client; alone, rank 0 serves it.
    serves = info.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    _check_address(host, serves)
    if serves:
        try:
            store = dist.TCPStore(host, port, info.world, True, timeout=timedelta(seconds=wait.timeout),
                                  wait_for_workers=False)
        except dist.DistError as e:
            raise ConfigError(f"rank 0 cannot serve the ranks at {host}:{port}: {reason(e)}; choose another "
                              f"MASTER_PORT, or as MASTER_ADDR an address of this machine") from None
    else:
        _reachable(info, host, port, wait)
        try:
            store = dist.TCPStore(host, port, info.world, False, timeout=timedelta(seconds=max(1.0, wait.left())))
        except dist.DistError as e:
            raise DistributedError(f"rank {info.rank}: cannot join the ranks at {host}:{port}: {reason(e)}") from None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"/rookworld/attempt_{attempt}/", store)
    _all_joined(info, store, wait)
    return store


def _check_address(host: str, serves: bool) -> None:
    """MASTER_ADDR is an address, and one of this machine's where rank 0 serves the store: the store's own client
    would retry a name it cannot resolve, or an address nobody can listen at, for the whole timeout."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"MASTER_ADDR {host[:60]!r} is no address this machine can find "
                          f"({getattr(e, 'strerror', None) or e})") from None
    if serves:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))
        except OSError:
            raise ConfigError(f"rank 0 serves the ranks at MASTER_ADDR {host[:60]}, which is no address of this "
                              f"machine: give one of its own (127.0.0.1 when every rank runs here)") from None


def _reachable(info: DistInfo, host: str, port: int, wait: _Wait) -> None:
    """Waits until rank 0 (or torchrun's agent) listens at host:port. Probed with plain connections: the store's
    own client logs a C++ stack trace on stderr at each of its retries."""
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(1.0, wait.left()))).close()
            return
        except OSError:
            if wait.left() <= 0:
                raise DistributedError(f"rank {info.rank}: nothing listens at {host}:{port} after {wait.timeout:g} s: "
                                       f"rank 0 did not start, or MASTER_ADDR and MASTER_PORT are not its") from None
            wait.tick("rank 0")


def _all_joined(info: DistInfo, store: dist.Store, wait: _Wait) -> None:
    """Each rank marks itself in the store, then waits until every rank has: by polling, which names the missing
    ones (a timed-out `store.wait` says nothing of which, and logs a C++ warning)."""
    store.set(f"joined/{info.rank}", "1")

    def missing() -> list[int]:
        return [r for r in range(info.world) if not store.check([f"joined/{r}"])]

    while absent := missing():
        if wait.left() <= 0:
            raise DistributedError(f"rank {info.rank}: {name_ranks(absent)} of {info.world} did not join at "
                                   f"{_address()} within {wait.timeout:g} s ({STARTUP_TIMEOUT_VAR} sets how long)")
        wait.tick(name_ranks(absent))


def name_ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _address() -> str:
    return f"{os.environ['MASTER_ADDR'].strip()}:{os.environ['MASTER_PORT'].strip()}"


# -- a rank lost ----------------------------------------------------------------------------------------------------

#: gloo's and NCCL's words for a peer that went away or stopped answering; torch raises them as plain RuntimeErrors.
_LOST = re.compile(r"gloo|nccl|c10d|connection (reset|closed|refused)|broken pipe|timed out", re.I)


def lost_rank(error: BaseException, step: int) -> DistributedError | None:
    """A collective's failure in a run of several ranks, said in one line; None for any other error."""
    if not (dist.is_available() and dist.is_initialized()) or not isinstance(error, RuntimeError):
        return None
    if not (isinstance(error, dist.DistError) or _LOST.search(str(error))):
        return None
    return DistributedError(f"rank {dist.get_rank()} lost contact with the other ranks after step {step} "
                            f"({reason(error)}): a rank died, was stopped, or its machine is out of reach")


def reason(error: BaseException) -> str:
    """torch's or gloo's message without the source location before it and the advice after it."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". This is typically")[0][:200]


def rerun(command_line: str) -> str:
    """How `command_line` ("rookworld ...") is run again on every rank: under torchrun, its command."""
    world = int(os.environ["WORLD_SIZE"])
    if "TORCHELASTIC_RUN_ID" in os.environ:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        nodes = " on every node" if per_node < world else ""
        return f"torchrun --nproc-per-node {per_node} -m {command_line}{nodes}"
    return f"{command_line} on each of the {world} ranks (RANK 0 to {world - 1})"


class Comm:
    """Reductions over every rank, in float64; one process is a world of one."""

    def __init__(self, info: DistInfo, device: torch.device):
        self.info, self.device = info, device

    def sum(self, values: list[float]) -> list[float]:
        return self._all_reduce(values, dist.ReduceOp.SUM)

    def mean(self, values: list[float]) -> list[float]:
        return [v / self.info.world for v in self.sum(values)]

    def max(self, values: list[float]) -> list[float]:
        return self._all_reduce(values, dist.ReduceOp.MAX)

    def any(self, flag: bool) -> bool:
        return self.sum([1.0 if flag else 0.0])[0] > 0

    def which(self, flag: bool) -> list[int]:
        """The ranks where `flag` holds, known to every rank."""
        mine = [float(flag and r == self.info.rank) for r in range(self.info.world)]
        return [r for r, n in enumerate(self.sum(mine)) if n]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` (same shape on every rank), concatenated in rank order."""
        if not self.info.enabled:
            return x
        parts = [torch.empty_like(x) for _ in range(self.info.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    def moments(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
        """(count, mean, population variance) of x where mask holds, over every rank."""
        v = x[mask.bool()].double()
        n, s, ss = self.sum([float(v.numel()), float(v.sum()), float((v * v).sum())])
        if n == 0:
            return 0.0, 0.0, 0.0
        mean = s / n
        return n, mean, max(ss / n - mean * mean, 0.0)

    def _all_reduce(self, values: list[float], op) -> list[float]:
        if not self.info.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def barrier(self) -> None:
        if self.info.enabled:
            dist.barrier()

    def close(self) -> None:
        """The process group destroyed. Every DDP wrapper must be let go first (`unwrapped`): a wrapper's reducer
        that outlives the group drops the group's last reference while holding the GIL, and the group's
        destructor joins the backend's threads, one of which may be waiting for the GIL to free a collective's
        tensors: a rank hung at exit (torch 2.8 to 2.11). Through its Python handle, the group's destructor
        releases the GIL."""
        if self.info.enabled and dist.is_initialized():
            dist.destroy_process_group()


def data_parallel(module: nn.Module, device: torch.device, ranks: bool) -> nn.Module:
    """`module` wrapped in DDP when the run has ranks (`ranks`), which then averages its gradients; else itself."""
    if not ranks:
        return module
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None)


def accumulating(module: nn.Module, last: bool):
    """The context of a micro-batch's backward: gradients add up locally (DDP's no_sync) until the `last` micro-batch
    of an optimizer step, whose backward averages them over the ranks."""
    return module.no_sync() if isinstance(module, DDP) and not last else contextlib.nullcontext()


def unwrapped(module: nn.Module) -> nn.Module:
    """The module a DDP wrapper trains, or `module` itself where it has none."""
    return module.module if isinstance(module, DDP) else module
