"""The device a model runs on, from the --device setting."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource

import torch

from rookworld.settings.config import ConfigError


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """cpu, cuda, cuda:N or auto (CUDA when available; under torchrun, the local rank's GPU). A CUDA device on a
    machine without one is a ConfigError, said in one line."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}: use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: CUDA is not available here (torch {torch.__version__}); "
                              "use --device cpu")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def peak_memory_gb(device: torch.device) -> float:
    """The most memory this process has held on `device`: allocated CUDA memory, or the CPU process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Makes glibc's malloc keep freed memory for reuse: blocks under 32 MiB (the most glibc allows) come from the
    heap, whose free top is handed back to the kernel only past 1 GiB. By default the heap is trimmed as soon as
    twice the largest block freed so far lies free at its top, so a pass that frees a few 25 MB chunks of logits
    at once gives their pages back, and the next chunks fault them in and zero them again: 198,000 faults in one
    update's vocabulary pass for GPT-2 small (2,048 positions), none with this. The process keeps up to 1 GiB it
    no longer uses, as PyTorch's CUDA caching allocator keeps GPU memory. False (nothing changed) where malloc is
    not glibc's."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # no C library by that name, or no mallopt in it: not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))
