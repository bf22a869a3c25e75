"""What torch.compile compiled, told where a user sees it: each graph announced as dynamo begins it (a first step
that compiles for minutes says why it waits), and the graphs compiled since a point (`CompileLog`): the function,
the seconds, and dynamo's reason for compiling it again, from dynamo's own records."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo

@dataclass(frozen=True)
class Graph:
    """One graph compiled: the function's name (" backward" added for the backward aot_autograd compiled for it),
    the seconds it took, and why dynamo compiled that function again (None for its first graph)."""

    name: str
    seconds: float
    reason: str | None
    backward: bool = False  # aot_autograd's backward of a graph: part of that graph, not one more

    def row(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": round(self.seconds, 2), "reason": self.reason,
                **({"backward": True} if self.backward else {})}


class CompileLog:
    """The graphs compiled in this process since the last `new()`, from dynamo's own records
    (`torch._dynamo.utils.get_compilation_metrics`, which keep the last 64: call `new()` at least every 64 graphs)."""

    def __init__(self):
        self._seen = {_key(m) for m in _records()}
        self._names = {str(m.compile_id): m.co_name for m in _records() if m.co_name}  # a backward has none

    def new(self) -> list[Graph]:
        graphs = []
        for m in _records():
            if _key(m) in self._seen:
                continue
            self._seen.add(_key(m))
            if m.co_name:
                self._names[str(m.compile_id)] = m.co_name
            name = self._names.get(str(m.compile_id), "?")
            backward = getattr(m, "is_forward", None) is False
            if backward:
                name += " backward"
            if m.fail_type:
                name += f" (failed: {m.fail_type})"
            seconds = m.entire_frame_compile_time_s
            if seconds is None:  # a backward compiled lazily: only its span is recorded
                seconds = ((m.end_time_us or 0) - (m.start_time_us or 0)) / 1e6
            # dynamo's reason, its first line: the rest is the user's stack, which the log line has no room for
            reason = (str(getattr(m, "recompile_reason", None) or "").strip().splitlines() or [None])[0]
            graphs.append(Graph(name, float(seconds or 0.0), reason, backward))
        return graphs


def _records() -> list:
    # Runtime records (autotuning, CUDA graph recordings) are not compilations.
    return [m for m in torch._dynamo.utils.get_compilation_metrics() if not getattr(m, "is_runtime", False)]


def _key(m) -> tuple:
    return str(m.compile_id), getattr(m, "is_forward", None), m.start_time_us


def summary(graphs: list[Graph]) -> str:
    """'3 graphs, 41.2 s: decode_step 20.1 s, ...', each recompile's reason in brackets (a backward is listed, and
    timed, but not counted: it belongs to its forward's graph)."""
    parts = [f"{g.name} {g.seconds:.1f} s" + (f" [{g.reason.strip()[:160]}]" if g.reason else "") for g in graphs]
    count, total = sum(not g.backward for g in graphs), sum(g.seconds for g in graphs)
    return f"{count} graph{'s' * (count != 1)}, {total:.1f} s: " + ", ".join(parts)


class _Announcer:
    """What a run says, while it waits, of each graph dynamo begins to compile. One a process (`ANNOUNCER`), as
    dynamo's callbacks are."""

    def __init__(self):
        #: Where it is said (`announce_compiles`); None says nothing.
        self.say: Callable[[str], None] | None = None
        #: What each compiled function is, in words, given the arguments of its call (`describe`).
        self.descriptions: dict[str, Callable[..., str]] = {}
        #: The compiled call under way (its eager function and arguments; `calling`), for the words.
        self.call: tuple[Callable, tuple] | None = None
        #: The words of each graph announced, by compile id: a backward compiled later is announced as its forward's.
        self.announced: dict[str, str] = {}

    def on_compile_start(self, *args: Any) -> None:
        if self.say is None:
            return
        trigger = getattr(args[0], "callback_trigger", None) if args else None
        kind = getattr(trigger, "name", "DYNAMO")
        if kind not in ("DYNAMO", "LAZY_BACKWARD"):
            return
        compile_id = str(getattr(args[0], "compile_id", "")) if args else ""
        if kind == "LAZY_BACKWARD":
            what = "the backward of " + self.announced.get(compile_id, "a graph")
        else:
            what = "a graph"
            if self.call is not None:
                eager, call_args = self.call
                words = self.descriptions.get(f"{eager.__module__}.{eager.__qualname__}")
                what = words(*call_args) if words is not None else eager.__name__
            self.announced[compile_id] = what
        self.say(f"compiling {what} ... (from {time.strftime('%H:%M:%S')})")


#: Process-wide, as dynamo's compile callbacks are: they are registered once a process (at import), not once a run;
#: a run sets `say` for its time (`announce_compiles`) and unsets it after.
ANNOUNCER = _Announcer()


def describe(fn: Callable, words: Callable[..., str]) -> None:
    """Registers what a call of `fn` (the eager function) compiles, in words, from its arguments: "the decode step
    for 1,648 rows x 128 positions"."""
    ANNOUNCER.descriptions[f"{fn.__module__}.{fn.__qualname__}"] = words


@contextlib.contextmanager
def calling(eager: Callable, args: tuple):
    """A compiled call of `eager` with `args` under way (`compiling.run_or_fall_back`): what its graphs are
    announced as."""
    ANNOUNCER.call = (eager, args)
    try:
        yield
    finally:
        ANNOUNCER.call = None


def announce_compiles(say: Callable[[str], None] | None) -> None:
    """From now on, each graph dynamo begins to compile is announced through `say` ("compiling the decode step for
    1,648 rows x 128 positions ..."): a first step that compiles for minutes says why it waits. None: silent."""
    ANNOUNCER.say = say
    handler = getattr(torch._dynamo.callback, "callback_handler", None)
    if handler is not None and ANNOUNCER.on_compile_start not in handler.start_callbacks:
        handler.register_start_callback(ANNOUNCER.on_compile_start)
