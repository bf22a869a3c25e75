"""One step under torch.profiler, summed up: where its time goes.

On a GPU: the CUDA kernels that take the most time, each with its share of the step's wall time and the phase
that launched it (the trainer's `rookworld.<phase>` ranges: generate, reward, reference, update); each phase's
kernel time, launches and share; the share of the step the GPU ran no kernel; the host-device syncs by phase;
memory at its peak. On the CPU, the same from torch's operators (their own time, children excluded), so that
the code that reads a GPU's profile is rehearsed where there is none.

The profiled step is one more step after the measured ones: the profiler's own cost is in it, not in the
figures the bench reports.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

#: The phase ranges the trainer opens (`collect_rollout`, `Trainer.step_with`).
PREFIX = "rookworld."
#: What waits for the device: the runtime's synchronising calls, and a device value read on the host (`.item()`,
#: `bool(t)`, `nonzero`'s size), which waits for the queue to drain before it returns.
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::_local_scalar_dense",
         "aten::nonzero")
#: How long a kernel's name may be in the table (CUTLASS's run to hundreds of characters).
NAME_WIDTH = 96


def phase_of(event) -> str:
    """The `rookworld.<phase>` range an event ran in, innermost first; "other" outside them all."""
    e = event
    while e is not None:
        if e.name.startswith(PREFIX):
            return e.name[len(PREFIX):]
        e = e.cpu_parent
    return "other"


def profile_step(step: Callable[[], dict[str, Any]], device: torch.device, top: int = 30) -> dict[str, Any]:
    """`step()` (one training step, returning its metrics) under the profiler, and `summarize`'s account of it."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        metrics = step()
        if cuda:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    summary = summarize(prof.events(), wall, cuda, top)
    summary["peak_memory_gb"] = metrics.get("peak_memory_gb")
    summary["phase_wall_s"] = {k: metrics[f"time/{k}"] for k in ("generate", "reward", "reference", "update")
                               if f"time/{k}" in metrics}
    summary["summing_s"] = time.perf_counter() - t1
    return summary


def summarize(events, wall: float, cuda: bool, top: int = 30) -> dict[str, Any]:
    """The profile's account: `top` rows of (name, phase) by time, each phase's time, launches and share, the
    syncs by phase. Times from the kernels on a GPU; from each operator's own CPU time elsewhere."""
    by_row: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])  # us, calls
    phases: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    syncs: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in events:
        if e.name in SYNCS:
            syncs[phase_of(e)][e.name] += 1
        if cuda:
            timed = [(k.name, k.duration) for k in e.kernels]
        elif e.name.startswith("aten::") and e.self_cpu_time_total > 0:
            timed = [(e.name, e.self_cpu_time_total)]
        else:
            timed = []
        if not timed:
            continue
        phase = phase_of(e)
        for name, us in timed:
            row = by_row[(name, phase)]
            row[0] += us
            row[1] += 1
            phases[phase][0] += us
            phases[phase][1] += 1
    if cuda:  # a kernel no operator claims (the profiler could not link it) is counted, under no phase
        linked = sum(us for us, _ in phases.values())
        every = sum(e.time_range.elapsed_us() for e in events if e.device_type == DeviceType.CUDA)
        if every > linked:
            phases["unlinked"][0] += every - linked
    busy = sum(us for us, _ in phases.values()) / 1e6
    rows = sorted(by_row.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "device": "cuda" if cuda else "cpu",
        "timed": "kernels" if cuda else "operators' own CPU time",
        "wall_s": wall,
        "busy_s": busy,
        # The GPU runs one stream here: the share of the step it ran no kernel (overlap would make it negative).
        "idle_share": (1 - busy / wall) if cuda and wall > 0 else None,
        "phases": {p: {"seconds": us / 1e6, "launches": n, "share": us / 1e6 / wall}
                   for p, (us, n) in sorted(phases.items(), key=lambda kv: -kv[1][0])},
        "top": [{"name": name[:300], "phase": phase, "calls": n, "ms": us / 1e3, "share": us / 1e6 / wall}
                for (name, phase), (us, n) in rows],
        "syncs": {p: dict(counts) for p, counts in syncs.items()},
        "syncs_total": sum(sum(c.values()) for c in syncs.values()),
    }


def table(summary: dict[str, Any]) -> str:
    """The account as lines to print."""
    s = summary
    idle = "" if s["idle_share"] is None else f", the GPU idle {100 * s['idle_share']:.0f}% of it"
    lines = [f"profile of one step ({s['timed']}): {s['wall_s']:.2f} s, {s['busy_s']:.2f} s timed{idle}; "
             f"peak memory {s['peak_memory_gb'] or 0:.2f} GB"]
    lines.append("  phase       seconds  share  launches   wall (s)")
    for phase, p in s["phases"].items():
        lines.append(f"  {phase:<10}{p['seconds']:>8.3f}{100 * p['share']:>6.1f}%{p['launches']:>10,}"
                     f"{s['phase_wall_s'].get(phase, float('nan')):>11.3f}")
    lines.append(f"  syncs: {s['syncs_total']} (" + "; ".join(
        f"{phase}: " + ", ".join(f"{name} {n}" for name, n in counts.items())
        for phase, counts in s["syncs"].items()) + ")")
    lines.append(f"  {'ms':>9}  {'share':>6}  {'calls':>6}  {'phase':<10} name")
    for r in s["top"]:
        name = r["name"] if len(r["name"]) <= NAME_WIDTH else r["name"][:NAME_WIDTH - 3] + "..."
        lines.append(f"  {r['ms']:>9.2f}  {100 * r['share']:>5.1f}%  {r['calls']:>6,}  {r['phase']:<10} {name}")
    return "\n".join(lines)
