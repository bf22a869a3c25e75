"""The device a model runs on, from the --device setting, and what it can do (memory, its bf16 peak, whether a CPU
multiplies bf16 in hardware)."""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import resource
import sys

import torch

from rookworld.io.quote import quoted
from rookworld.settings.config import ConfigError


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """cpu, cuda, cuda:N or auto (CUDA when available; under torchrun, the local rank's GPU). A CUDA device on a
    machine without one is a ConfigError, said in one line."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {quoted(name)}: use cpu, cuda, cuda:N or auto") from None
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


#: The x86 CPU flags (as Linux's /proc/cpuinfo lists them) of bf16 matrix hardware: AMX's tiles (Sapphire Rapids
#: on) and AVX-512 BF16's dot products (Cooper Lake, Zen 4 on), which oneDNN's bf16 products use. Not
#: `torch.ops.mkldnn._is_mkldnn_bf16_supported()`: it also says yes on AVX-512 CPUs without either, where bf16 is
#: emulated (converted to float32 and back) and slower than float32.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_bf16_flag(cpuinfo: str) -> str | None:
    """The first of `BF16_FLAGS` that every processor of `cpuinfo` (the text of Linux's /proc/cpuinfo) lists in its
    "flags" line, or None (None too for text without a flags line, as an ARM machine's or another format)."""
    flags = [set(line.partition(":")[2].split()) for line in cpuinfo.splitlines()
             if line.partition(":")[0].strip() == "flags"]
    return next((f for f in BF16_FLAGS if flags and all(f in cpu for cpu in flags)), None)


def cpu_bf16() -> str | None:
    """This machine's CPU flag of bf16 matrix hardware (`cpu_bf16_flag` of /proc/cpuinfo), or None: none of them,
    another OS than Linux, /proc/cpuinfo unreadable, or a torch without oneDNN (whose products would not use it).
    `--dtype auto` takes bf16 autocast on the CPU where this is not None."""
    if not sys.platform.startswith("linux") or not torch.backends.mkldnn.is_available():
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return cpu_bf16_flag(f.read())
    except OSError:
        return None


# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Makes glibc's malloc keep freed memory for reuse: blocks under 32 MiB (the most glibc allows) come from the
    heap, whose free top is handed back to the kernel only past 1 GiB. By default the heap is trimmed as soon as
    twice the largest block freed so far lies free at its top, so a pass that frees a few 25 MB chunks of logits
    at once gives their pages back, and the next chunks fault them in and zero them again (BENCHMARKS.md counts
    the faults; none with this). The process keeps up to 1 GiB it
    no longer uses, as PyTorch's CUDA caching allocator keeps GPU memory. False (nothing changed) where malloc is
    not glibc's."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # no C library by that name, or no mallopt in it: not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


#: Dense bf16 tensor-core peaks (TFLOP/s, fp32 accumulate, no 2:4 sparsity) by a pattern of
#: torch.cuda.get_device_name's answer, first match wins: the denominator of model FLOP utilisation. NVIDIA's
#: datasheets (H100, H200, A100, A10, L4, L40, L40S) quote bf16 with sparsity, twice the dense figure given here;
#: the GeForce cards' figures are the "Peak BF16 Tensor TFLOPS with FP32 Accumulate" of the Ada (RTX 4090) and
#: Ampere GA102 (RTX 3090) whitepapers, half their fp16-accumulate rate. Names are anchored so that a smaller
#: sibling (A10G, RTX 4090 D, a laptop part) finds no peak rather than a wrong one.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100 NVL\b", 835.0),
    (r"\bH100 PCIe\b", 756.0),
    (r"\bH100\b", 989.4),  # SXM5: "NVIDIA H100 80GB HBM3"
    (r"\bGH200\b", 989.4),
    (r"\bH200 NVL\b", 835.0),
    (r"\bH200\b", 989.4),
    (r"\bA100\b", 312.0),
    (r"\bA10$", 125.0),
    (r"\bL4$", 121.0),
    (r"\bL40S$", 362.05),
    (r"\bL40$", 181.05),
    (r"\bRTX 4090$", 165.2),
    (r"\bRTX 3090$", 71.0),
)


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of the card `torch.cuda.get_device_name` calls `device_name`, or None for a card not in
    `PEAK_TFLOPS` or a MIG slice (a share of the card's units): MFU is then left out rather than wrong."""
    if "MIG" in device_name:
        return None
    name = device_name.strip()
    return next((peak for pattern, peak in PEAK_TFLOPS if re.search(pattern, name)), None)
