"""Faults and hostile input (issue 35): each case gives the right result or one line saying what is wrong and what
to do, with a non-zero exit status; no command runs code from a file it reads."""

from __future__ import annotations

import json
import signal
import os
import random
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from rookworld.harness import checkpoint

from conftest import REPO
from test_trainer import run_cli, train_args


class RunsAShellCommand:
    """What a malicious trainer_state.pt holds: unpickling it calls os.system."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_resume_never_runs_code_from_the_run_directory(tiny_dir, tmp_path):
    out = tmp_path / "run"
    first = run_cli(train_args(tiny_dir, out, "--steps", "1"))
    assert first.returncode == 0, first.stderr
    saved = checkpoint.resolve_checkpoint(out)
    state = checkpoint.load_state(saved)
    marker = tmp_path / "pwned"
    torch.save({**state, "payload": RunsAShellCommand(f"touch {marker}")}, saved / checkpoint.STATE_FILE)

    resumed = run_cli(["train", "--resume", str(out), "--steps", "2"])
    assert not marker.exists(), "the pickle's code ran"
    assert resumed.returncode != 0 and "Traceback" not in resumed.stderr, resumed.stderr
    assert "could run code" in resumed.stderr and str(saved / checkpoint.STATE_FILE) in resumed.stderr
    assert f"--model {saved}" in resumed.stderr, "it says what to do instead"


def test_training_state_round_trips_without_the_full_unpickler_and_old_checkpoints_still_load(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    new = checkpoint.rng_state()
    old = {**new, "numpy": np.random.get_state()}  # the same state, numpy's key as the array older checkpoints hold
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    state = {"step": 7, "best_reward": -float("inf"),
             "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4)}},
                           "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0]}]}}
    for name, rng in (("new", new), ("old", old)):
        d = tmp_path / name
        d.mkdir()
        torch.save({**state, "rng": rng}, d / checkpoint.STATE_FILE)
        loaded = checkpoint.load_state(d)
        assert loaded["step"] == 7 and loaded["best_reward"] == -float("inf")
        assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
        random.seed(9), np.random.seed(9), torch.manual_seed(9)
        checkpoint.set_rng_state(loaded["rng"])
        assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected, name


@pytest.mark.slow
def test_a_second_run_into_a_directory_in_use_is_refused_naming_the_first(tiny_dir, tmp_path):
    """Two runs together into one --output-dir: the second is refused (before writing anything) with the first's
    process named; once the first has ended, however it ended, the directory is free again."""
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "rookworld", *train_args(tiny_dir, out, "--steps", "200")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists():  # the first run is past its start-up and stepping
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
            time.sleep(0.2)
        second = run_cli(train_args(tiny_dir, out, "--steps", "1", "--seed", "4"))
        assert second.returncode != 0 and "Traceback" not in second.stderr, second.stderr
        assert f"is in use by another run (rookworld train, process {first.pid}" in second.stderr, second.stderr
        steps = len((out / "metrics.jsonl").read_text().splitlines())
    finally:
        first.kill()  # SIGKILL: no chance to release anything; the kernel drops the lock
        first.wait()
    assert steps >= 1
    again = run_cli(train_args(tiny_dir, out, "--steps", "1", "--overwrite"))
    assert again.returncode == 0, again.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1], "one run's metrics, not two interleaved"


def test_an_output_directory_that_cannot_be_written_is_one_line(tiny_dir, tmp_path):
    if os.geteuid() == 0:  # root writes anywhere: a file where the directory should be does the same for root
        target = tmp_path / "a_file"
        target.write_text("")
        out = target / "run"
    else:
        locked = tmp_path / "read_only"
        locked.mkdir(mode=0o555)
        out = locked / "run"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "1"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"--output-dir {out}: cannot write there" in proc.stderr


def test_a_bad_eval_data_file_stops_the_run_before_it_starts(tiny_dir, tmp_path):
    """It was read at the first evaluation (step 50 by default, before the first checkpoint) and crashed there."""
    bad = tmp_path / "held_out.jsonl"
    bad.write_text('{"fen": "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"}\n{"fen": "not a fen"}\n')
    out = tmp_path / "run"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "60", "--eval-data", str(bad)))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{bad}:2" in proc.stderr and not out.exists()


def test_inf_and_nan_settings_are_refused_from_flags_and_toml(tiny_dir, tmp_path):
    (tmp_path / "lr.toml").write_text("[train]\nlr = inf\n")
    for extra in (["--lr", "inf"], ["--lr", "nan"], ["--beta=-inf"], ["--config", str(tmp_path / "lr.toml")]):
        proc = run_cli(train_args(tiny_dir, tmp_path / "run", "--steps", "1", *extra))
        assert proc.returncode == 2 and "must be a finite number" in proc.stderr, (extra, proc.stderr)
        assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


def test_a_run_whose_loss_stops_being_finite_stops_without_applying_the_step(tiny_dir, tmp_path):
    """lr 1e30: the first step sends the weights to about 1e30, the second step's forward overflows. The run stops
    there with one line and a non-zero status; the step is not applied, nothing is saved after it."""
    out = tmp_path / "run"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "5", "--lr", "1e30", "--warmup-steps", "0",
                              "--save-every", "1", "--entropy-coef", "0.01"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "stopped at step 2: the " in proc.stderr and "not finite" in proc.stderr, proc.stderr
    assert f"--resume {out} --lr X" in proc.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1] and [p.name for p in checkpoint.list_checkpoints(out)] == ["step-000001"]


def test_a_torn_last_line_of_metrics_is_dropped_on_resume(tiny_dir, tmp_path):
    """What a full disk or a kill in mid-write leaves: the resume drops the torn line with a warning (it was a
    JSONDecodeError that stopped the resume)."""
    out = tmp_path / "run"
    assert run_cli(train_args(tiny_dir, out, "--steps", "2", "--save-every", "1")).returncode == 0
    metrics = out / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 3, "loss": 0.1')
    resumed = run_cli(["train", "--resume", str(out), "--steps", "3"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"warning: {metrics}: dropped 1 line that was cut short" in resumed.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]


def test_ask_with_a_stockfish_path_that_is_not_there_is_an_error(tiny_dir, tmp_path):
    proc = run_cli(["ask", "--model", str(tiny_dir), "--device", "cpu", "--stockfish-path", str(tmp_path / "nope"),
                    "8/8/8/8/8/8/8/K6k w - - 0 1"])
    assert proc.returncode == 2 and str(tmp_path / "nope") in proc.stderr and "Traceback" not in proc.stderr, \
        proc.stderr


def test_a_seed_past_64_bits_and_a_config_that_is_not_a_toml_file_are_one_line(tiny_dir, tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)))
    for extra, said in ((["--seed", str(2**64)], "--seed must be between 0 and 2^63 - 1"),
                        (["--config", str(tmp_path)], "is a directory"),
                        (["--config", str(binary)], "is not a text file")):
        proc = run_cli(train_args(tiny_dir, tmp_path / "run", "--steps", "1", *extra))
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, (extra, proc.stderr)


def test_max_new_tokens_beyond_the_model_s_context_is_one_line(tiny_dir):
    proc = run_cli(["eval", "--model", str(tiny_dir), "--device", "cpu", "--eval-size", "2", "--max-new-tokens",
                    "5000", "--stockfish-depth", "4"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "exceed the model's context of" in proc.stderr and "give --max-new-tokens" in proc.stderr


# -- Ctrl-C: an evaluation stops at once, a second Ctrl-C keeps the last finished step ---------------------------

class RandomRewards:
    """Rewards from the completions' text (so a resumed run sees the same ones), with spread; `interrupt_at` sends
    this process SIGINT `times` times while that step is being scored, as a user's Ctrl-C during the rollout."""

    def __init__(self, interrupt_at: int | None = None, times: int = 2):
        self.calls, self.interrupt_at, self.times = 0, interrupt_at, times

    def prefetch(self, prompts):
        pass

    def __call__(self, prompts, completions):
        from rookworld.chess.rewards import Scores

        self.calls += 1
        if self.calls == self.interrupt_at:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)
        r = np.array([(sum(map(ord, c)) % 97) / 97 for c in completions])
        return Scores(r, np.array([p.task for p in prompts]), np.ones(len(r), dtype=bool))


