"""Training curves of one or more runs from their metrics.jsonl, several runs overlaid in one PNG."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

from rookworld.ground.files import Output
from rookworld.net.sources import CONFIG_FILE

#: A GRPO run's "loss" (near 0, either sign) is drawn apart from SFT's cross-entropy (about 1 to 11).
GRPO_LOSS = "loss (GRPO)"

#: (title, [(metric, label)]): a panel is drawn when some run has one of its metrics.
PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("reward per task (GRPO samples)", [("reward/P/mean", "P:"), ("reward/A/mean", "A:")]),
    ("KL to the reference per token", [("kl/mean", "mean"), ("kl/p95", "p95")]),
    ("SFT loss (cross-entropy per token)", [("loss", "loss")]),
    ("GRPO loss", [(GRPO_LOSS, "loss")]),
    ("held-out loss", [("eval/loss", "loss")]),
    ("held-out mean reward (greedy)", [("eval/P/mean_reward", "P:"), ("eval/A/mean_reward", "A:")]),
    ("held-out format validity", [("eval/P/format_valid", "P:"), ("eval/A/format_valid", "A:")]),
    ("held-out P: best move", [("eval/P/best_move_accuracy", "accuracy"), ("eval/P/top5_accuracy", "in top 5"),
                               ("eval/P/legal_best_move", "legal")]),
    ("held-out A: next state", [("eval/A/next_state_exact", "exact"), ("eval/A/fen_similarity", "FEN similarity")]),
    ("clip fraction and groups without spread", [("clip_fraction", "clipped"), ("groups/zero_spread", "no spread")]),
    ("entropy per token", [("entropy", "entropy")]),
]


class PlotError(ValueError):
    """A run that cannot be read, or no matplotlib."""


def read_metrics(run: str | Path) -> list[dict]:
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise PlotError(f"{run}: no metrics.jsonl (is it the --output-dir of rookworld train or sft?)")
    rows, bad = [], 0
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise PlotError(f"cannot read {path}: {e.strerror or e}") from None
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # a line cut short by a crash: the rest still plots
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    if bad and not rows:
        raise PlotError(f"{path}: none of its {bad} lines is a JSON object of metrics; is it the metrics.jsonl "
                        f"that rookworld train or sft writes?")
    if any("kl/mean" in r or "reward/mean" in r for r in rows):  # a GRPO run
        rows = [{(GRPO_LOSS if k == "loss" else k): v for k, v in r.items()} for r in rows]
    return rows


def started_from(run: str | Path) -> Path | None:
    """The model a run started from (its checkpoints' --model), resolved; None for a fresh model or no checkpoint."""
    for config in sorted((Path(run) / "checkpoints").glob(f"step-*/{CONFIG_FILE}")):
        try:
            model = json.loads(config.read_text()).get("model")
        except (OSError, ValueError, AttributeError):
            continue
        return Path(model).resolve() if isinstance(model, str) else None
    return None


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


def figure(runs: Sequence[str | Path], title: str | None = None):
    """(the matplotlib figure of every panel some run has data for, how many panels)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'rookworld[plot]'") from None
    data = {name: read_metrics(run) for name, run in zip(run_names(runs), runs)}
    shift = dict(zip(data, chained_offsets(runs, list(data.values()))))
    panels = [(t, keys) for t, keys in PANELS if any(series(rows, k)[0] for rows in data.values() for k, _ in keys)]
    if not panels:
        raise PlotError(f"no metrics to plot in {', '.join(map(str, runs))}")
    cols = 2 if len(panels) > 1 else 1
    nrows = -(-len(panels) // cols)
    # Constrained layout leaves room for the suptitle, which tight_layout draws over the top panels.
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 3.4 * nrows), squeeze=False, layout="constrained")
    # A colour per curve of a panel (P: and A:, mean and p95) and a line style per run, the same in every panel.
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    # Each run's whole span of steps (chained runs shifted): a panel spans those of the runs it draws, so a GRPO
    # run's own panels are not squeezed by a longer SFT run beside it, and a one-point evaluation is not zoomed.
    spans = {run: (min(steps) + shift[run], max(steps) + shift[run])
             for run, rows in data.items() if (steps := series(rows, "step")[1])}
    for ax, (panel, keys) in zip(axes.flat, panels):
        drawn = []
        for r, (run, rows) in enumerate(data.items()):
            for k, (key, label) in enumerate(keys):
                x, y = series(rows, key)
                if x:
                    drawn.append(run)
                    name = f"{run}: {label}" if len(data) > 1 else label
                    ax.plot([s + shift[run] for s in x], y, styles[r % len(styles)], color=colors[k % len(colors)],
                            label=name, marker="." if len(x) < 30 else None)
        first = min((spans[run][0] for run in drawn if run in spans), default=0)
        last = max((spans[run][1] for run in drawn if run in spans), default=1)
        pad = max(0.5, 0.02 * (last - first))
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("step" if not any(shift.values()) else "step (a run started from another's model follows it)")
        ax.set_xlim(first - pad, last + pad)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    return fig, len(panels)
