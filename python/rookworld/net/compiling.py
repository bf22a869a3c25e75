"""torch.compile with a way out, shared by decoding, the sampler's draw and the log-prob pass.

A compiler failure (no C++ toolchain, an inductor or Triton bug) costs speed, never the run: the first failure on
a device type warns once, and from then on everything on that device type runs eagerly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

#: Device types on which compiling failed once, and why: they run eagerly for the rest of the process.
failed: dict[str, str] = {}


def maybe_compiled(fn: Callable, compiled: dict[str, Callable], device_type: str, compile: bool,
                   **options: Any) -> Callable:
    """fn compiled (fullgraph, with `options`) for `device_type` and kept in `compiled`, or fn itself when not
    compiling or when compiling has failed on that device type before."""
    if not compile or device_type in failed:
        return fn
    if device_type not in compiled:
        compiled[device_type] = torch.compile(fn, fullgraph=True, **options)
    return compiled[device_type]


def run_or_fall_back(fn: Callable, eager: Callable, device_type: str, *args: Any, checkpointed: bool = False):
    """fn(*args) (through activation checkpointing if `checkpointed`); if fn is a compiled function whose
    compilation fails, eager(*args) after a warning. Returns the result and the function to use from then on.
    Compilation fails before anything runs, so nothing is done twice."""
    run = lambda f: checkpoint(f, *args, use_reentrant=False) if checkpointed else f(*args)  # noqa: E731
    if fn is eager:
        return run(fn), fn
    try:
        return run(fn), fn
    except torch._dynamo.exc.TorchDynamoException as error:
        _give_up(device_type, error)
        return run(eager), eager


def _give_up(device_type: str, error: Exception) -> None:
    cause = getattr(error, "inner_exception", None) or error.__cause__ or error  # the backend's own error
    first_line = (str(cause).strip().splitlines() or [""])[0][:300]
    failed[device_type] = f"{type(cause).__name__}: {first_line}"
    warnings.warn(f"torch.compile failed on {device_type} ({failed[device_type]}); sampling and log-prob passes "
                  "run without it from now on, which is slower. --no-compile skips the attempt.",
                  RuntimeWarning, stacklevel=4)