def _trainer(out, *, steps, resume=None, reward=None, **kw):
    from rookworld.grpo.trainer import Trainer
    from rookworld.net.tokenizer import get_tokenizer
    from rookworld.settings.config import TrainConfig
    from conftest import tiny_gpt
    from test_trainer import FixedPrompts

    settings = dict(steps=steps, prompts_per_step=2, group_size=4, max_new_tokens=4, warmup_steps=0, eval_every=0,
                    save_every=0, sample_every=0, output_dir=str(out), compile=False, log_every=100, beta=0.0,
                    baseline="ema", lr=1e-3, device="cpu", seed=5, resume=str(resume) if resume else None)
    cfg = TrainConfig(**(settings | kw)).validate()
    policy = None if resume else tiny_gpt(seed=1, scale=2.0)
    return Trainer(cfg, policy=policy, tokenizer=get_tokenizer(), reward_fn=reward or RandomRewards(),
                   prompts=FixedPrompts("P: x", 2), stream=open(os.devnull, "w"))


def test_a_second_ctrl_c_during_the_rollout_keeps_the_last_step_and_the_resumed_run_is_the_unbroken_one(tmp_path):
    """The second Ctrl-C used to abort without saving (60 steps lost in issue 35's try). Now a step that has not
    changed a weight is dropped and the one before it saved, with the generators and EMA baselines it ended with."""
    straight = _trainer(tmp_path / "straight", steps=4)
    straight.train()
    straight.close()
    broken = _trainer(tmp_path / "broken", steps=4, reward=RandomRewards(interrupt_at=3))
    broken.train()
    broken.close()
    assert broken.run.interrupted and broken.run.step == 2
    assert checkpoint.list_checkpoints(tmp_path / "broken")[-1].name == "step-000002"
    resumed = _trainer(tmp_path / "resumed", steps=4, resume=tmp_path / "broken")
    resumed.train()
    resumed.close()
    a, b = straight.run.policy.state_dict(), resumed.run.policy.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.objective.baselines == straight.objective.baselines


