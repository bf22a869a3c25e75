"""Data parallelism under torchrun: which rank this is, and reductions over ranks that are no-ops alone."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
        backend = "nccl" if device_kind == "cuda" else "gloo"
        if device_kind == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    return info


class Comm:
    """Reductions over every rank, in float64; one process is a world of one."""

    def __init__(self, info: DistInfo, device: torch.device):
        self.info, self.device = info, device

    def sum(self, values: list[float]) -> list[float]:
        if not self.info.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def mean(self, values: list[float]) -> list[float]:
        return [v / self.info.world for v in self.sum(values)]

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

    def barrier(self) -> None:
        if self.info.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.info.enabled and dist.is_initialized():
            dist.destroy_process_group()
