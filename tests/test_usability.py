"""What a new user meets: a run directory that is not silently overwritten, one-line errors, a header before the
slow parts, visible evaluation, a finished run that says so, a vocabulary that comes with the model, the
README's snippets running as written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import rookworld_process
from test_trainer import metrics, run_cli, train_args

REPO = Path(__file__).resolve().parents[1]


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# -- the output directory -------------------------------------------------------------------------------------

def test_a_new_run_does_not_overwrite_an_old_one_without_being_told(tiny_dir, tmp_path):
    out = tmp_path / "run"
    assert run_cli(train_args(tiny_dir, out, "--steps", "2", "--save-every", "1")).returncode == 0
    before = (out / "metrics.jsonl").read_text()
    again = run_cli(train_args(tiny_dir, out, "--steps", "1"))
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert f"--resume {out}" in again.stderr and "--overwrite" in again.stderr
    assert (out / "metrics.jsonl").read_text() == before and len(list((out / "checkpoints").glob("step-*"))) == 2
    fresh = run_cli(train_args(tiny_dir, out, "--steps", "1", "--overwrite"))
    assert fresh.returncode == 0, fresh.stderr
    assert [r["step"] for r in metrics(out)] == [1]
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-000001"]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000001"
    # Nor does a run resumed from one directory land on another run's directory.
    other = tmp_path / "other"
    assert run_cli(train_args(tiny_dir, other, "--steps", "1")).returncode == 0
    theirs = (other / "metrics.jsonl").read_text()
    crossed = run_cli(["train", "--resume", str(out), "--steps", "2", "--output-dir", str(other)])
    assert crossed.returncode == 2 and "Traceback" not in crossed.stderr
    assert "another run" in crossed.stderr and "--overwrite" in crossed.stderr
    assert (other / "metrics.jsonl").read_text() == theirs


def test_a_run_that_saved_no_checkpoint_is_no_dead_end(tiny_dir, tmp_path):
    out = tmp_path / "run"
    assert run_cli(train_args(tiny_dir, out, "--steps", "2", "--save-every", "0")).returncode == 0
    shutil.rmtree(out / "checkpoints")  # as a second Ctrl-C leaves it: metrics and TensorBoard, no checkpoint
    again = run_cli(train_args(tiny_dir, out, "--steps", "1"))
    assert again.returncode == 2 and "saved no checkpoint" in again.stderr and "--overwrite" in again.stderr
    assert "--resume" not in again.stderr, again.stderr  # it cannot be resumed: do not offer it
    resumed = run_cli(["train", "--resume", str(out)])
    assert resumed.returncode == 2 and "stopped before saving a checkpoint" in resumed.stderr
    assert "--overwrite" in resumed.stderr and len(lines_of(resumed.stderr)) == 1
    assert run_cli(train_args(tiny_dir, out, "--steps", "1", "--overwrite")).returncode == 0
    # A run stopped before it logged a step has nothing worth keeping: a new run starts there without asking.
    (out / "metrics.jsonl").write_text("")
    shutil.rmtree(out / "checkpoints")
    fresh = run_cli(train_args(tiny_dir, out, "--steps", "1"))
    assert fresh.returncode == 0, fresh.stderr
    assert [r["step"] for r in metrics(out)] == [1]


def test_train_and_sft_never_take_each_others_runs(tiny_dir, tmp_path):
    sft = tmp_path / "sft"
    data = tmp_path / "train.txt"
    data.write_text("A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
                    "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0\n")
    proc = run_cli(["sft", "--init", "tiny", "--n-embd", "32", "--data", str(data), "--output-dir", str(sft),
                    "--steps", "1", "--rows-per-step", "2", "--eval-every", "0", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    model = (sft / "model.safetensors").read_bytes()
    resumed = run_cli(["train", "--resume", str(sft), "--steps", "2"])
    assert resumed.returncode == 2 and len(lines_of(resumed.stderr)) == 1, resumed.stderr
    assert "that is a `rookworld sft` run" in resumed.stderr and f"rookworld sft --resume {sft}" in resumed.stderr
    assert "rookworld train --model" in resumed.stderr and "is not a str" not in resumed.stderr
    for extra in ([], ["--overwrite"]):
        into = run_cli(train_args(sft, sft, "--steps", "1", *extra))
        assert into.returncode == 2 and "holds a `rookworld sft` run" in into.stderr, into.stderr
        assert f"--resume {sft}" not in into.stderr
    assert (sft / "model.safetensors").read_bytes() == model  # --overwrite deleted nothing
    grpo = tmp_path / "grpo"
    assert run_cli(train_args(sft, grpo, "--steps", "1")).returncode == 0
    back = run_cli(["sft", "--resume", str(grpo), "--steps", "2"])
    assert back.returncode == 2 and "that is a `rookworld train` run" in back.stderr, back.stderr
    # A checkpoint copied on its own says whose it is in its own run.json, not by what its settings hold.
    for run, command in ((sft, "sft"), (grpo, "train")):
        step = sorted((run / "checkpoints").glob("step-*"))[-1]
        assert json.loads((step / "run.json").read_text())["command"] == command
        alone = shutil.copytree(step, tmp_path / f"{command}-copied")
        other = "sft" if command == "train" else "train"
        refused = run_cli([other, "--resume", str(alone), "--steps", "3"])
        assert refused.returncode == 2 and f"that is a `rookworld {command}` run" in refused.stderr, refused.stderr


def test_train_ends_with_a_summary_and_keeps_its_model_at_the_top(tiny_dir, tmp_path):
    out = tmp_path / "run"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "2", "--sample-every", "10", "--eval-every", "2",
                              "--eval-size", "2"))
    assert proc.returncode == 0, proc.stderr
    tail = lines_of(proc.stderr)[-7:]
    assert tail[0].startswith("rookworld train: done, step 2/2 in "), tail
    # Where the run started (its evaluation at step 0) and where it ended, the chess first, of how many positions,
    # and the change between them, position by position.
    for line, step in ((tail[1], 0), (tail[2], 2)):
        assert line.startswith(f"held-out at step {step} (2 positions) | P: legal best move "), line
        assert "| A: next state exact " in line, line
    assert tail[3].startswith("change from step 0 to 2, in points, on the same 2 positions (± two standard "
                              "errors: a change within it can be chance) | P: legal best move "), tail[3]
    # The eval that measures the run's own held-out positions: as many, of its seed, with its depth and length.
    assert tail[4:] == [f"model: {out} (step 2; its checkpoints in {out / 'checkpoints'})",
                        f"evaluate it on its held-out positions: rookworld eval --model {out} --eval-size 2 --seed 3 "
                        f"--stockfish-depth 4 --max-new-tokens 12", f"curves: rookworld plot {out}"]
    from rookworld.net.pretrained import from_pretrained

    top, saved = from_pretrained(out), from_pretrained(out / "checkpoints" / "step-000002")
    assert all(torch.equal(a, b) for a, b in zip(top.state_dict().values(), saved.state_dict().values()))
    # Shorter than --sample-every: the last step's samples are written all the same.
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert rows and {r["step"] for r in rows} == {2}


def test_a_long_run_keeps_its_stages_and_says_where_each_held_out_figure_peaked(tiny_dir, tmp_path):
    """A 3,000-step run kept its last 3 checkpoints, so the stage its held-out curve chose could not be evaluated
    afterwards (issue 70): --keep-every keeps every Nth step's beyond --keep-checkpoints, through a resume, and the
    closing lines say where each held-out figure was at its best."""
    out = tmp_path / "run"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "5", "--save-every", "1", "--keep-checkpoints", "1",
                              "--keep-every", "2", "--eval-every", "1", "--eval-size", "2"))
    assert proc.returncode == 0, proc.stderr
    kept = lambda: sorted(p.name for p in (out / "checkpoints").glob("step-*"))  # noqa: E731
    assert kept() == ["step-000002", "step-000004", "step-000005"]
    peaks, = [line for line in lines_of(proc.stderr) if line.startswith("held-out peaks: ")]
    rows = [r for r in metrics(out) if "eval/P/legal_best_move" in r]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    best = max(r["eval/P/legal_best_move"] for r in rows)
    first = min(r["step"] for r in rows if r["eval/P/legal_best_move"] == best)
    assert f"P: legal best move {best:.1%} at step {first}, " in peaks, peaks
    assert ", A: next state exact " in peaks, peaks
    again = run_cli(["train", "--resume", str(out), "--steps", "7"])
    assert again.returncode == 0, again.stderr
    assert kept() == ["step-000002", "step-000004", "step-000006", "step-000007"]
    refused = run_cli(train_args(tiny_dir, tmp_path / "other", "--steps", "2", "--save-every", "2", "--keep-every",
                                 "3"))
    assert refused.returncode == 2 and "--keep-every (3) must be a multiple of --save-every (2)" in refused.stderr


def test_each_held_out_figure_s_peak_is_its_best_step_the_earliest_of_a_tie_and_a_resumed_step_s_last_row():
    from rookworld.harness.runlog import eval_peaks

    row = lambda step, legal, exact, **more: {"step": step, "eval/P/legal_best_move": legal,  # noqa: E731
                                             "eval/A/next_state_exact": exact, **more}
    rows = [row(0, 0.5, 0.6), {"step": 1, "loss": 0.3}, row(100, 0.7, 0.6), row(200, 0.9, None),
            row(200, 0.6, 0.5),  # step 200 again after a resume from step 150: this row is the run's
            row(300, 0.7, float("nan"))]
    assert eval_peaks(rows) == ["P: legal best move 70.0% at step 100", "A: next state exact 60.0% at step 0"]
    assert eval_peaks(rows[:3]) == []  # two evaluations: the first and last lines say it whole
    losses = [{"step": s, "eval/loss": v} for s, v in ((0, 2.5), (50, 1.25), (100, 1.5))]
    assert eval_peaks(losses) == ["loss 1.2500 at step 50"]


def test_the_closing_change_is_paired_by_position_against_float64():
    """The change a run's closing lines give: each figure's mean change over the same positions, and twice the
    standard error of the positions' own changes, as numpy computes them in float64; nothing for what cannot be
    paired."""
    from rookworld.harness.heldout import paired_change

    rng = np.random.default_rng(0)
    for n in (2, 7, 200, 1000):
        a, b = rng.integers(0, 2, n), rng.integers(0, 2, n)
        d = (b - a).astype(np.float64)
        mean, noise, count = paired_change("".join(map(str, a)), "".join(map(str, b)))
        assert count == n
        assert mean == pytest.approx(d.mean(), abs=1e-12)
        assert noise == pytest.approx(2 * d.std(ddof=1) / np.sqrt(n), abs=1e-12)
    assert paired_change("0110", "0110") == (0.0, 0.0, 4)
    assert paired_change("0011", "1111") == (0.5, pytest.approx(2 * np.std([1, 1, 0, 0], ddof=1) / 2), 4)
    for before, after in (("01", "011"), ("1", "0"), ("0a", "01"), (None, "01"), ("01", 3)):
        assert paired_change(before, after) is None


def test_resuming_a_finished_run_says_it_is_complete(tiny_dir, tmp_path):
    out = tmp_path / "done"
    assert run_cli(train_args(tiny_dir, out, "--steps", "1")).returncode == 0
    proc = run_cli(["train", "--resume", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "the run is complete: step 1 of --steps 1" in proc.stderr and "--steps N" in proc.stderr
    assert "model:" not in proc.stderr  # said before any model is loaded
    assert [r["step"] for r in metrics(out)] == [1]


def test_the_rate_and_eta_start_after_set_up(tmp_path):
    """Loading models and starting engines takes a while, and the first step compiles and warms up; the rate and
    the ETA count the steps after it only, and say nothing before they can."""
    import io
    import time

    from rookworld.harness.runlog import RunLog

    log = RunLog(tmp_path, total_steps=4, stream=io.StringIO())
    log.start()
    time.sleep(0.6)  # set-up
    log.begin_steps()
    time.sleep(0.6)  # the first step, compiling
    assert log.eta(1) is None  # no rate measured yet
    log.step({"step": 1}, log_line=False)
    time.sleep(0.05)
    assert log.eta(2) < 0.6  # two more steps as fast as the second; counting the first would say >= 1.2 s
    log.step({"step": 2}, log_line=False)
    rate = float(log.bar.line().split()[-2].replace(",", ""))
    assert rate > 2.0  # one step in (much) less than the 0.6 s of set-up or of the first step


# -- what the terminal shows ------------------------------------------------------------------------------------

def test_a_run_starts_with_a_header_and_shows_its_evaluations(tiny_dir, tmp_path):
    out = tmp_path / "shown"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "2", "--eval-every", "1", "--eval-size", "2"))
    assert proc.returncode == 0, proc.stderr
    shown = lines_of(proc.stderr)
    from rookworld.harness.context import compute_dtype

    bf16, why = compute_dtype("auto", "cpu")  # the header says which dtype --dtype auto took here, and why
    assert shown[0].startswith(f"rookworld train: 2 steps into {out} on cpu ({'bf16 autocast' if bf16 else 'fp32'}"
                               f"{why}")
    from rookworld.net.pretrained import from_pretrained

    n_params = sum(p.numel() for p in from_pretrained(tiny_dir).parameters())
    # The command sets its process's seed (and, here, malloc's habit; threads only where OMP_NUM_THREADS is unset)
    assert shown[1].startswith("process: torch's seed 3")
    assert shown[2] == f"model: {tiny_dir} ({n_params / 1e6:.1f}M parameters)"
    header = "\n".join(shown[:7])
    assert "rewards: Stockfish" in header and "(depth 4, 1 worker)" in header
    assert "prompts: 4 x group 4 per step, 80% P: / 20% A:, from generated positions" in header
    evals = [line for line in shown if line.startswith("eval at step")]
    figures = (r"P: legal best move \d+\.\d%, best move in top 5 \d+\.\d%, best move \d+\.\d% \(format \d+%, reward "
               r"[-0-9.]+\) \| A: next state exact \d+\.\d% \(format \d+%, reward [-0-9.]+\) \| [0-9.]+ s$")
    assert len(evals) == 3 and all(re.match(rf"eval at step {step} \| " + figures, line)
                                   for step, line in enumerate(evals)), evals
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]  # the evaluation before any update comes first
    assert all(r["time/eval"] > 0 and "eval/P/best_move_accuracy" in r for r in rows)


@pytest.mark.slow
def test_a_run_evaluates_its_last_step_and_keeps_each_position_s_outcome_through_a_resume(tiny_dir, tmp_path):
    """A run whose length is no multiple of --eval-every is evaluated at its last step too, so that its closing
    lines compare its end with its start; held-out.jsonl keeps each evaluation's outcome per position, and a
    resumed run drops the rows past its checkpoint, as metrics.jsonl does."""
    out = tmp_path / "last"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "3", "--eval-every", "2", "--eval-size", "3",
                              "--save-every", "2"))
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in metrics(out) if "time/eval" in r] == [0, 2, 3]
    assert "change from step 0 to 3, in points, on the same 3 positions" in proc.stderr
    held = [json.loads(line) for line in (out / "held-out.jsonl").read_text().splitlines()]
    assert [h["step"] for h in held] == [0, 2, 3]
    for h in held:
        row = next(r for r in metrics(out) if r["step"] == h["step"])
        for key in ("P/legal_best_move", "P/top5_accuracy", "P/best_move_accuracy", "A/next_state_exact"):
            assert set(h[key]) <= {"0", "1"} and len(h[key]) == 3
            assert h[key].count("1") / 3 == pytest.approx(row[f"eval/{key}"])
    shutil.rmtree(out / "checkpoints" / "step-000003")
    (out / "checkpoints" / "latest").write_text("step-000002")
    more = run_cli(["train", "--resume", str(out), "--steps", "4"])
    assert more.returncode == 0, more.stderr
    assert [json.loads(line)["step"] for line in (out / "held-out.jsonl").read_text().splitlines()] == [0, 2, 4]
    assert "change from step 0 to 4, in points, on the same 3 positions" in more.stderr


def test_a_cuda_device_without_a_gpu_is_one_line_for_every_command(tiny_dir, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for args in (train_args(tiny_dir, tmp_path / "x", "--steps", "1")[:-6] + ["--device", "cuda"],
                 ["eval", "--model", str(tiny_dir), "--device", "cuda", "--eval-size", "1"]):
        proc = run_cli(args)
        assert proc.returncode == 2, proc.stderr
        assert "CUDA is not available" in proc.stderr and len(lines_of(proc.stderr)) == 1, proc.stderr


@pytest.mark.slow
def test_a_typo_in_a_local_model_path_is_a_missing_directory_not_a_hub_problem(tmp_path):
    (tmp_path / "runs").mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for args in (["eval", "--model", "runs/sftt", "--device", "cpu"],
                 ["train", "--model", "runs/sftt", "--output-dir", "runs/new", "--device", "cpu"],
                 ["sft", "--model", "runs/sftt", "--data", "runs/none.jsonl", "--device", "cpu"]):
        proc = rookworld_process(*args, cwd=tmp_path, env=env)  # HF_HUB_OFFLINE is read on import
        assert proc.returncode == 2, proc.stderr
        # One line, said before any header, and no hub advice.
        assert lines_of(proc.stderr) == [f"rookworld {args[0]}: error: --model: no such model directory: runs/sftt"
                                         ], proc.stderr
        assert proc.stdout == ""
    # The default hub model out of reach: said before the header, and no run directory left behind.
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"))
    proc = rookworld_process("train", "--output-dir", "runs/hub", "--device", "cpu", cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "hub cannot be reached" in proc.stderr and len(lines_of(proc.stderr)) == 1
    # The cause first, then what trains without the hub, then how to fetch the model elsewhere.
    assert proc.stderr.startswith("rookworld train: error: Cannot load 'jrahn/RookWorld-LM-124M': the Hugging Face hub "
                                  "cannot be reached"), proc.stderr
    offline = proc.stderr.index("offline, `rookworld train --config chess-play` trains the small model that ships "
                                "with rookworld; or pass --model DIR")
    assert proc.stderr.index("hub cannot be reached") < offline < proc.stderr.index("hf download"), proc.stderr
    assert proc.stdout == "" and not (tmp_path / "runs" / "hub").exists()


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_files_and_directories_written_respect_the_umask(tiny_dir, tmp_path, umask):
    out = tmp_path / "run"
    old = os.umask(umask)  # the runs below (in this process) write under it
    try:
        proc = run_cli(train_args(tiny_dir, out, "--steps", "1"))
        assert proc.returncode == 0, proc.stderr
        positions = tmp_path / "positions.jsonl"
        assert run_cli(["positions", "--count", "3", "--out", str(positions)]).returncode == 0
    finally:
        os.umask(old)
    modes = _modes(out) | {"positions.jsonl": positions.stat().st_mode & 0o777}
    assert "checkpoints" in modes and any(name.endswith("model.safetensors") for name in modes)
    for name, mode in modes.items():
        expected = (0o777 if (out / name).is_dir() else 0o666) & ~umask
        if name.startswith("tensorboard"):  # TensorBoard writes its own files; only ask that none be private
            assert mode & 0o044 == 0o044 & ~umask, name
            continue
        assert mode == expected, f"{name}: {oct(mode)}, expected {oct(expected)}"


def test_tensorboard_missing_is_said_once(tmp_path):
    """With tensorboard not importable the run says so once, and metrics.jsonl still has everything."""
    code = ("import sys; sys.modules['torch.utils.tensorboard'] = None\n"
            "from rookworld.harness.runlog import RunLog\n"
            f"log = RunLog({str(tmp_path)!r}, 2)\nlog.start(0)\nlog.step({{'step': 1, 'x': 1.0}}, log_line=False)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("TensorBoard is not installed") == 1
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "x": 1.0}


def test_help_says_each_default_once():
    proc = run_cli(["train", "--help"])
    assert proc.returncode == 0
    # One option per entry: from "  --flag" to the next.
    entries = re.split(r"\n  (?=-)", proc.stdout)
    assert len(entries) > 60
    for entry in entries:
        assert entry.count("default") <= 1, entry
    assert "(default: None)" not in proc.stdout


def test_group_size_says_the_real_minimum():
    from rookworld.settings.config import ConfigError, TrainConfig

    for size in (0, 1):
        with pytest.raises(ConfigError, match="--group-size must be >= 2"):
            TrainConfig(group_size=size).validate()


# -- positions files and eval --------------------------------------------------------------------------------------

def test_finished_games_in_a_positions_file_are_left_out_with_a_warning(tiny_dir, tmp_path):
    data = tmp_path / "positions.fen"
    data.write_text("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1\n"
                    "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3\n"  # fool's mate: mated
                    "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1\n")  # stalemate
    proc = run_cli(["eval", "--model", str(tiny_dir), "--data", str(data), "--device", "cpu",
                    "--stockfish-depth", "4", "--max-new-tokens", "4"])
    assert proc.returncode == 0, proc.stderr
    assert f"left out 2 of 3 positions that are finished games (checkmate or stalemate, no legal move): {data}:2, " \
           f"{data}:3" in proc.stderr
    train = run_cli(train_args(tiny_dir, tmp_path / "run", "--steps", "1", "--data", str(data)))
    assert train.returncode == 0, train.stderr
    assert "warning: --data" in train.stderr and "left out 2 of 3 positions" in train.stderr


def test_eval_takes_a_run_directory_and_defaults_to_the_training_held_out_positions(tiny_dir, tmp_path):
    out = tmp_path / "run"
    assert run_cli(train_args(tiny_dir, out, "--steps", "1", "--eval-every", "1", "--eval-size", "3")).returncode == 0
    result = tmp_path / "eval.json"
    proc = run_cli(["eval", "--model", str(out), "--device", "cpu", "--eval-size", "3", "--stockfish-depth", "4",
                    "--seed", "3", "--max-new-tokens", "12", "--decode-batch-size", "64", "--out", str(result)])
    assert proc.returncode == 0, proc.stderr
    got = json.loads(result.read_text())
    # The run's own model (kept at the top of its directory), named with its step in the header and the JSON.
    assert got["model"] == str(out) and got["model_step"] == 1
    assert proc.stderr.startswith(f"rookworld eval: {out} (step 1) on cpu\nsuites best-move; greedy, up to 12 "
                                  "tokens\nbest-move: 3 positions (generated held-out positions, seed 3), tasks P,A"), \
        proc.stderr
    assert "best-move [" in proc.stderr  # the progress line
    assert got["data"] == "generated (seed 3)"
    # The same positions, model and decoding as training's evaluation: the same figures.
    row = metrics(out)[-1]
    for task in ("P", "A"):
        for key, value in got["suites"]["best-move"]["sections"][task].items():
            if f"eval/{task}/{key}" in row and value is not None:
                assert row[f"eval/{task}/{key}"] == pytest.approx(value), (task, key)


# -- the vocabulary comes with the model --------------------------------------------------------------------------

def offline_env(tmp_path) -> dict:
    """No vocabulary file named, an empty tiktoken cache, and no way to download one."""
    env = {k: v for k, v in os.environ.items() if k != "ROOKWORLD_TIKTOKEN_FILE"}
    env.update(TIKTOKEN_CACHE_DIR=str(tmp_path / "empty-cache"), HF_HUB_OFFLINE="1", HTTPS_PROXY="http://127.0.0.1:9",
               HTTP_PROXY="http://127.0.0.1:9")
    return env


@pytest.mark.slow
def test_a_checkpoint_carries_its_vocabulary_and_loads_offline(tiny_dir, tmp_path):
    out = tmp_path / "run"
    assert run_cli(train_args(tiny_dir, out, "--steps", "1")).returncode == 0
    ckpt = out / "checkpoints" / "step-000001"
    assert (ckpt / "vocab.json").is_file() and (ckpt / "merges.txt").is_file()
    # transformers reads the same vocabulary from them (an independent implementation of GPT-2's BPE).
    transformers = pytest.importorskip("transformers")
    from rookworld.net.tokenizer import get_tokenizer

    hf = transformers.AutoTokenizer.from_pretrained(ckpt)
    ours = get_tokenizer()
    texts = ["P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34     M: a4a3 c8f5  E: -3.06 -2.82  B: h7f6",
             "A: r1bqkbnr/pp1ppppp/2n5/2p5/4P3/2N3P1/PPPP1P1P/R1BQKBNR b KQkq - 0 3+f7f6+e2e4 c7c5+",
             "Unicode: déjà vu, 象棋, emoji 😀, tabs\tand  spaces\n\nnew lines"]
    for text in texts:
        assert hf(text)["input_ids"] == ours.encode(text)
    # Offline, with no vocabulary file named and none cached, the checkpoint alone is enough.
    env = offline_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "rookworld", "eval", "--model", str(ckpt), "--device", "cpu",
                           "--eval-size", "2", "--tasks", "A", "--max-new-tokens", "8"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # A model directory without the files: the copy shipped with the package serves, offline too.
    proc = subprocess.run([sys.executable, "-m", "rookworld", "eval", "--model", str(tiny_dir), "--device", "cpu",
                           "--eval-size", "2", "--tasks", "A", "--max-new-tokens", "8"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr


def test_vocabulary_files_that_are_not_gpt2s_are_refused(tmp_path):
    from rookworld.net.tokenizer import TokenizerUnavailableError, get_tokenizer, read_hf_vocabulary

    get_tokenizer().save_pretrained(tmp_path)
    merges = (tmp_path / "merges.txt").read_text().splitlines()
    merges[10], merges[11] = merges[11], merges[10]  # two merges out of rank order
    (tmp_path / "merges.txt").write_text("\n".join(merges) + "\n")
    with pytest.raises(TokenizerUnavailableError, match="does not make token"):
        read_hf_vocabulary(tmp_path)
    (tmp_path / "vocab.json").write_text('{"a": 0}')
    with pytest.raises(TokenizerUnavailableError, match="not a GPT-2 vocabulary"):
        read_hf_vocabulary(tmp_path)


# -- the README -------------------------------------------------------------------------------------------------------

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SNIPPETS = [(doc.name, k, s) for doc in DOCUMENTS
            for k, s in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S))]
#: The extras a snippet may import, by the module it imports: run where the extra is installed (CI installs each).
EXTRA_MODULES = ("trl", "verifiers", "openenv")
#: What a snippet that talks to a running `rookworld serve` calls: tests/test_integrations_openenv.py runs those
#: against a real server.
SERVED = "ChessEnvClient("


def test_the_documents_have_their_snippets():
    names = {name for name, _, _ in SNIPPETS}
    assert {"README.md", "training.md", "using.md", "chess.md", "integrations.md"} <= names
    readme = [s for name, _, s in SNIPPETS if name == "README.md"]
    # The README's integrations: scoring without any trainer, then TRL, verifiers and OpenEnv, one snippet each.
    for needed in ("RewardScorer(", "rookworld.integrations.trl", "rookworld.integrations.verifiers", SERVED):
        assert sum(needed in s for s in readme) == 1, needed


@pytest.mark.slow
@pytest.mark.parametrize("name, k, snippet", [s for s in SNIPPETS if SERVED not in s[2]],
                         ids=[f"{name}-{k}" for name, k, s in SNIPPETS if SERVED not in s])
def test_every_python_snippet_of_the_documents_runs_as_written(name, k, snippet, tiny_dir, tmp_path, monkeypatch):
    for module in EXTRA_MODULES:
        if re.search(rf"^\s*(from|import) ({module}|rookworld\.integrations\.{module})\b", snippet, re.M):
            pytest.importorskip(module, reason=f"pip install 'rookworld[{module}]'")
    monkeypatch.chdir(tmp_path)  # where a user who ran `rookworld sft --output-dir runs/sft` stands
    shutil.copytree(tiny_dir, tmp_path / "runs" / "sft")
    for shipped in ("models/chess-cpu-sft", "data/chess-cpu-held-out.jsonl"):  # what a clone's root holds
        (tmp_path / shipped).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (REPO / shipped).is_dir() else shutil.copy)(REPO / shipped, tmp_path / shipped)
    exec(compile(snippet, name, "exec"), {})
