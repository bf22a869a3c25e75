"""torch.compile with a way out, shared by decoding, the sampler's draw and the log-prob passes.

A compiler failure (no C++ toolchain, an inductor or Triton bug, a compile-time out-of-memory, more shapes than
dynamo's recompile limit) costs speed, never the run: the function that failed warns once and runs eagerly on
that device type from then on; every other compiled function stays compiled.
"""

from __future__ import annotations

import os
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
import torch._inductor.config
from torch.utils.checkpoint import checkpoint

from rookworld.net import compile_log


class Fallbacks:
    """The process's record of the compiled functions that failed to compile, and why: each runs eagerly on that
    device type from then on. One record for every `Compiled` function, since a run's metrics count them all."""

    def __init__(self):
        self._why: dict[tuple[str, str], str] = {}

    def record(self, fn: Callable, device_type: str, why: str) -> None:
        self._why[(device_type, name(fn))] = why

    def why(self, fn: Callable, device_type: str) -> str | None:
        """Why compiling `fn` (the eager function) failed on `device_type`; None if it has not."""
        return self._why.get((device_type, name(fn)))

    def __len__(self) -> int:
        return len(self._why)

    def __repr__(self) -> str:
        return f"Fallbacks({self._why!r})"


#: Process-wide, as what it records is: a `Compiled` function and dynamo's caches live as long as the process, so a
#: function that failed to compile runs eagerly for every later caller, and a run's metrics count them all.
FALLBACKS = Fallbacks()

#: What the warning says of a function whose compilation failed: a run's log is checked for it.
FELL_BACK = "runs without compiling from now on"

#: Entries a compiled function may hold: decoding compiles one for each (batch, cache length) it meets, so
#: evaluation and --auto-batch add shapes to training's; dynamo's default is 8.
RECOMPILE_LIMIT = 64

# Past the recompile limit, fullgraph=True raises this, which is not a TorchDynamoException (older torch: Cache).
_LIMIT_ERRORS = tuple(getattr(torch._dynamo.exc, name) for name in ("FailOnRecompileLimitHit", "FailOnCacheLimitHit")
                      if hasattr(torch._dynamo.exc, name))
_COMPILE_ERRORS = (torch._dynamo.exc.TorchDynamoException, *_LIMIT_ERRORS)


#: Inductor settings for the functions that meet new shapes (compiled with dynamic shapes after the first): torch
#: 2.11's coalescing analysis, which only chooses a tiling, asserts on some of their graphs (the log-prob trunk
#: with each prompt computed once, on an H100: tiling_utils.py:271). Without it a tile shape is chosen the plain
#: way; results are the same.
DYNAMIC_OPTIONS = ({"triton.coalesce_tiling_analysis": False}
                   if hasattr(torch._inductor.config.triton, "coalesce_tiling_analysis") else {})


def name(fn: Callable) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def has_failed(fn: Callable, device_type: str) -> bool:
    """Whether compiling `fn` (the eager function) failed on `device_type` in this process."""
    return FALLBACKS.why(fn, device_type) is not None


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process, every function and shape together."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def maybe_compiled(fn: Callable, compiled: dict[str, Callable], device_type: str, compile: bool,
                   **options: Any) -> Callable:
    """fn compiled (fullgraph, with `options`) for `device_type` and kept in `compiled`, or fn itself when not
    compiling or when compiling it has failed on that device type before."""
    if not compile or has_failed(fn, device_type):
        return fn
    if device_type not in compiled:
        _raise_recompile_limit()
        if options.get("dynamic") is not False and DYNAMIC_OPTIONS:
            # torch.compile takes a mode or options, not both: a mode is given as the options it stands for.
            mode = options.pop("mode", None)
            chosen = torch._inductor.list_mode_options(mode, options.get("dynamic")) if mode else {}
            options = {**options, "options": {**chosen, **DYNAMIC_OPTIONS}}
        compiled[device_type] = torch.compile(fn, fullgraph=True, **options)
    return compiled[device_type]


def run_or_fall_back(fn: Callable, eager: Callable, device_type: str, *args: Any, checkpointed: bool = False):
    """fn(*args) (through activation checkpointing if `checkpointed`); if fn is a compiled function whose
    compilation fails, eager(*args) after a warning. Returns the result and the function to use from then on.
    Compilation fails before anything runs, so nothing is done twice."""
    run = lambda f: checkpoint(f, *args, use_reentrant=False) if checkpointed else f(*args)  # noqa: E731
    if fn is eager:
        return run(fn), fn
    # A view's base is guarded on (its size, its rank): an input that is a slice one call and a whole tensor the
    # next (the last chunk, a row block, a token unsqueezed from another shape) would compile again. Detached, such
    # an input is a tensor of its own over the same memory; no gradient flows through one that does not need it.
    args = tuple(a.detach() if isinstance(a, torch.Tensor) and a._is_view() and not a.requires_grad else a
                 for a in args)
    try:
        with compile_log.calling(eager, args):
            return run(fn), fn
    except _COMPILE_ERRORS as error:
        _give_up(eager, device_type, error)
        return run(eager), eager


class Compiled:
    """`fn` and its compiled versions, one a device type, made on first use (`maybe_compiled`) and kept by this
    object: the caller holds one such object a function, not a cache of its own."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.by_device: dict[str, Callable] = {}

    def pick(self, device_type: str, compile: bool, **options: Any) -> Callable:
        """The function to call on `device_type`: compiled (with `options`, the first time) when `compile` and it
        has not failed there, else `fn`."""
        return maybe_compiled(self.fn, self.by_device, device_type, compile, **options)

    def __call__(self, device_type: str, compile: bool, *args: Any, checkpointed: bool = False, **options: Any):
        """fn(*args), compiled where `pick` says, eager after a compiler failure (`run_or_fall_back`)."""
        if not compile:
            return checkpoint(self.fn, *args, use_reentrant=False) if checkpointed else self.fn(*args)
        fn = self.pick(device_type, compile, **options)
        return run_or_fall_back(fn, self.fn, device_type, *args, checkpointed=checkpointed)[0]


def _raise_recompile_limit() -> None:
    for setting in ("recompile_limit", "cache_size_limit"):  # the older torch's name for it
        if hasattr(torch._dynamo.config, setting):
            setattr(torch._dynamo.config, setting, max(RECOMPILE_LIMIT, getattr(torch._dynamo.config, setting)))


def _raised_at(error: BaseException) -> str:
    """' at FILE:LINE' of the frame that raised `error`, its path from the package on: a bare AssertionError deep
    in the compiler says nothing without it."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    path = frames[-1].filename.replace(os.sep, "/")
    return f" at {path.split('site-packages/')[-1]}:{frames[-1].lineno}"


def _give_up(eager: Callable, device_type: str, error: Exception) -> None:
    cause = getattr(error, "inner_exception", None) or error.__cause__ or error  # the backend's own error
    first_line = (str(cause).strip().splitlines() or [""])[0][:300]
    why = f"{type(cause).__name__}: {first_line}{_raised_at(cause)}"
    FALLBACKS.record(eager, device_type, why)
    warnings.warn(f"torch.compile of {eager.__qualname__} failed on {device_type} ({why}); it {FELL_BACK}, which "
                  "is slower. --no-compile skips the attempt.", RuntimeWarning, stacklevel=4)
