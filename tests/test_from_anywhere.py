"""Presets and the shipped models from any directory: a preset's models/ and data/ are found in the clone rookworld
was installed from when they are not in the current directory (whose own files win), what a run writes stays in
the current directory, a local path is never sent to the hub, and a package installed without the clone says
where the files are and what to pass instead. The real `rookworld` command, run from a directory outside the
clone."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rookworld

from conftest import REPO, cli, rookworld_process
from rookworld.settings import shipped
from rookworld.settings.base import ConfigError
from rookworld.settings.config import SFTConfig, TrainConfig
from rookworld.settings.flags import from_args
from rookworld.settings.hub import is_local_path

SFT_MODEL = REPO / "models" / "chess-cpu-sft"
HELD_OUT = REPO / "data" / "chess-cpu-held-out.jsonl"
FEN = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    return lines[0]


def test_this_checkout_is_the_clone_the_package_runs_from():
    assert shipped.repository() == REPO and SFT_MODEL.is_dir() and HELD_OUT.is_file()


@pytest.mark.slow
def test_a_preset_trains_from_another_directory_on_the_clone_s_model_and_writes_here(tmp_path):
    """It asked for data/chess-cpu-held-out.jsonl, then sent models/chess-cpu-sft to the hub."""
    proc = rookworld_process("train", "--config", "chess-cpu", "--steps", "1", "--prompts-per-step", "2",
                             "--group-size", "2", "--eval-every", "0", "--stockfish-depth", "1", "--device", "cpu",
                             "--report-to", "none", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "runs" / "chess-cpu-grpo"
    assert (run / "model.safetensors").is_file()
    saved = json.loads((run / "checkpoints" / "step-000001" / "train_config.json").read_text())
    assert saved["model"] == str(SFT_MODEL) and saved["eval_data"] == str(HELD_OUT)
    assert saved["output_dir"] == "runs/chess-cpu-grpo"


def test_the_readme_s_first_command_finds_its_model_and_prompts_from_another_directory(tmp_path, monkeypatch):
    """`rookworld train --config chess-play` trains the shipped sft3 model on the shipped prompts."""
    monkeypatch.chdir(tmp_path)
    cfg = from_args(argparse.Namespace(config="chess-play"), TrainConfig)
    assert cfg.model == str(REPO / "models" / "chess-play-sft3") and (REPO / "models" / "chess-play-sft3").is_dir()
    assert cfg.data == [str(REPO / "data" / "chess-play-prompts-s5.jsonl")] and Path(cfg.data[0]).is_file()
    assert cfg.eval_data == str(REPO / "data" / "chess-play-held-out.jsonl") and cfg.output_dir == "runs/chess-play-grpo"


def test_a_user_s_own_file_wins_over_the_clone_s(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "chess-cpu-held-out.jsonl").write_text("".join(HELD_OUT.open().readlines()[:3]))
    cfg = from_args(argparse.Namespace(config="chess-cpu"), TrainConfig)
    assert cfg.eval_data == "data/chess-cpu-held-out.jsonl" and cfg.model == str(SFT_MODEL)
    # A flag is the user's own path, as given; the hub model of a GPU preset stays a hub id.
    assert from_args(argparse.Namespace(config="chess-cpu", eval_data=str(HELD_OUT)), TrainConfig).eval_data == \
        str(HELD_OUT)
    assert from_args(argparse.Namespace(config="rookworld-lm-124m"), TrainConfig).model == shipped.HUB_MODEL


def test_a_preset_says_what_it_lacks_and_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        from_args(argparse.Namespace(config="cpu-demo"), TrainConfig)
    assert "its data is not here (train.jsonl, held_out.jsonl)" in str(e.value)
    assert "its model runs/cpu-demo-sft is not here: make it first with rookworld sft --config cpu-demo" in str(e.value)
    # The command that makes the training positions names the held-out ones where they are.
    with pytest.raises(ConfigError, match=re.escape(f"--exclude {HELD_OUT} --out chess-cpu-train.jsonl")):
        from_args(argparse.Namespace(config="chess-cpu"), SFTConfig)


def test_a_local_path_is_never_taken_for_a_hub_repo_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("models/chess-cpu-sft", "runs/chess-play-sft", "./x", "../x", "~/x"):
        assert is_local_path(name), name
    (tmp_path / "mine").mkdir()
    assert is_local_path("mine/model") and not is_local_path("someone/model")
    line = one_line(cli("eval", "--model", "models/chess-cpu-sftt", cwd=tmp_path))
    assert line == "rookworld eval: error: --model: no such model directory: models/chess-cpu-sftt"
    # The shipped model named from elsewhere: where the clone has it.
    line = one_line(cli("ask", "--model", "models/chess-cpu-grpo", FEN, cwd=tmp_path))
    assert line.endswith(f"no such model directory: models/chess-cpu-grpo (the clone rookworld was installed from "
                         f"has {REPO / 'models' / 'chess-cpu-grpo'})")


@pytest.mark.slow
def test_ask_answers_offline_from_any_directory_with_the_shipped_model(tmp_path):
    """`rookworld ask "FEN"` went to the hub for jrahn/RookWorld-LM-124M, and failed offline."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    proc = rookworld_process("ask", FEN, "--stockfish-depth", "1", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "best move" in proc.stdout and "reward" in proc.stdout


@pytest.fixture
def without_the_clone(tmp_path):
    """The package as a wheel installs it: a copy of it alone on the path, with pip's record of a wheel (no
    direct_url.json), and a working directory of its own."""
    site = tmp_path / "site"
    # The package as it is installed here: a fresh clone's python/rookworld has no built Rust core in it.
    shutil.copytree(Path(rookworld.__file__).parent, site / "rookworld", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "rookworld-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rookworld\nVersion: 0.1.0\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    found = subprocess.run([sys.executable, "-c", "import rookworld.settings.shipped as s; "
                            "print(s.PACKAGE, s.repository())"], capture_output=True, text=True, env=env, cwd=work,
                           timeout=120)
    assert found.stdout.split() == [str(site / "rookworld"), "None"], found.stderr
    return work, env


@pytest.mark.slow
def test_without_the_clone_a_preset_says_where_its_files_are_and_what_to_pass(without_the_clone):
    work, env = without_the_clone
    line = one_line(rookworld_process("train", "--config", "chess-cpu", cwd=work, env=env, timeout=300))
    assert line.startswith("rookworld train: error: --config chess-cpu: models/chess-cpu-sft, "
                           "data/chess-cpu-held-out.jsonl are not here: rookworld's models/ and data/ ship with its "
                           "repository, not with the installed package: run from a clone of it"), line
    assert "or pass --model DIR and --eval-data FILE" in line and "hf download" not in line
    assert not (work / "runs").exists()
    # The held-out positions first: the training positions leave them out.
    line = one_line(rookworld_process("sft", "--config", "chess-cpu", cwd=work, env=env, timeout=300))
    held_out, train = line.index("--out data/chess-cpu-held-out.jsonl"), line.index("--out chess-cpu-train.jsonl")
    assert held_out < train, line


@pytest.mark.slow
def test_without_the_clone_ask_offline_says_why_then_what_to_pass(without_the_clone):
    work, env = without_the_clone
    line = one_line(rookworld_process("ask", FEN, cwd=work, env=env, timeout=300))
    assert line.startswith(f"rookworld ask: error: Cannot load {shipped.HUB_MODEL!r}: the Hugging Face hub cannot "
                           "be reached"), line
    assert line.index("hub cannot be reached") < line.index(": pass --model DIR, a model directory"), line
