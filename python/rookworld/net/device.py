"""The device a model runs on, from the --device setting."""

from __future__ import annotations

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
