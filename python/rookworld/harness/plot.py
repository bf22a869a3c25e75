"""Training curves of one or more runs from their metrics.jsonl, several runs overlaid in one PNG: the training
curves smoothed over their faint raw selves, shares on 0-100%, legends beside the panels, and no curve for a
series that never changes."""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rookworld.harness.checkpoint import JSON_BYTES
from rookworld.io.errors import RookworldError
from rookworld.io.files import Output, no_directory_there, read_json_object
from rookworld.harness.rundir import read_rows
from rookworld.net.sources import CONFIG_FILE

#: A GRPO run's "loss" (near 0, either sign) is drawn apart from SFT's cross-entropy (about 1 to 11).
GRPO_LOSS = "loss (GRPO)"

#: (title, [(metric, label)], whether its metrics are shares): a panel is drawn when some run has one of its
#: metrics that changes. The chess of the held-out positions first: it is what training is for.
PANELS: list[tuple[str, list[tuple[str, str]], bool]] = [
    ("held-out P: best move", [("eval/P/legal_best_move", "legal"), ("eval/P/top5_accuracy", "in top 5"),
                               ("eval/P/best_move_accuracy", "Stockfish's best")], True),
    ("held-out A: next state", [("eval/A/next_state_exact", "exact"), ("eval/A/fen_similarity", "FEN similarity")],
     True),
    ("chess of the GRPO samples", [("legal_best_move/P", "P: legal best move"), ("top5_accuracy/P", "P: in top 5"),
                                   ("next_state_exact/A", "A: next state exact")], True),
    ("reward per task (GRPO samples)", [("reward/P/mean", "P:"), ("reward/A/mean", "A:")], False),
    ("KL to the reference per token", [("kl/mean", "mean"), ("kl/p95", "p95")], False),
    ("SFT loss (cross-entropy per token)", [("loss", "loss")], False),
    ("GRPO loss", [(GRPO_LOSS, "loss")], False),
    ("held-out loss", [("eval/loss", "loss")], False),
    ("held-out mean reward (greedy)", [("eval/P/mean_reward", "P:"), ("eval/A/mean_reward", "A:")], False),
    ("held-out format validity", [("eval/P/format_valid", "P:"), ("eval/A/format_valid", "A:")], True),
    ("clip fraction and groups without spread", [("clip_fraction", "clipped"), ("groups/zero_spread", "no spread")],
     True),
    ("entropy per token", [("entropy", "entropy")], False),
]

#: The y-axis of a share: 0 to 1, with room for a line drawn at either.
RATE_LIMITS = (-0.02, 1.02)

#: A training curve of at least this many points is drawn smoothed over its raw self (faint); evaluations, a few
#: points each, are drawn as they are.
SMOOTH_FROM = 20


class PlotError(RookworldError, ValueError):
    """A run that cannot be read, or no matplotlib."""


def read_metrics(run: str | Path) -> list[dict]:
    path = Path(run) / "metrics.jsonl"
    if (why := no_directory_there(run)) not in (None, "no such directory"):
        raise PlotError(f"{run}: {why}: give a run's --output-dir")
    if not path.is_file():
        raise PlotError(f"{run}: no metrics.jsonl (is it the --output-dir of rookworld train or sft?)")
    try:
        rows, bad = read_rows(path)  # a line cut short by a crash is left out: the rest still plots
    except OSError as e:
        raise PlotError(f"cannot read {path}: {e.strerror or e}") from None
    rows = [r for r in map(plottable, rows) if r is not None]
    if not rows:
        raise PlotError(f"{path}: none of its lines is a JSON object of metrics with a step; is it the metrics.jsonl "
                        f"that rookworld train or sft writes?")
    if any("kl/mean" in r or "reward/mean" in r for r in rows):  # a GRPO run
        rows = [{(GRPO_LOSS if k == "loss" else k): v for k, v in r.items()} for r in rows]
    return rows


def started_from(run: str | Path) -> Path | None:
    """The model a run started from (its checkpoints' --model), resolved; None for a fresh model or no checkpoint."""
    for config in sorted((Path(run) / "checkpoints").glob(f"step-*/{CONFIG_FILE}")):
        try:
            model = read_json_object(config, JSON_BYTES).get("model")
        except (OSError, ValueError):
            continue
        return Path(model).resolve() if isinstance(model, str) else None
    return None


#: The largest step and the largest value drawn: a float64 holds every integer up to 2^53, and matplotlib's axes
#: overflow long before 1e308.
MAX_STEP, MAX_VALUE = 2**31 - 1, 1e30


