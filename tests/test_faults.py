"""Faults and hostile input (issue 35): each case gives the right result or one line saying what is wrong and what
to do, with a non-zero exit status; no command runs code from a file it reads."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from rookworld.harness import checkpoint

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
