"""Memory: a model is measured before it is built, so that sizes too large for the machine are one line (a
`NotEnoughMemory`), not a process that grows until the kernel kills it (or the whole machine swaps)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rookworld.net.device import resolve_device
from rookworld.net.model import GPT, GPTConfig
from rookworld.settings.base import ConfigError


#: Bytes a parameter takes to train: its float32 weight and gradient and AdamW's two float32 moments.
TRAINING_BYTES = 16


class NotEnoughMemory(ConfigError):
    """A model too large for the memory free on the device it would be built on."""


def check_memory(config: GPTConfig, device: torch.device | str, *, what: str, instead: str,
                 training: bool = False, dtype: torch.dtype = torch.float32) -> None:
    """Raises NotEnoughMemory, naming the sizes and the bytes needed and free, when a GPT of `config` does not fit
    `device` (its weights in `dtype`; to be trained, `TRAINING_BYTES` a parameter). `what` names the model and
    `instead` says what to do. Activations come on top: a model that passes may still not train at any batch."""
    device = resolve_device(str(device))
    per_param = TRAINING_BYTES if training else dtype.itemsize
    needed, free = config.n_params * per_param, available_memory(device)
    if free is None or needed <= free:
        return
    kind = ("weights, gradients and AdamW's moments in float32" if training
            else f"weights in {str(dtype).removeprefix('torch.')}")
    raise NotEnoughMemory(f"{what} ({config.describe()}) needs {_gb(needed)} on {device} to "
                          f"{'train' if training else 'load'} ({kind}) and {_gb(free)} is free there: {instead}")


def fresh_gpt(config: GPTConfig, device: torch.device | str) -> GPT:
    """A new GPT of `config` (built on the CPU) to be trained on `device`: refused, before anything is allocated,
    when training it would not fit there."""
    check_memory(config, device, training=True, what="a fresh GPT-2",
                 instead="choose a smaller --init, --n-layer or --n-embd")
    return GPT(config)


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def available_memory(device: torch.device) -> int | None:
    """Bytes a new allocation can take on `device`: a CUDA device's free memory, the CPU's available memory (what
    the kernel can give without swapping, within this process's cgroup limit); None where it cannot be known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    free = [n for n in (_mem_available(), _cgroup_room()) if n is not None]
    return min(free) if free else None


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # another Unix: free pages, which leaves out the page cache the kernel would hand back
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


#: A container's memory limit and use: cgroup v2's files, then v1's.
_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def _cgroup_room() -> int | None:
    """What this process's cgroup may still take, where it is limited: MemAvailable is the whole machine's."""
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # unlimited (v1 writes a page-rounded 2^63)
            return None
        return max(int(limit) - int(usage), 0)
    return None
