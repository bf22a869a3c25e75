"""A run directory is data, not instructions (issue 45): `--resume` takes no program and no place to write from
the directory it continues, follows no `checkpoints/latest` out of it, and refuses weights put in a checkpoint's
place or a KL reference other than the run's own; a --config file is read whatever is in its place. Each case is
injected for real (edited settings, links, pipes, swapped model files, real runs and a real engine) and gives the
right result or one line saying what to type, with a non-zero exit status."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from conftest import rookworld_process, tiny_gpt
from rookworld.chess.stockfish import find_stockfish
from rookworld.harness import checkpoint
from rookworld.net.pretrained import from_pretrained, save_pretrained
from test_bad_input import one_line_error
from test_trainer import metrics, run_cli, train_args

A_LINE = ("A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
          "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")


def steps(out) -> list[int]:
    return [row["step"] for row in metrics(out)]


def edit_settings(checkpoint_dir: Path, **changes) -> None:
    path = checkpoint_dir / checkpoint.CONFIG_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` and its bytes: what a run must leave as it was."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def grpo_run(tiny_dir, tmp_path_factory):
    """A GRPO run of two steps, a checkpoint after each: each test continues a copy of it."""
    out = tmp_path_factory.mktemp("grpo") / "run"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "2", "--save-every", "1"))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture
def run(grpo_run, tmp_path) -> Path:
    """A copy of the GRPO run, resumable where it is (its settings still name the original's directory)."""
    copy = tmp_path / "run"
    shutil.copytree(grpo_run, copy, symlinks=True)
    return copy


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    data = root / "train.txt"
    data.write_text(A_LINE + "\n")
    out = root / "run"
    proc = run_cli(["sft", "--init", "tiny", "--n-embd", "32", "--data", str(data), "--output-dir", str(out),
                    "--steps", "1", "--rows-per-step", "2", "--eval-every", "0", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    return out


def marking_engine(tmp_path: Path, marker: Path) -> Path:
    """An engine that leaves `marker` behind when it is started, then is the real Stockfish."""
    script = tmp_path / "engine.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexec {find_stockfish()} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def other_model(like: Path, directory: Path, same_shape: bool = True) -> Path:
    """Another model than `like`: its weights moved (same shape), or a GPT-2 of another width."""
    if same_shape:
        model = from_pretrained(like)
        with torch.no_grad():
            model.transformer.ln_f.bias.add_(0.5)
    else:
        model = tiny_gpt()
    save_pretrained(model, directory)
    return directory


# -- a run directory names no program and no place to write ---------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "sft"])
def test_an_engine_named_in_a_run_s_settings_is_not_started_on_resume(command, grpo_run, sft_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(grpo_run if command == "train" else sft_run, out)
    marker = tmp_path / "started"
    engine = marking_engine(tmp_path, marker)
    edit_settings(checkpoint.resolve_checkpoint(out), stockfish_path=str(engine), eval_every=1)
    before = snapshot(out)
    proc = run_cli([command, "--resume", out, "--steps", "3"])
    one_line_error(proc, f"name the engine {engine}", f"--stockfish-path {engine}")
    assert not marker.exists(), "the engine the run directory named was started"
    assert snapshot(out) == before


def test_a_saved_engine_that_is_the_default_one_is_taken(run):
    edit_settings(checkpoint.resolve_checkpoint(run), stockfish_path=find_stockfish())
    proc = run_cli(["train", "--resume", run, "--steps", "3"])
    assert proc.returncode == 0, proc.stderr
    assert steps(run) == [1, 2, 3]


def test_a_resumed_run_writes_where_it_is_not_where_its_settings_say(run, grpo_run, tmp_path):
    """A saved output_dir made the run write into any directory; a copied or moved run went on in the original."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("mine\n")
    edit_settings(checkpoint.resolve_checkpoint(run), output_dir=str(victim))
    original = snapshot(grpo_run)
    proc = run_cli(["train", "--resume", run, "--steps", "3"])
    assert proc.returncode == 0, proc.stderr
    assert f"the run goes on in {run}, where it is (its settings say {victim})" in proc.stderr
    assert snapshot(victim) == {"notes.txt": b"mine\n"}
    assert snapshot(grpo_run) == original, "the run it was copied from was written to"
    assert steps(run) == [1, 2, 3] and checkpoint.resolve_checkpoint(run).name == "step-000003"
    assert json.loads((run / "checkpoints" / "step-000003" / checkpoint.CONFIG_FILE).read_text())["output_dir"] \
        == str(run)


def test_a_checkpoint_outside_a_run_directory_needs_an_output_dir(run, tmp_path):
    alone = tmp_path / "alone"
    shutil.copytree(checkpoint.resolve_checkpoint(run), alone)
    one_line_error(run_cli(["train", "--resume", alone, "--steps", "3"]), "give --output-dir DIR")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone", "run"]
    proc = run_cli(["train", "--resume", alone, "--steps", "3", "--output-dir", tmp_path / "new"])
    assert proc.returncode == 0, proc.stderr
    assert steps(tmp_path / "new") == [3]


def test_a_run_json_that_disagrees_with_the_settings_a_resume_loads_is_not_believed(run):
    """A GRPO run whose run.json files said sft sent `train --resume` to `sft --resume`, which then raised a
    TypeError on GRPO's settings (issue 71): the saved settings, which a resume loads, say whose run it is."""
    for record in [run / checkpoint.RUN_FILE, *run.glob(f"checkpoints/*/{checkpoint.RUN_FILE}")]:
        record.write_text('{"command": "sft"}')
    one_line_error(run_cli(["sft", "--resume", run, "--steps", "3"]), "that is a `rookworld train` run",
                   f"rookworld train --resume {run}")
    proc = run_cli(["train", "--resume", run, "--steps", "3"])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_trust_in_a_run_directory_s_compile_cache_is_never_taken_from_its_settings(run):
    """Issue 71: --trust-compile-cache loads a pickle that runs code; a run directory's saved settings saying it
    must not give it, so a resumed run takes it from the command line alone."""
    edit_settings(checkpoint.resolve_checkpoint(run), trust_compile_cache=True)
    proc = run_cli(["train", "--resume", run, "--steps", "3"])
    assert proc.returncode == 0, proc.stderr
    assert checkpoint.load_config(checkpoint.resolve_checkpoint(run))["trust_compile_cache"] is False
    proc = run_cli(["train", "--resume", run, "--steps", "4", "--trust-compile-cache"])
    assert proc.returncode == 0, proc.stderr
    assert checkpoint.load_config(checkpoint.resolve_checkpoint(run))["trust_compile_cache"] is True


@pytest.mark.slow
def test_a_cache_outside_the_run_is_not_written_on_its_settings_word(run, tmp_path):
    """The cache sets a file that is not sqlite aside (renames it): a saved path could rename any file."""
    victim = tmp_path / "thesis.tex"
    victim.write_text("\\documentclass{article}\n")
    edit_settings(checkpoint.resolve_checkpoint(run), stockfish_cache=str(victim))
    proc = run_cli(["train", "--resume", run, "--steps", "3"])
    assert proc.returncode == 0, proc.stderr
    assert f"the run's --stockfish-cache {victim} is outside it" in proc.stderr
    assert victim.read_text() == "\\documentclass{article}\n" and sorted(os.listdir(tmp_path)) == ["run", "thesis.tex"]
    # One in the run's own directory is the run's.
    own = run / "analyses.sqlite"
    edit_settings(checkpoint.resolve_checkpoint(run), stockfish_cache=str(own))
    proc = run_cli(["train", "--resume", run, "--steps", "4"])
    assert proc.returncode == 0, proc.stderr
    assert own.is_file() and "outside it" not in proc.stderr


def test_latest_is_followed_only_to_the_run_s_own_checkpoints(run, grpo_run, tmp_path):
    """`latest` naming ../../other/checkpoints/step-N, or a step directory linked there, continued the other run
    and wrote into it."""
    other = tmp_path / "other"
    shutil.copytree(grpo_run, other)
    theirs = snapshot(other)
    shutil.rmtree(run / "checkpoints" / "step-000002")
    (run / "checkpoints" / "latest").write_text("../../other/checkpoints/step-000002\n")
    (run / "checkpoints" / "step-000009").symlink_to(other / "checkpoints" / "step-000002")
    assert checkpoint.resolve_checkpoint(run) == run / "checkpoints" / "step-000001"
    assert checkpoint.list_checkpoints(run) == [run / "checkpoints" / "step-000001"]
    proc = run_cli(["train", "--resume", run, "--steps", "2"])
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from {run / 'checkpoints' / 'step-000001'} at step 1" in proc.stderr
    assert snapshot(other) == theirs
    # A `latest` linked to something else than a small file is not read through.
    (run / "checkpoints" / "latest").unlink()
    os.mkfifo(run / "checkpoints" / "latest")
    assert checkpoint.resolve_checkpoint(run) == run / "checkpoints" / "step-000002"
    # Nor is a checkpoints directory that is another run's.
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "checkpoints").symlink_to(other / "checkpoints")
    one_line_error(run_cli(["train", "--resume", linked, "--steps", "3"]), f"--resume {linked}: no checkpoint there")
    assert snapshot(other) == theirs


# -- the weights a resumed run continues from ----------------------------------------------------------------------


@pytest.mark.parametrize("swap, names", [("same shape", ["model.safetensors"]),
                                         ("other shape", ["model.safetensors"]),
                                         ("other shape", ["model.safetensors", "config.json"]),
                                         ("other shape", ["config.json"])])
def test_a_checkpoint_whose_model_was_replaced_is_refused(swap, names, run, tiny_dir, tmp_path):
    """Another model's model.safetensors (or config.json, or both) in a checkpoint: a RuntimeError traceback, a
    crash in the fused optimizer step, or a run that went on training the wrong weights."""
    saved = checkpoint.resolve_checkpoint(run)
    other = other_model(tiny_dir, tmp_path / "other", same_shape=swap == "same shape")
    for name in names:
        shutil.copy(other / name, saved / name)
    before = snapshot(run)
    one_line_error(run_cli(["train", "--resume", run, "--steps", "3"]),
                   f"{saved / names[0]} is not the one its training state was saved with",
                   f"--model {saved} --output-dir NEW_DIR")
    assert snapshot(run) == before


def test_a_value_head_changed_in_a_checkpoint_is_refused(tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    out = tmp_path / "gae"
    proc = run_cli(train_args(tiny_dir, out, "--steps", "1", "--advantage", "gae", "--std-scaling", "batch"))
    assert proc.returncode == 0, proc.stderr
    head = checkpoint.resolve_checkpoint(out) / "value_head.safetensors"
    save_file({k: v + 1 for k, v in load_file(head).items()}, head)
    one_line_error(run_cli(["train", "--resume", out, "--steps", "2"]),
                   f"{head} is not the one its training state was saved with")


def test_a_checkpoint_from_before_fingerprints_with_another_model_is_refused(run, tmp_path):
    """Without a fingerprint to compare, moments of another shape are what tells (they crashed the fused step)."""
    saved = checkpoint.resolve_checkpoint(run)
    (saved / checkpoint.FINGERPRINTS_FILE).unlink()
    other = other_model(saved, tmp_path / "other", same_shape=False)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(other / name, saved / name)
    proc = rookworld_process("train", "--resume", run, "--steps", "3", timeout=300)  # a crash is its own
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert f"cannot resume from {saved}: its trainer_state.pt does not fit its model" in last, last
    assert steps(run) == [1, 2]


def test_resume_keeps_the_run_s_kl_reference(run, tiny_dir, tmp_path):
    """`--resume RUN --model OTHER` made OTHER the reference without a word (kl 0.000 to 0.013 on the first
    resumed step) and rewrote the saved settings; so did a saved setting edited, or the reference trained over."""
    saved = checkpoint.resolve_checkpoint(run)
    other = other_model(tiny_dir, tmp_path / "other")
    before = snapshot(run)
    one_line_error(run_cli(["train", "--resume", run, "--steps", "3", "--model", other]),
                   f"the KL reference {other} is not the run's (its weights are not those the run started from)",
                   f"rookworld train --model {run} --output-dir NEW_DIR")
    assert snapshot(run) == before, "the saved settings were rewritten"
    edit_settings(saved, model=str(other))
    one_line_error(run_cli(["train", "--resume", run, "--steps", "3"]), f"the KL reference {other} is not the run's")
    # The model the run started from, trained over where it was.
    moved = tmp_path / "reference"
    shutil.copytree(tiny_dir, moved)
    edit_settings(saved, model=str(moved))
    shutil.copy(other / "model.safetensors", moved / "model.safetensors")
    one_line_error(run_cli(["train", "--resume", run, "--steps", "3"]), f"the KL reference {moved} is not the run's")
    # The same weights anywhere are the same reference, and the new place is said.
    shutil.copy(tiny_dir / "model.safetensors", moved / "model.safetensors")
    edit_settings(saved, model=str(tiny_dir))
    proc = run_cli(["train", "--resume", run, "--steps", "3", "--model", moved])
    assert proc.returncode == 0, proc.stderr
    assert f"warning: --model {moved} instead of the run's {tiny_dir}" in proc.stderr and steps(run) == [1, 2, 3]


def test_a_checkpoint_from_before_fingerprints_keeps_its_reference_by_name(run, tiny_dir, tmp_path):
    (checkpoint.resolve_checkpoint(run) / checkpoint.FINGERPRINTS_FILE).unlink()
    other = other_model(tiny_dir, tmp_path / "other")
    one_line_error(run_cli(["train", "--resume", run, "--steps", "3", "--model", other]),
                   f"the KL reference {other} is not the run's (the run started from {tiny_dir})")


def test_sft_resume_with_another_model_is_refused(sft_run, tmp_path, tiny_dir):
    """sft --resume continues its checkpoint: a --model beside it was ignored without a word."""
    out = tmp_path / "run"
    shutil.copytree(sft_run, out)
    one_line_error(run_cli(["sft", "--resume", out, "--steps", "2", "--model", tiny_dir]),
                   f"--model {tiny_dir} would be ignored")


# -- what a run directory's files hold ---------------------------------------------------------------------------


@pytest.mark.parametrize("content, said", [
    ("[" * 100_000 + "]" * 100_000, "nested too deep"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ("{\"steps\": ", "cannot read"),
])
def test_saved_settings_that_are_not_settings_are_one_line(content, said, run):
    saved = checkpoint.resolve_checkpoint(run)
    (saved / checkpoint.CONFIG_FILE).write_text(content)
    one_line_error(run_cli(["train", "--resume", run, "--steps", "3"]), str(saved / checkpoint.CONFIG_FILE), said)


def test_a_pipe_in_a_checkpoint_s_place_does_not_hold_resume_up(run):
    """A FIFO as train_config.json blocked the resume for ever, waiting for a writer."""
    saved = checkpoint.resolve_checkpoint(run)
    (saved / checkpoint.CONFIG_FILE).unlink()
    os.mkfifo(saved / checkpoint.CONFIG_FILE)
    proc = rookworld_process("train", "--resume", run, "--steps", "3", timeout=60)
    one_line_error(proc, str(saved / checkpoint.CONFIG_FILE), "not a regular file")


# -- --config files ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "sft"])
@pytest.mark.parametrize("value", ["[" * 10_000 + "]" * 10_000, "{a = " * 5_000 + "1" + "}" * 5_000])
def test_a_config_nested_past_the_recursion_limit_is_one_line(command, value, tmp_path):
    config = tmp_path / "deep.toml"
    config.write_text(f"[{command}]\nlr = {value}\n")
    one_line_error(run_cli([command, "--config", config]), f"--config {config}: values nested too deep")


def test_a_byte_order_mark_before_a_config_is_read_past(tiny_dir, tmp_path):
    config = tmp_path / "windows.toml"
    config.write_text("[train]\nsteps = 1\nlr = -1.0\n", encoding="utf-8-sig")
    assert config.read_bytes().startswith(b"\xef\xbb\xbf")
    # The file is read: its lr is what the check refuses.
    one_line_error(run_cli(train_args(tiny_dir, tmp_path / "out", "--config", config)), "--lr must be > 0, got -1.0")


@pytest.mark.parametrize("command, other", [("train", "sft"), ("sft", "train")])
def test_a_config_of_the_other_command_says_which_command_reads_it(command, other, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f"[{other}]\nsteps = 2\n")
    one_line_error(run_cli([command, "--config", config]), f"holds settings for rookworld {other} ([{other}]), not "
                   f"for rookworld {command}", f"rookworld {other} --config {config}")
    config.write_text(f"[{command}s]\nsteps = 2\n")
    one_line_error(run_cli([command, "--config", config]), f"[{command}s] is no table rookworld reads",
                   f"under [{command}]")


def test_a_config_that_is_a_pipe_or_too_large_is_one_line(tmp_path):
    fifo = tmp_path / "run.toml"
    os.mkfifo(fifo)
    proc = rookworld_process("train", "--config", fifo, timeout=60)
    one_line_error(proc, f"--config {fifo} is a FIFO, not a file")
    large = tmp_path / "large.toml"
    large.write_text("# " + "x" * (2 << 20) + "\nsteps = 1\n")
    one_line_error(run_cli(["train", "--config", large]), f"--config {large} is over 1 MB")
    digits = tmp_path / "digits.toml"
    digits.write_text("steps = " + "9" * 5000 + "\n")
    one_line_error(run_cli(["train", "--config", digits]), "a number too long for any setting")


def test_a_resume_given_data_where_the_run_had_none_says_what_the_run_had(run, tmp_path):
    """The run drew generated positions (no --data): resuming it with --data FILE warned "instead of the run's "
    and stopped mid-sentence."""
    data = tmp_path / "positions.jsonl"
    data.write_text("".join(json.dumps({"fen": fen}) + "\n" for fen in (
        "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
        "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2")))
    proc = run_cli(["train", "--resume", run, "--steps", "3", "--data", data])
    assert proc.returncode == 0, proc.stderr
    assert f"warning: --data {data} instead of the run's none (generated positions)" in proc.stderr, proc.stderr