def plottable(row: dict) -> dict | None:
    """A metrics row as it can be drawn: None without a whole-number step in 0 to `MAX_STEP` (a string, null, a list,
    1e308), and each value that is no finite number within `MAX_VALUE` left out (a 400-digit integer, NaN)."""
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        return None
    return {k: v for k, v in row.items()
            if not isinstance(v, (int, float)) or isinstance(v, bool) or abs(v) <= MAX_VALUE}


def chained_offsets(runs: Sequence[str | Path], data: Sequence[Sequence[dict]]) -> list[int]:
    """Steps to add to each run's: a run that started from another plotted run's model (GRPO from an SFT run)
    follows it on the x-axis, from that run's last step."""
    resolved, parents = [Path(run).resolve() for run in runs], [started_from(run) for run in runs]
    last = {path: max((r["step"] for r in rows if isinstance(r.get("step"), (int, float))), default=0)
            for path, rows in zip(resolved, data)}

    def offset(i: int, seen: frozenset) -> int:
        parent = parents[i]
        if parent not in last or parent in seen:  # a fresh model, one not plotted, or a cycle
            return 0
        return offset(resolved.index(parent), seen | {parent}) + last[parent]

    return [offset(i, frozenset({resolved[i]})) for i in range(len(runs))]


def series(rows: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows
              if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and "step" in r]
    return [s for s, _ in points], [v for _, v in points]


def run_names(runs: Sequence[str | Path]) -> list[str]:
    """The shortest tail of each run's path that tells it from the others: runs overlaid from different parents
    often share their last component (`L7/grpo_seed0`, `L8/grpo_seed0`)."""
    parts = [Path(os.path.abspath(run)).parts for run in runs]  # abspath: a symlinked run keeps its own name

    def name(p: tuple[str, ...]) -> str:
        for n in range(1, len(p) + 1):
            if all(q == p or q[-n:] != p[-n:] for q in parts):
                return "/".join(p[-n:])
        return "/".join(p)

    return [name(p) for p in parts]


def plot_runs(runs: Sequence[str | Path], out: str | Path | Output, title: str | None = None) -> int:
    """Draws every panel some run has data for into the PNG `out`; returns how many. It is written as any output
    (`Output`): a file whole or not at all, a FIFO or a device through."""
    fig, n = figure(runs, title)
    import matplotlib.pyplot as plt

    try:
        with (out if isinstance(out, Output) else Output(str(out))).open("wb") as f:
            fig.savefig(f, dpi=110, format="png")  # format: a name without .png would get one added
    finally:
        plt.close(fig)
    return n


