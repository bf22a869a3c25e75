"""What a training run may change for the whole process, beyond its own objects: torch's seed and thread count,
TF32 for float32 products on CUDA, and glibc's malloc keeping freed memory. `rookworld train` and `rookworld sft`
ask for all of it; a run made from Python changes none of it unless asked (``process_settings=True``), so that a
library user's own settings stand. The run's header says what was changed."""

from __future__ import annotations

import os

import torch

from rookworld.harness.distributed import DistInfo
from rookworld.net.device import keep_freed_memory


def cores_of(dist: DistInfo) -> int:
    """This rank's share of the machine's cores."""
    return max(1, (os.cpu_count() or 1) // dist.local_world)


def settle_process(device: torch.device, dist: DistInfo, seed: int) -> list[str]:
    """The process settings a training run wants, applied; what changed, in words.

    On the CPU, torch takes every core of this rank's share for every phase (an explicit OMP_NUM_THREADS is obeyed).
    Nothing else computes while it does: Stockfish analyses while torch waits, so no core is kept for it; kept, it
    idled through generation and the update. Freed memory is kept for reuse (`keep_freed_memory`). On CUDA, TF32
    takes the float32 products (fp32 runs, the optimizer's). torch's seed: nothing of a step draws from torch's
    global generator (sampling and the update's shuffle have their own), but a user's reward function may, and a
    resumed run then restores the generators it saved."""
    changed = [f"torch's seed {seed}"]
    torch.manual_seed(seed)
    if device.type == "cpu":
        if keep_freed_memory():
            changed.append("malloc keeps freed memory")
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(cores_of(dist))
            changed.append(f"{torch.get_num_threads()} threads")
    elif device.type == "cuda":
        # The API every torch since 1.12 has, which newer ones map to their own fp32_precision settings.
        torch.set_float32_matmul_precision("high")
        changed.append("TF32 for float32 products")
    return changed