def test_ctrl_c_during_an_evaluation_stops_it_at_once_and_saves_the_step(tmp_path):
    trainer = _trainer(tmp_path / "run", steps=5, eval_every=2)
    started = []

    def slow_evaluation():  # the one at step 0 quick, the next of a few minutes and the user's Ctrl-C a moment into it
        started.append(time.perf_counter())
        if len(started) == 1:
            return {"eval/P/legal_best_move": 0.5}
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(120)
        return {"eval/P/legal_best_move": 1.0}

    trainer.evaluate = slow_evaluation
    trainer.train()
    trainer.close()
    assert time.perf_counter() - started[1] < 20, "it waited for the evaluation"
    assert trainer.run.interrupted and trainer.run.step == 2
    assert checkpoint.list_checkpoints(tmp_path / "run")[-1].name == "step-000002"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and [r["step"] for r in rows if "eval/P/legal_best_move" in r] == [0]


# -- A full disk, a save killed midway, SIGTERM while writing, outputs that cannot be written -----------------------

def _rookworld(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "rookworld", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MB file system of its own (tmpfs), where the machine lets the tests mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small file system here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(path, leave: int) -> None:
    """Fills the file system of `path` with it, a megabyte at a time until the system says it is full (whatever
    the run writes meanwhile), then leaves `leave` bytes free."""
    try:
        with open(path, "wb") as f:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
    except OSError:
        pass
    os.truncate(path, max(0, path.stat().st_size - leave))


def test_a_full_disk_during_a_save_is_one_line_and_the_run_resumes_once_there_is_room(tiny_dir, small_disk):
    """torch's zip writer said `enforce fail ... unexpected pos 11200 vs 11092` with a traceback. The disk had room
    for the run's saves when it started (it is checked: next test), and something else filled it meanwhile."""
    out = small_disk / "run"
    subprocess.run(["mount", "-o", "remount,size=80m", str(small_disk)], check=True)
    proc = _rookworld(*train_args(tiny_dir, out, "--steps", "200", "--save-every", "1", "--keep-checkpoints", "1"))
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (out / "checkpoints" / "step-000001").is_dir():
        time.sleep(0.02)
    fill(small_disk / "ballast", leave=1_000_000)  # another program's, while the run saves on
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "Traceback" not in err, err
    failed = int(re.search(r"could not save step (\d+)", err).group(1))
    assert "the disk is full" in err and f"rookworld train --resume {out}" in err
    (small_disk / "ballast").unlink()
    again = run_cli(["train", "--resume", str(out), "--steps", str(failed + 1)])
    assert again.returncode == 0, again.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, failed + 2))  # the lost step again, then one more


