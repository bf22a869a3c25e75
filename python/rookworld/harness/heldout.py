"""held-out.jsonl: a run's outcome for each held-out position at each evaluation (a character a position, 1 where
the figure counts it), and the closing line it makes: what changed between two evaluations, position by position,
beside the noise of that measurement."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rookworld.harness.rundir import metric_rows

#: The file, in the run directory.
HELD_OUT_FILE = "held-out.jsonl"


def paired_change(before: Any, after: Any) -> tuple[float, float, int] | None:
    """The mean change of a 0/1 outcome per position from `before` to `after` (strings of 0s and 1s, one a
    position, as held-out.jsonl keeps them), twice its standard error (over the positions' own changes: the
    positions are the same, so what every position does alike cancels), and the positions; None unless both are
    such strings, of one length and at least two positions."""
    if not (isinstance(before, str) and isinstance(after, str)) or len(before) != len(after) or len(before) < 2 \
            or not set(before + after) <= {"0", "1"}:
        return None
    n = len(before)
    d = [int(b) - int(a) for a, b in zip(before, after)]
    mean = sum(d) / n
    variance = (sum(x * x for x in d) - n * mean * mean) / (n - 1)
    return mean, 2 * math.sqrt(max(variance, 0.0) / n), n


def change_line(path: Path, first: int, last: int, figures: dict[str, list[tuple[str, str]]]) -> str | None:
    """The closing line of what changed in each of `figures` (task -> (key, label)) between the evaluations at
    steps `first` and `last`, or None without both in the file at `path`."""
    try:
        rows = {row.get("step"): row for row in metric_rows(path)}
    except OSError:
        return None
    if first not in rows or last not in rows:
        return None
    parts, n = [], 0
    for task, shown in figures.items():
        changes = []
        for key, label in shown:
            if got := paired_change(rows[first].get(f"{task}/{key}"), rows[last].get(f"{task}/{key}")):
                mean, noise, n = got
                changes.append(f"{label} {100 * mean:+.1f} ± {100 * noise:.1f}" if noise else
                               f"{label} {100 * mean:+.1f} (no position changed)")
        if changes:
            parts.append(f"{task}: {', '.join(changes)}")
    if not parts:
        return None
    return (f"change from step {first} to {last}, in points, on the same {n} positions (± two standard errors: "
            f"a change within it can be chance) | " + " | ".join(parts))
