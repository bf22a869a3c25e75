"""Data parallelism under torchrun: which rank this is, and reductions over ranks that are no-ops alone."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


#: How long a rank waits in a collective before the run is ended. The other ranks wait in a barrier while rank 0
#: runs the held-out evaluation, which with games against Stockfish or a large --eval-size outlasts the defaults
#: (10 minutes for NCCL, 30 for gloo); a rank that really died still ends the run, in at most this long.
COLLECTIVE_TIMEOUT = timedelta(hours=2)


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
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; start the process group (NCCL on CUDA, gloo on CPU)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistInfo()
    world = int(os.environ["WORLD_SIZE"])
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", 0)),
                    int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if world > 1 and not dist.is_initialized():
        if device_kind == "cuda":
            torch.cuda.set_device(info.local_rank)
            # Bound to its GPU (torch >= 2.3), NCCL never guesses a rank's device, as a barrier otherwise does.
            dist.init_process_group(backend="nccl", timeout=COLLECTIVE_TIMEOUT,
                                    device_id=torch.device("cuda", info.local_rank))
        else:
            dist.init_process_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    return info


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
        if self.info.enabled and dist.is_initialized():
            dist.destroy_process_group()