@pytest.mark.parametrize("keep, save_every", [(1, 1), (3, 0)])
def test_a_disk_without_room_for_the_run_s_saves_is_refused_before_the_first_step(tiny_dir, small_disk, keep,
                                                                                      save_every):
    """It trained every step (90 s in the report) and then could save none of them; and with room for one
    checkpoint but not two, step 2 was trained and never saved (issue 71). The check counts the saves at their
    fullest: 40 MB take one save of the tiny model (about 26 MB: 6.5 MB of weights, 3 of them a checkpoint, and the
    model beside it) but not two checkpoints at once and the model twice (about 52 MB)."""
    out = small_disk / "run"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "3", "--save-every", str(save_every), "--keep-checkpoints",
                              str(keep)))
    if save_every == 0:  # one save, at the end: it fits
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line, = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert re.search(r"MB free and the run's saves take about 5\d MB more at their fullest \(2 checkpoints at once",
                     line), line
    assert "start again once there is room" in line
    assert not (out / "metrics.jsonl").exists() or (out / "metrics.jsonl").read_text() == ""
    (small_disk / "ballast").write_bytes(b"\0" * 30_000_000)  # 10 MB left: not even one save
    proc = run_cli(train_args(tiny_dir, small_disk / "other", "--steps", "3", "--save-every", "0"))
    assert proc.returncode == 2 and re.search(r"the run's saves take about 2\d MB more at their fullest \(1 checkpoint "
                                              r"at once", proc.stderr), proc.stderr


def test_the_room_a_run_s_saves_take_at_their_fullest_by_hand():
    """Weights of 10 bytes: a checkpoint takes 30 (the weights and two moments), the model beside them 10."""
    assert checkpoint.room_needed(10, saves=3, kept=0, keep=1, model_there=False) == (2 * 30 + 2 * 10, 2)
    assert checkpoint.room_needed(10, saves=1, kept=0, keep=3, model_there=False) == (30 + 10, 1)
    assert checkpoint.room_needed(10, saves=2, kept=0, keep=3, model_there=False) == (2 * 30 + 2 * 10, 2)
    # resumed with 3 kept of 3: one more at once before the oldest goes, and the model's new copy beside it
    assert checkpoint.room_needed(10, saves=5, kept=3, keep=3, model_there=True) == (30 + 10, 4)
    assert checkpoint.room_needed(10, saves=1, kept=1, keep=3, model_there=True) == (30 + 10, 2)
    # --keep-every: each stage kept for good is one checkpoint more at the fullest
    assert checkpoint.room_needed(10, saves=6, kept=0, keep=3, model_there=False, stages=2) == (6 * 30 + 2 * 10, 6)


def test_the_stages_keep_every_keeps_by_hand():
    """Steps 0 to 3,000 saved every 50 and kept every 500: 500, 1000, ..., 3000; from step 1,200: 1500 to 3000."""
    assert checkpoint.kept_stages(0, 3000, keep_every=500) == 6
    assert checkpoint.kept_stages(1200, 3000, keep_every=500) == 4
    assert checkpoint.kept_stages(1000, 1000, keep_every=500) == 0
    assert checkpoint.kept_stages(0, 3000, keep_every=0) == 0


@pytest.mark.slow
def test_what_a_save_killed_midway_left_is_removed_by_the_next_run(tiny_dir, tmp_path):
    out = tmp_path / "run"
    for _ in range(5):  # a save of the tiny model takes a fraction of a second: the kill may miss it
        proc = _rookworld(*train_args(tiny_dir, out, "--steps", "10000", "--save-every", "1", "--overwrite"))
        deadline, caught = time.time() + 120, []
        while time.time() < deadline and not caught and proc.poll() is None:
            if checkpoint.list_checkpoints(out):  # a save after the first, so that there is a run to resume
                caught = list((out / "checkpoints").glob(".*"))
        proc.kill()
        proc.communicate()
        if caught and list((out / "checkpoints").glob(".*")):
            break
    else:
        pytest.skip("no save was caught midway in 5 tries")
    again = run_cli(["train", "--resume", str(out), "--steps", str(checkpoint.step_of(checkpoint.resolve_checkpoint(
        out)) + 1)])
    assert again.returncode == 0, again.stderr
    assert "removed what a save cut short left" in again.stderr
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]


