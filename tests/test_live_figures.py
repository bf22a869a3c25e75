"""The figures a run shows as it goes, and that they are true: the chess the README leads with in every training
line, evaluation and closing summary, an evaluation at step 0, a closing `rookworld eval` that measures the run's own
positions, ETAs from measured rates, and plots that read (smoothed, legends clear of the curves, shares on 0-1, no
panel for what never changes). Real runs of the shipped chess-cpu model, real positions, the real Stockfish."""

from __future__ import annotations

import io
import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import cli

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "models" / "chess-cpu-sft"
HELD_OUT = REPO / "data" / "chess-cpu-held-out.jsonl"
#: A GRPO run of the shipped model at toy size: 4 P: and 1 A: prompt a step, group 4, evaluated at steps 0 and 2.
RUN_ARGS = ["--model", str(SHIPPED), "--eval-data", str(HELD_OUT), "--steps", "2", "--eval-every", "2",
            "--eval-size", "6", "--prompts-per-step", "5", "--group-size", "4", "--max-new-tokens", "96",
            "--stockfish-depth", "4", "--stockfish-workers", "1", "--device", "cpu", "--seed", "3",
            "--sample-every", "0", "--report-to", "none"]


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("live") / "run"
    proc = cli("train", *RUN_ARGS, "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc.stderr.splitlines()


# -- the lines of a run ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_shows_its_chess_from_step_0_to_its_end(grpo_run):
    out, lines = grpo_run
    rows = rows_of(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    start = rows[0]  # the shipped model, before any update: where every curve begins
    assert "loss" not in start and "eta_s" not in start and start["time/eval"] > 0
    assert start["eval/P/n"] == 6 and start["eval/A/n"] == 6

    def figures(m: dict) -> str:
        return (f"P: legal best move {m['eval/P/legal_best_move']:.1%}, best move in top 5 "
                f"{m['eval/P/top5_accuracy']:.1%}, best move {m['eval/P/best_move_accuracy']:.1%} (format "
                f"{m['eval/P/format_valid']:.0%}, reward {m['eval/P/mean_reward']:.3f}) | A: next state exact "
                f"{m['eval/A/next_state_exact']:.1%} (format {m['eval/A/format_valid']:.0%}, reward "
                f"{m['eval/A/mean_reward']:.3f})")

    evals = [line for line in lines if line.startswith("eval at step")]
    assert [line.split(" | ")[0] for line in evals] == ["eval at step 0", "eval at step 2"]
    assert evals[0].startswith(f"eval at step 0 | {figures(start)} | "), evals[0]
    assert evals[1].startswith(f"eval at step 2 | {figures(rows[2])} | "), evals[1]
    # Each training line: the chess of the step's own samples, shares of its 16 P: and 4 A: completions.
    for row in rows[1:]:
        legal, exact = row["legal_best_move/P"], row["next_state_exact/A"]
        assert (16 * legal).is_integer() and (4 * exact).is_integer() and 0 <= row["top5_accuracy/P"] <= legal
        line = next(line for line in lines if line.startswith(f"step {row['step']}/2 | "))
        assert f" | P: reward {row['reward/P/mean']:.2f}, legal best move {legal:.0%} | A: reward " \
               f"{row['reward/A/mean']:.2f}, next state exact {exact:.0%} | kl " in line, line
    # The closing lines: where it started, where it ended, and the eval that measures the same positions.
    tail = lines[-6:]
    assert tail[0] == f"held-out at step 0 (6 positions) | {figures(start)}"
    assert tail[1] == f"held-out at step 2 (6 positions) | {figures(rows[2])}"
    assert tail[2] == f"change from step 0 to 2, in points, on the same 6 positions (± two standard errors: a " \
                      f"change within it can be chance) | {changes(out, rows[0], rows[2])}", tail[2]
    assert tail[4] == (f"evaluate it on its held-out positions: rookworld eval --model {out} --data {HELD_OUT} "
                       f"--eval-size 6 --seed 3 --stockfish-depth 4 --max-new-tokens 96")


def changes(out, start: dict, end: dict) -> str:
    """The closing change line's figures, from held-out.jsonl's outcomes in float64: each mean change is the
    difference of the two evaluations' own figures, its noise twice the standard error of the positions' changes."""
    outcomes = {row["step"]: row for row in map(json.loads, (out / "held-out.jsonl").read_text().splitlines())}
    assert sorted(outcomes) == [0, 2]
    parts = []
    for task, keys in (("P", ("legal_best_move", "top5_accuracy", "best_move_accuracy")),
                       ("A", ("next_state_exact",))):
        shown = []
        for key in keys:
            a, b = (np.array([int(c) for c in outcomes[s][f"{task}/{key}"]], dtype=np.float64) for s in (0, 2))
            assert a.mean() == pytest.approx(start[f"eval/{task}/{key}"])
            assert b.mean() == pytest.approx(end[f"eval/{task}/{key}"])
            d = b - a
            noise = 2 * d.std(ddof=1) / np.sqrt(len(d))
            label = {"legal_best_move": "legal best move", "top5_accuracy": "best move in top 5",
                     "best_move_accuracy": "best move", "next_state_exact": "next state exact"}[key]
            shown.append(f"{label} {100 * d.mean():+.1f} ± {100 * noise:.1f}" if noise else
                         f"{label} {100 * d.mean():+.1f} (no position changed)")
        parts.append(f"{task}: {', '.join(shown)}")
    return " | ".join(parts)


def test_the_closing_eval_measures_what_the_run_measured(grpo_run, tmp_path):
    """The hint's eval, as printed, measures the run's first --eval-size positions of its file and gives the run's
    own last figures (eval alone takes the whole file, as the README's figures do)."""
    out, lines = grpo_run
    hint = next(line for line in lines if line.startswith("evaluate it on its held-out positions: "))
    args = shlex.split(hint.split(": ", 1)[1])[1:]
    result = tmp_path / "eval.json"
    proc = cli(*args, "--device", "cpu", "--out", str(result))
    assert proc.returncode == 0, proc.stderr
    sections = json.loads(result.read_text())["suites"]["best-move"]["sections"]
    last = rows_of(out)[-1]
    compared = 0
    for task in ("P", "A"):
        for key, value in sections[task].items():
            if value is not None and f"eval/{task}/{key}" in last:
                assert last[f"eval/{task}/{key}"] == pytest.approx(value), (task, key)
                compared += 1
    assert compared >= 12


@pytest.mark.slow
def test_ctrl_c_during_the_evaluation_at_step_0_stops_at_once_and_the_same_command_starts_again(tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "rookworld", "train", *RUN_ARGS, "--eval-every", "1", "--eval-size", "2000",
            "--output-dir", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith("prompts:") for line in lines):  # the header's last line: the loop is next
            assert proc.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.2)
        time.sleep(2)  # into the evaluation at step 0, of all 2,000 held-out positions
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    text = "".join(lines)
    assert time.monotonic() - asked < 30, "it waited for the evaluation"
    assert proc.returncode == 130, text
    assert "evaluation at step 0 stopped (its partial figures are dropped); no step was done, so nothing is saved" \
        in text, text
    assert text.rstrip().endswith("rookworld train: interrupted at step 0; no step was saved, so there is nothing "
                                  "to resume: run the same command again"), text
    assert "eval at step" not in text and not (out / "checkpoints").exists()
    again = cli("train", *RUN_ARGS, "--eval-every", "0", "--steps", "1", "--output-dir", str(out))
    assert again.returncode == 0, again.stderr
    assert [r["step"] for r in rows_of(out)] == [1]


def test_a_run_stopped_after_its_evaluation_at_step_0_is_no_run_to_keep(grpo_run, tmp_path):
    """Its only row is the evaluation before any update: nothing worth keeping, so a new run starts there without
    --overwrite (as one that logged nothing does)."""
    from rookworld.harness.rundir import mark

    run, _ = grpo_run
    out = tmp_path / "stopped"
    out.mkdir()
    mark(out, "train")
    (out / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    proc = cli("train", *RUN_ARGS, "--eval-every", "0", "--steps", "1", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in rows_of(out)] == [1]


# -- progress bars ----------------------------------------------------------------------------------------------------

def test_a_bar_measures_its_rate_after_start_up_and_says_nothing_before():
    from rookworld.io.progress import Progress

    stream = io.StringIO()
    bar = Progress(10, "best-move", "prompts", stream=stream)
    time.sleep(0.5)  # loading, starting engines, the first batch's compiling
    bar.update(1)
    assert bar.eta() is None and bar.rate() is None and "00:00<? ? prompts/s" in stream.getvalue()
    for _ in range(3):
        time.sleep(0.05)
        bar.update(1)
    # 6 left at about 20 a second: 0.3 s. Counting the start-up would say 6 x 0.65 / 4 = 1 s.
    assert 0.2 < bar.eta() < 0.6, bar.eta()
    assert 12 < bar.rate() < 21
    bar.update(6)
    assert bar.eta() == 0.0 and "<00:00" in stream.getvalue().splitlines()[-1]
    # One update that does it all: the rate is the whole run's.
    once = Progress(4, "x", "it", stream=io.StringIO())
    time.sleep(0.1)
    once.update(4)
    assert 4 / 0.1 > once.rate() > 4 / 1.0 and once.eta() == 0.0
    # Work whose length is not known ahead shows no time left at all.
    games = Progress(4, "selfplay", "games", stream=io.StringIO(), eta=False)
    games.update(1)
    time.sleep(0.05)
    games.update(1)
    assert games.eta() is None and "<" not in games.line()


@pytest.mark.slow
def test_a_real_best_move_suite_estimates_from_the_work_done():
    """The bar starts before the model loads (as `rookworld eval`'s): the load and the first batch are start-up, and
    every time left it shows after them comes from the batches since."""
    from rookworld.io.progress import Progress
    from rookworld.chess.rewards import RewardScorer
    from rookworld.lm.answers import RookWorldLM
    from rookworld.lm.bestmove import heldout_records
    from rookworld.lm.suites import SuiteOptions, run_suites

    class Watched(Progress):
        """Each update's time and the time left it shows."""

        def update(self, n: int = 1, postfix: str = "") -> None:
            super().update(n, postfix)
            self.seen.append((time.monotonic(), self.eta()))

    stream = io.StringIO()
    bar = Watched(0, "best-move", "prompts", stream=stream)
    bar.seen = []
    lm = RookWorldLM.load(str(SHIPPED), device="cpu", batch_size=4, max_new_tokens=96)
    records = heldout_records(12, 3, str(HELD_OUT))
    (result,) = run_suites(lm, ["best-move"], SuiteOptions(size=12, seed=3), records=records,
                           scorer=RewardScorer(None), progress=lambda label, total, unit: bar)
    end = bar.seen[-1][0]
    assert result.sections["P"]["n"] == 12 and bar.done == bar.total == 24 and len(bar.seen) == 6
    assert bar.seen[0][1] is None and bar.seen[-1][1] == 0.0
    for when, left in bar.seen[1:-1]:  # within a factor of 3 of the time it really took, and a second
        assert left is not None and left < 3 * (end - when) + 1.0 and left > (end - when) / 3 - 1.0, bar.seen
    lines = stream.getvalue().splitlines()
    assert "<?" in lines[0] and all(re.search(r"<\d\d:\d\d ", line) for line in lines[1:]), lines


def test_a_real_game_suite_counts_games_and_shows_no_time_left():
    """A game lasts a few moves or the ply limit: the bar counts the games as they end, with the moves played, and
    gives no time left (the bound of every game at the limit said an hour for a three-minute suite)."""
    from rookworld.io.progress import Progress
    from rookworld.lm.answers import RookWorldLM
    from rookworld.lm.suites import SuiteOptions, run_suites

    stream = io.StringIO()
    bars = []

    def bar(label, total, unit):
        bars.append(Progress(total, label, unit, stream=stream))
        return bars[-1]

    lm = RookWorldLM.load(str(SHIPPED), device="cpu", max_new_tokens=96)
    (result,) = run_suites(lm, ["selfplay"], SuiteOptions(games=2, max_plies=12, seed=3), progress=bar)
    (progress,) = bars
    assert progress.unit == "games" and progress.done == progress.total == 4 and progress.eta() is None
    lines = stream.getvalue().splitlines()
    # no time left shown, and a rate in games: games a second, or seconds a game below one a second
    assert lines and all("<" not in line and re.search(r"(games/s|s/games)( |$)", line) for line in lines), lines
    assert lines[-1].startswith("selfplay [########################] 4/4 100% ")
    played = sum(len(item["moves"]) for item in result.items if item["decoding"] == "rookworld")
    assert lines[-1].endswith(f" {played} move{'s' * (played != 1)}"), (lines[-1], played)


# -- plots ----------------------------------------------------------------------------------------------------------

def panels_of(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_the_plot_of_a_real_run_starts_at_step_0_with_its_chess_first(grpo_run, tmp_path):
    """Every held-out figure of the run is drawn from step 0 on, or, when its two evaluations agree, named at the
    foot with its value; shares on their whole range; the chess panels before the others."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from rookworld.harness.plot import PANELS, RATE_LIMITS, figure

    out, _ = grpo_run
    start = rows_of(out)[0]
    fig, n = figure([out])
    panels = panels_of(fig)
    assert list(panels) == [title for title, _, _ in PANELS if title in panels]
    foot = " ".join((fig.get_supxlabel() if hasattr(fig, "get_supxlabel") else fig._supxlabel.get_text()).split())
    for title, keys, share in PANELS:
        if title in panels and share:
            assert panels[title].get_ylim() == RATE_LIMITS, title
        for key, label in keys:
            if not key.startswith("eval/") or key not in start:
                continue
            drawn = [line for line in panels[title].lines if line.get_label() == label] if title in panels else []
            if drawn:
                assert list(drawn[0].get_xdata()) == [0, 2] and panels[title].get_xlim()[0] < 0, key
            else:
                value = f"{start[key]:.0%}" if share else f"{start[key]:g}"
                assert f"{title}: " in foot and f"{label} {value}" in foot, (key, foot)
    plt.close(fig)
    png = tmp_path / "curves.png"
    proc = cli("plot", str(out), "--out", str(png))
    assert proc.returncode == 0 and png.read_bytes()[:4] == b"\x89PNG" and f"({n} panels, 1 run(s))" in proc.stderr


def test_a_plot_smooths_keeps_shares_on_0_to_1_puts_legends_aside_and_leaves_out_what_never_changes(grpo_run,
                                                                                                    tmp_path):
    """150 steps in the real rows' format (the real run's keys): rewards that wander, a clip fraction and groups
    without spread that are 0 throughout, format validity 100% at every evaluation, an entropy that moves in its
    fifth digit."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from rookworld.harness.plot import RATE_LIMITS, figure, smoothed

    real = rows_of(grpo_run[0])
    step_keys = [k for k in real[1] if not k.startswith("eval/")]
    eval_keys = [k for k in real[0] if k.startswith("eval/")]
    rows = []
    for step in range(151):
        row = {"step": step}
        if step:
            row |= {k: real[1][k] for k in step_keys if k != "step"}
            row |= {"reward/P/mean": 0.2 + 0.001 * step + 0.05 * ((step * 7) % 5 - 2),
                    "legal_best_move/P": 0.5 + 0.002 * step,
                    "reward/A/mean": 0.5 + 0.03 * ((step * 3) % 4 - 1.5), "clip_fraction": 0.0,
                    "groups/zero_spread": 0.0, "entropy": 10.79 + 1e-5 * (step % 3), "kl/mean": 1e-4 * step}
        if step % 50 == 0:
            row |= {k: real[0][k] for k in eval_keys}
            row |= {"eval/P/legal_best_move": 0.55 + 0.001 * step, "eval/P/format_valid": 1.0,
                    "eval/A/format_valid": 1.0}
        rows.append(row)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig, _ = figure([run])
    panels = panels_of(fig)
    # What never changes has no curve, and no panel when nothing of it changes; the foot of the figure says it.
    assert "clip fraction and groups without spread" not in panels and "held-out format validity" not in panels
    foot = fig.get_supxlabel() if hasattr(fig, "get_supxlabel") else fig._supxlabel.get_text()
    assert "clip fraction and groups without spread: clipped 0%, no spread 0%" in " ".join(foot.split())
    assert "held-out format validity: P: 100%, A: 100%" in " ".join(foot.split())
    # A training curve drawn smoothed over its raw self, faint and out of the legend; evaluations as they are.
    reward = panels["reward per task (GRPO samples)"]
    raw, smooth = [line for line in reward.lines if line.get_label() in ("_P: (raw)", "P:")]
    assert raw.get_alpha() < 0.5 and smooth.get_alpha() in (None, 1.0)
    assert list(smooth.get_ydata()) == pytest.approx(smoothed(list(raw.get_ydata())))
    jumps = [sum(abs(b - a) for a, b in zip(y, y[1:])) for y in (raw.get_ydata(), smooth.get_ydata())]
    assert jumps[1] < 0.5 * jumps[0]
    assert [t.get_text() for t in reward.get_legend().get_texts()] == ["P:", "A:"]
    # Shares on their whole range; a near-flat curve is not stretched over the panel's height.
    for title in ("held-out P: best move", "chess of the GRPO samples"):
        assert panels[title].get_ylim() == RATE_LIMITS, title
    low, high = panels["entropy per token"].get_ylim()
    assert high - low >= 0.1 * 10.79 - 1e-9
    # Every legend beside its panel, clear of the curves.
    fig.canvas.draw()
    for title, ax in panels.items():
        legend, box = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert legend.x0 >= box.x1, title
    plt.close(fig)


def test_a_slow_rate_reads_in_seconds_a_step_and_evaluations_are_not_steps(monkeypatch, tmp_path):
    """Under one step a second the bar reads "2.0 s/step", not "0.0 step/s"; a held-out evaluation's time is left
    out of the steps' elapsed time and rate, and counted once more for each evaluation still to come."""
    from rookworld.harness.runlog import RunLog
    from rookworld.io import progress

    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    log = RunLog(tmp_path, 10, enabled=False)
    log.begin_steps()
    clock[0] += 30.0
    log.evaluated(30.0, every=4)  # step 0's evaluation: no step's time
    for _ in range(3):
        clock[0] += 2.0
        log.eta(log.bar.done + 1)
    assert log.bar.speed() == "2.0 s/step" and log.bar.line().split()[4] == "00:06<00:14"
    # 7 steps of 2 s left (the first step's 2 s start the rate), and 3 evaluations of 30 s to come (at 4, 8 and
    # the last step, 10)
    assert log.eta(3) == pytest.approx(7 * 2.0 + 3 * 30.0)
    clock[0] += 30.0
    log.evaluated(30.0, every=4)
    assert log.bar.speed() == "2.0 s/step"