def smoothed(y: Sequence[float]) -> list[float]:
    """An exponential moving average of `y` over about a 15th of its points (3 to 200), bias-corrected as
    TensorBoard's is, so that it starts at the first value rather than at 0."""
    span = min(200, max(3, len(y) // 15))
    alpha, mean, weight, out = 2 / (span + 1), 0.0, 0.0, []
    for v in y:
        mean, weight = (1 - alpha) * mean + alpha * v, (1 - alpha) * weight + alpha
        out.append(mean / weight)
    return out


#: A line style a run, the same in every panel.
STYLES = ["-", "--", ":", "-."]


def constant(data: dict[str, Sequence[dict]], key: str) -> float | None:
    """The one value of `key` in every run, when it has at least two points and never changes; else None."""
    values = {v for rows in data.values() for v in series(rows, key)[1]}
    points = sum(len(series(rows, key)[1]) for rows in data.values())
    return next(iter(values)) if points >= 2 and len(values) == 1 else None


def figure(runs: Sequence[str | Path], title: str | None = None):
    """(the matplotlib figure of every panel some run has data for, how many panels). A series that never changes
    gets no curve (the figure's foot names it and its value), nor a panel of its own."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'rookworld[plot]'") from None
    data = {name: read_metrics(run) for name, run in zip(run_names(runs), runs)}
    shift = dict(zip(data, chained_offsets(runs, list(data.values()))))
    # Each run's whole span of steps (chained runs shifted): a panel spans those of the runs it draws, so a GRPO
    # run's own panels are not squeezed by a longer SFT run beside it, and a one-point evaluation is not zoomed.
    spans = {run: (min(steps) + shift[run], max(steps) + shift[run])
             for run, rows in data.items() if (steps := series(rows, "step")[1])}
    drawn_runs = _Runs(data, shift, spans, plt.rcParams["axes.prop_cycle"].by_key()["color"])
    panels, left_out = _choose_panels(data, runs)
    cols = 2 if len(panels) > 1 else 1
    nrows = -(-len(panels) // cols)
    # Constrained layout leaves room for the suptitle, which tight_layout draws over the top panels, and for the
    # legends outside the panels.
    fig, axes = plt.subplots(nrows, cols, figsize=(7.5 * cols, 3.4 * nrows), squeeze=False, layout="constrained")
    for ax, (panel, keys, rate) in zip(axes.flat, panels):
        drawn, values = _draw_curves(ax, drawn_runs, keys)
        _dress(ax, drawn_runs, (panel, rate), drawn, values)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    if left_out:
        fig.supxlabel(textwrap.fill("the same at every point, not drawn: " + "; ".join(left_out), 100 * cols),
                      fontsize=8)
    return fig, len(panels)


@dataclass(frozen=True)
class _Runs:
    """The runs a figure draws: their rows by name, each one's step offset (chained runs) and span of steps, and
    the colours (one a curve of a panel: P: and A:, mean and p95; a line style a run, the same in every panel)."""

    data: dict[str, Sequence[dict]]
    shift: dict[str, int]
    spans: dict[str, tuple[int, int]]
    colors: list[str]


def _choose_panels(data: dict[str, Sequence[dict]], runs: Sequence[str | Path]):
    """(the panels drawn: (title, [(key, label)], rate), what is left out for never changing: 'title: label
    value')."""
    present = [(t, [(k, label) for k, label in keys if any(series(rows, k)[0] for rows in data.values())], rate)
               for t, keys, rate in PANELS]
    present = [(t, keys, rate) for t, keys, rate in present if keys]
    if not present:
        raise PlotError(f"no metrics to plot in {', '.join(map(str, runs))}")
    flat = {k: constant(data, k) for _, keys, _ in present for k, _ in keys}
    panels = [(t, [(k, label) for k, label in keys if flat[k] is None], rate) for t, keys, rate in present]
    panels = [(t, keys, rate) for t, keys, rate in panels if keys]
    if not panels:  # nothing changes (a run of a step or two): drawn all the same
        panels, flat = present, dict.fromkeys(flat)
    left_out = [f"{t}: " + ", ".join(f"{label} {_shown(flat[k], rate)}" for k, label in keys if flat[k] is not None)
                for t, keys, rate in present if any(flat[k] is not None for k, _ in keys)]
    return panels, left_out


def _draw_curves(ax, runs: _Runs, keys) -> tuple[list[str], list[float]]:
    """Each run's curve of each key on `ax` (smoothed beside its raw points when long); (the runs drawn, the
    values)."""
    drawn, values = [], []
    for r, (run, rows) in enumerate(runs.data.items()):
        style = STYLES[r % len(STYLES)]
        for k, (key, label) in enumerate(keys):
            x, y = series(rows, key)
            if not x:
                continue
            drawn.append(run)
            values += y
            name = f"{run}: {label}" if len(runs.data) > 1 else label
            x = [s + runs.shift[run] for s in x]
            color = runs.colors[k % len(runs.colors)]
            if len(x) >= SMOOTH_FROM and not key.startswith("eval/"):
                ax.plot(x, y, style, alpha=0.25, linewidth=0.8, label=f"_{name} (raw)", color=color)
                ax.plot(x, smoothed(y), style, label=name, color=color)
            else:
                ax.plot(x, y, style, label=name, marker="." if len(x) < 30 else None, color=color)
    return drawn, values


def _dress(ax, runs: _Runs, panel: tuple[str, bool], drawn: list[str], values: list[float]) -> None:
    """A panel's title, axes, limits, grid and legend (`panel`: its title, and whether it shows a share)."""
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    title, rate = panel
    first = min((runs.spans[run][0] for run in drawn if run in runs.spans), default=0)
    last = max((runs.spans[run][1] for run in drawn if run in runs.spans), default=1)
    pad = max(0.5, 0.02 * (last - first))
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step" if not any(runs.shift.values()) else "step (a run started from another's model follows it)")
    ax.set_xlim(first - pad, last + pad)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    if rate:  # a share reads against its whole range, not zoomed into 0.986-1.0
        ax.set_ylim(*RATE_LIMITS)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    else:
        ax.ticklabel_format(axis="y", useOffset=False)
        low, high = min(values), max(values)
        least = 0.1 * max(abs(low), abs(high))  # a near-flat curve is not stretched over the whole height
        if high - low < least:
            middle = (low + high) / 2
            ax.set_ylim(middle - least / 2, middle + least / 2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _shown(value: float, rate: bool) -> str:
    return f"{value:.0%}" if rate else f"{value:g}"