def test_sigterm_while_positions_writes_leaves_no_temporary_file(tmp_path):
    """It left a hidden temporary file beside --out (1 GB after two minutes in issue 35's try)."""
    out = tmp_path / "positions.jsonl"
    proc = _rookworld("positions", "--count", "5000000", "--quiet", "--out", out)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(".positions.jsonl.*")):
        time.sleep(0.05)
    assert list(tmp_path.glob(".positions.jsonl.*")), "the file was being written"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "terminated" in stderr and "Traceback" not in stderr, stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["a directory", "under a file", "missing directory"])
def test_an_output_file_that_cannot_be_written_is_refused_before_the_work(tiny_dir, tmp_path, where):
    target = {"a directory": tmp_path, "under a file": tmp_path / "f" / "out.json",
              "missing directory": tmp_path / "no" / "out.json"}[where]
    (tmp_path / "f").write_text("")
    for args in (["positions", "--count", "3", "--out", target], ["plot", str(tmp_path), "--out", target],
                 ["eval", "--model", tiny_dir, "--out", target]):
        proc = run_cli(list(map(str, args)))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and f"--out {target}" in proc.stderr, proc.stderr


def test_plot_of_a_binary_metrics_file_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(bytes(random.Random(0).randrange(256) for _ in range(3000)))
    proc = run_cli(["plot", str(run), "--out", str(tmp_path / "x.png")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "metrics.jsonl: none of its" in proc.stderr


@pytest.mark.parametrize("odd", ['"5"', "null", "[5]", "1e308", "-3", "true", "1" + "0" * 400])
def test_plot_leaves_out_a_row_whose_step_is_no_step_and_a_value_no_axis_can_hold(tmp_path, odd):
    """A step that was a string, null, a list or 1e308, and values of 400 digits, were tracebacks (issue 71): the
    row (or the value) is left out, the rest plots; a file of nothing else is one line."""
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    good = [json.dumps({"step": s, "reward/P/mean": 0.1 * s, "kl/mean": 0.01 * s}) for s in range(1, 4)]
    odd_rows = ['{"step": %s, "reward/P/mean": 0.5}' % odd, '{"step": 4, "reward/P/mean": 1%s}' % ("0" * 400)]
    (run / "metrics.jsonl").write_text("\n".join(good + odd_rows) + "\n")
    proc = run_cli(["plot", str(run), "--out", str(tmp_path / "x.png")])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    (run / "metrics.jsonl").write_text("\n".join(odd_rows[:1]) + "\n")
    proc = run_cli(["plot", str(run), "--out", str(tmp_path / "y.png")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "with a step" in proc.stderr, proc.stderr


# -- Model directories that cannot be loaded ---------------------------------------------------------------------

def _model_copy(tiny_dir, tmp_path, name):
    import shutil

    target = tmp_path / name
    shutil.copytree(tiny_dir, target)
    return target


FEN = "4k3/8/8/8/8/8/8/4K3 w - - 0 1"


def test_a_model_file_cut_short_empty_or_corrupt_is_one_line(tiny_dir, tmp_path):
    weights = (tiny_dir / "model.safetensors").read_bytes()
    cases = {"empty": b"", "cut short": weights[:1000], "corrupt header": weights[:8] + b"x" * 32 + weights[40:]}
    for name, content in cases.items():
        model = _model_copy(tiny_dir, tmp_path, name.replace(" ", "_"))
        (model / "model.safetensors").write_bytes(content)
        for args in (["ask", "--model", str(model), FEN], ["eval", "--model", str(model), "--suite", "selfplay",
                                                           "--games", "1"], train_args(model, tmp_path / "run")):
            proc = run_cli(args)
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, (name, proc.stderr)
            assert f"{model / 'model.safetensors'} cannot be read" in proc.stderr, proc.stderr


def test_a_config_that_is_not_a_gpt2_object_is_one_line(tiny_dir, tmp_path):
    for i, text in enumerate(["[1, 2]", "{not json", '{"n_layer": "two"}', '{"n_embd": 100, "n_head": 3}']):
        model = _model_copy(tiny_dir, tmp_path, f"config{i}")
        (model / "config.json").write_text(text)
        proc = run_cli(["ask", "--model", str(model), FEN])
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (text, proc.stderr)
        assert str(model / "config.json") in proc.stderr


def test_a_pickled_bin_is_refused_without_running_it_or_suggesting_weights_only_false(tiny_dir, tmp_path):
    import pickle

    model = _model_copy(tiny_dir, tmp_path, "pickled")
    (model / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    (model / "pytorch_model.bin").write_bytes(pickle.dumps(RunsAShellCommand(f"touch {marker}")))
    proc = run_cli(["ask", "--model", str(model), FEN])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert not marker.exists()
    assert "could run code" in proc.stderr and "weights_only=False" not in proc.stderr


def test_a_folder_of_runs_as_model_names_the_models_in_it(tiny_dir, tmp_path):
    runs = tmp_path / "runs"
    for name in ("grpo-a", "sft-b"):
        _model_copy(tiny_dir, runs, name)
    proc = run_cli(["ask", "--model", str(runs), FEN])
    assert proc.returncode == 2, proc.stderr
    assert "the models in it: grpo-a, sft-b" in proc.stderr and f"--model {runs / 'grpo-a'}" in proc.stderr


def test_a_config_with_settings_outside_its_table_is_refused(tiny_dir, tmp_path):
    """`lr = 0.1` above a [train] table was dropped without a word, and the run went on at the default lr."""
    config = tmp_path / "run.toml"
    config.write_text("lr = 0.1\nseed = 4\n[train]\nsteps = 2\n")
    proc = run_cli(train_args(tiny_dir, tmp_path / "run", "--config", str(config)))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "lr, seed are outside its [train] table" in proc.stderr and not (tmp_path / "run").exists()
    config.write_text("lr = 0.1\nsteps = 1\n")  # all at the top level: read as they are
    assert run_cli(train_args(tiny_dir, tmp_path / "run", "--config", str(config))).returncode == 0


# -- What a newcomer types -----------------------------------------------------------------------------------------

def test_an_unquoted_fen_is_told_to_be_quoted(tiny_dir):
    """It was `unrecognized arguments: - - 0 1 (did you mean -h?)`."""
    board = "4k3/8/8/8/8/8/8/4K3"
    for args in (["ask", "--model", str(tiny_dir), board, "w", "-", "-", "0", "1"], ["play", "--fen", board, "w",
                                                                                    "-", "-", "0", "1"]):
        proc = run_cli(args)
        assert proc.returncode == 2, proc.stderr
        assert f'quote it, as in "{board} w - - 0 1"' in proc.stderr and "-h?" not in proc.stderr


def test_another_trainer_s_long_flag_is_pointed_at_rookworld_s():
    proc = run_cli(["train", "--learning-rate", "3e-6"])
    assert proc.returncode == 2 and "(did you mean --lr?)" in proc.stderr, proc.stderr


def test_a_preset_without_its_data_names_every_missing_file_and_the_commands_that_make_them(tmp_path):
    """It said only `--eval-data: no such file: held_out.jsonl`, not train.jsonl nor how to make them."""
    proc = run_cli(["sft", "--config", "cpu-demo"], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "its data is not here (train.jsonl, held_out.jsonl)" in proc.stderr
    assert "rookworld positions --count 2000 --seed 1 --annotate --stockfish-depth 8 --out train.jsonl" in proc.stderr
    assert "--out held_out.jsonl" in proc.stderr
    # The held-out positions ship in the clone's data/, found from here; the command that makes the training
    # positions leaves them out, named where they are.
    chain = run_cli(["sft", "--config", "chess-cpu"], cwd=tmp_path).stderr
    assert "its data is not here (chess-cpu-train.jsonl)" in chain, chain
    held_out = REPO / "data" / "chess-cpu-held-out.jsonl"
    assert f"--exclude {held_out} --out chess-cpu-train.jsonl" in chain, chain


def test_a_read_only_file_system_is_one_line_in_every_command_that_writes(tiny_dir, tmp_path):
    """Root writes through permission bits, so the read-only directory is a file system mounted read-only."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mount)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a file system here (needs root)")
    try:
        data = tmp_path / "p.fen"
        data.write_text("4k3/8/8/8/8/8/8/4K3 w - - 0 1\n")
        run = tmp_path / "run"
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
        for args in (train_args(tiny_dir, mount / "run", "--steps", "1"),
                     ["sft", "--model", tiny_dir, "--data", REPO / "data" / "chess-cpu-held-out.jsonl", "--output-dir",
                      mount / "run", "--steps", "1"],
                     ["eval", "--model", tiny_dir, "--data", data, "--tasks", "A", "--out", mount / "r.json"],
                     ["positions", "--count", "3", "--out", mount / "p.jsonl"],
                     ["plot", run, "--out", mount / "c.png"],
                     ["positions", "--count", "3", "--annotate", "--stockfish-cache", mount / "c.sqlite", "--out",
                      tmp_path / "p.jsonl"]):
            proc = run_cli(list(map(str, args)))
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args[0], proc.stderr)
            assert proc.stderr.count("\n") == 1 and str(mount) in proc.stderr, (args[0], proc.stderr)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_deeply_nested_json_line_is_a_bad_line_not_a_recursion_error(tiny_dir, tmp_path):
    data = tmp_path / "nested.jsonl"
    data.write_text("4k3/8/8/8/8/8/8/4K3 w - - 0 1\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    proc = run_cli(["eval", "--model", str(tiny_dir), "--data", str(data), "--tasks", "A"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and f"{data}:2" in proc.stderr, proc.stderr
    proc = run_cli(["eval", "--model", str(tiny_dir), "--data", str(data), "--tasks", "A", "--skip-bad"])
    assert proc.returncode == 0 and f"skipped 1 bad lines of {data}" in proc.stderr, proc.stderr
    proc = run_cli(["sft", "--model", str(tiny_dir), "--data", str(data), "--output-dir", str(tmp_path / "s")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and f"{data}:1" in proc.stderr, proc.stderr


def test_an_opponent_strength_outside_the_engine_s_range_is_refused_before_the_model_loads(tiny_dir):
    """Stockfish clamps UCI_Elo 5000 to its maximum without a word: the games were against another opponent."""
    proc = run_cli(["eval", "--model", str(tiny_dir), "--suite", "vs-stockfish", "--opponent-elo", "5000"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, "refused before the model's header line"
    assert "--opponent-elo" in proc.stderr and "UCI_Elo from" in proc.stderr and "not 5000" in proc.stderr


def test_a_step_whose_weights_leave_their_range_is_refused_and_the_cli_saves_nothing(tiny_dir, tmp_path):
    """Finite gradients, finite loss, and still the update carries a weight past float32's range: the step stops
    the run (Diverged) rather than leave a NaN model to save. A learning rate that can only overflow (--lr 1e308)
    is refused before any work, and a warning's ratio of rates cannot overflow."""
    from rookworld.harness.optimizer import Diverged, step_if_finite

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    with torch.no_grad():
        layer.weight.fill_(3.3e38)  # near float32's largest, 3.4e38
    optimizer = torch.optim.AdamW(layer.parameters(), lr=3e37, weight_decay=0.0)
    layer(torch.ones(2, 4)).clamp(-1, 1).sum().backward()
    layer.weight.grad.fill_(-1.0)  # every weight pushed up by about lr
    with pytest.raises(Diverged, match=r"the weights this step made are not finite \(the learning rate was 3e\+37\)"):
        step_if_finite(optimizer, torch.tensor(1.0), torch.tensor(0.5))
    # A sound step on finite weights passes.
    fine = torch.nn.Linear(4, 4)
    good = torch.optim.AdamW(fine.parameters(), lr=1e-3)
    fine(torch.ones(2, 4)).sum().backward()
    step_if_finite(good, torch.tensor(1.0), torch.tensor(0.5))

    # A learning rate that can only overflow is refused by its name, on every route (a flag, a TOML file).
    (tmp_path / "lr.toml").write_text("[train]\nlr = 1e308\n")
    for extra in (["--lr", "1e308"], ["--value-lr", "1e31", "--advantage", "gae"],
                  ["--config", str(tmp_path / "lr.toml")]):
        out = tmp_path / "run"
        proc = run_cli(train_args(tiny_dir, out, "--steps", "2", "--warmup-steps", "0", *extra))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "must be at most 1e+30, got 1e+" in proc.stderr and "overflow float32" in proc.stderr, proc.stderr
        assert not out.exists()
    # Below the bound, a warning's ratio is said without overflowing (10^34, not inf).
    from rookworld.settings.presets import schedule_warnings

    assert "--lr 1e-300 is 10^296 times below the 0.0001" in schedule_warnings("train", 1e-300, 0, 5, 1_000_000)[0]
    assert "--lr 1e+30 is 10^34 times above" in schedule_warnings("train", 1e30, 0, 5, 1_000_000)[0]
