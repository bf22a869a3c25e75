"""Issue 45, outputs and output directories: what a command writes goes where its name says, and nothing that is
not a regular file (a device, a FIFO, a symlink) is replaced by one; a run's directory is never the model it starts
from, nor a directory of someone else's files; a directory deleted under a run loses nothing more; pipes and FIFOs
are read once, and no FIFO is waited on for ever. Each case is injected for real: device nodes, FIFOs, symlinks,
process substitution, a run whose directory is deleted while it trains."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rookworld.io import files

from conftest import REPO
from test_bad_input import one_line_error
from test_trainer import run_cli, train_args

POSITION = "4k3/8/8/8/8/8/8/4K3 w - - 0 1"


def char_device(path: Path) -> Path:
    """A node of the null device (1, 3) at `path`: what /dev/null is, without touching the system's."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here ({e})")
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def in_thread(fn, *args) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def read_fifo(path: Path, into: list) -> None:
    with open(path) as f:
        into.append(f.read())


def write_fifo(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def held_out_lines(n: int) -> str:
    return "".join((REPO / "data" / "chess-cpu-held-out.jsonl").read_text().splitlines(keepends=True)[:n])


# -- 1. --out: a device, a FIFO or a symlink is written through, never replaced by a regular file --------------------

def test_out_to_a_device_writes_through_it_and_leaves_the_device(tiny_dir, tmp_path):
    null = char_device(tmp_path / "null")
    data = tmp_path / "p.fen"
    data.write_text(POSITION + "\n")
    for args in (["positions", "--count", "3", "--out", null],
                 ["eval", "--model", tiny_dir, "--data", data, "--tasks", "A", "--out", null]):
        proc = run_cli(list(map(str, args)))
        assert proc.returncode == 0, proc.stderr
        assert stat.S_ISCHR(null.lstat().st_mode), f"{args[0]} replaced the device by a regular file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "p.fen"], "no temporary file left beside it"


def test_out_to_a_fifo_writes_into_the_pipe_and_leaves_the_fifo(tmp_path):
    pipe = fifo(tmp_path / "pipe")
    got: list[str] = []
    reader = in_thread(read_fifo, pipe, got)
    proc = run_cli(["positions", "--count", "4", "--out", str(pipe)])
    reader.join(10)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(pipe.lstat().st_mode)
    assert [json.loads(line)["fen"] for line in got[0].splitlines()] and len(got[0].splitlines()) == 4


def test_a_fifo_nobody_reads_is_one_line_after_a_bounded_wait_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "PEER_WAIT_S", 0.5)
    pipe = fifo(tmp_path / "pipe")
    started = time.monotonic()
    err = one_line_error(_last_line(run_cli(["positions", "--count", "3", "--out", str(pipe)])),
                         f"--out {pipe}: nothing read the FIFO", "start its reader first")
    assert time.monotonic() - started < 10 and "positions [" not in err
    assert stat.S_ISFIFO(pipe.lstat().st_mode)


def _last_line(proc):
    """The refusal after the "waiting up to N s" line that says why the command pauses."""
    lines = proc.stderr.strip().splitlines()
    assert lines[0].endswith("for a reader of the FIFO"), proc.stderr
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, "\n".join(lines[1:]) + "\n")


def test_out_through_a_symlink_writes_its_file_and_keeps_the_link(tmp_path):
    target = tmp_path / "data" / "positions.jsonl"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)
    dangling = tmp_path / "new.jsonl"
    dangling.symlink_to(tmp_path / "data" / "made.jsonl")
    for out, written in ((link, target), (dangling, tmp_path / "data" / "made.jsonl")):
        proc = run_cli(["positions", "--count", "3", "--out", str(out)])
        assert proc.returncode == 0, proc.stderr
        assert out.is_symlink() and len(written.read_text().splitlines()) == 3
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    one_line_error(run_cli(["positions", "--count", "3", "--out", str(loop)]), f"--out {loop} is a symlink loop")
    away = tmp_path / "away.jsonl"
    away.symlink_to(tmp_path / "missing" / "x.jsonl")
    one_line_error(run_cli(["positions", "--count", "3", "--out", str(away)]), "does not exist", "mkdir -p")


def test_out_to_a_descriptor_appends_to_the_shell_s_file(tmp_path):
    """`>> all.jsonl` with --out /dev/fd/1 (or a link to it, as /dev/stdout is): what was there stays (a file
    renamed over it, or one opened anew and truncated, lost it). Not /dev/stdout itself: a command that renames
    over it replaces the system's."""
    log = tmp_path / "all.jsonl"
    log.write_text('{"fen": "kept"}\n')
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    for out in ("/dev/fd/1", link):
        with open(log, "a") as stdout:
            proc = subprocess.run([sys.executable, "-m", "rookworld", "positions", "--count", "2", "--quiet",
                                   "--out", str(out)], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert link.is_symlink()
    lines = log.read_text().splitlines()
    assert lines[0] == '{"fen": "kept"}' and len(lines) == 5 and log.is_file() and not log.is_symlink()


def test_plot_out_follows_the_same_rule(tmp_path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0 / s}) + "\n" for s in (1, 2, 3)))
    null = char_device(tmp_path / "null")
    proc = run_cli(["plot", str(run), "--out", str(null)])
    assert proc.returncode == 0 and stat.S_ISCHR(null.lstat().st_mode), proc.stderr
    png = tmp_path / "png" / "curves.png"
    png.parent.mkdir()
    link = tmp_path / "curves.png"
    link.symlink_to(png)
    proc = run_cli(["plot", str(run), "--out", str(link)])
    assert proc.returncode == 0 and link.is_symlink() and png.read_bytes()[:4] == b"\x89PNG", proc.stderr
    pipe = fifo(tmp_path / "pipe")
    got: list[bytes] = []
    reader = in_thread(lambda: got.append(pipe.read_bytes()))
    proc = run_cli(["plot", str(run), "--out", str(pipe)])
    reader.join(10)
    assert proc.returncode == 0 and got[0][:4] == b"\x89PNG" and stat.S_ISFIFO(pipe.lstat().st_mode), proc.stderr
    # A plot that fails leaves the PNG that was there: written whole or not at all.
    (run / "metrics.jsonl").write_text("not json\n")
    before = png.read_bytes()
    assert run_cli(["plot", str(run), "--out", str(link)]).returncode == 2 and png.read_bytes() == before


def test_out_never_replaces_a_file_of_the_model_or_run_it_reads(tiny_dir, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(tiny_dir, model)
    config = (model / "config.json").read_text()
    data = tmp_path / "p.fen"
    data.write_text(POSITION + "\n")
    one_line_error(run_cli(["eval", "--model", str(model), "--data", str(data), "--tasks", "A", "--out",
                            str(model / "config.json")]), "would replace the config.json")
    assert (model / "config.json").read_text() == config
    run = tmp_path / "run"
    run.mkdir()
    metrics = "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2))
    (run / "metrics.jsonl").write_text(metrics)
    one_line_error(run_cli(["plot", str(run), "--out", str(run / "metrics.jsonl")]), "would replace the metrics.jsonl")
    assert (run / "metrics.jsonl").read_text() == metrics
    proc = run_cli(["eval", "--model", str(model), "--data", str(data), "--tasks", "A", "--out",
                    str(model / "eval.json")])  # beside the model's files: where a user keeps its figures
    assert proc.returncode == 0 and json.loads((model / "eval.json").read_text())["suites"], proc.stderr


# -- 2. an output directory that is the model's, or holds it, or holds someone else's files --------------------

def test_the_output_directory_is_never_the_model_it_starts_from(tiny_dir, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(tiny_dir, model)
    weights = (model / "model.safetensors").read_bytes()
    config = (model / "config.json").read_text()
    sft = ["sft", "--data", str(REPO / "data" / "chess-cpu-held-out.jsonl"), "--steps", "1", "--device", "cpu"]
    for args in (train_args(model, model, "--steps", "1"), train_args(model, model, "--steps", "1", "--overwrite"),
                 [*sft, "--model", str(model), "--output-dir", str(model)],
                 train_args(model, tmp_path, "--steps", "1", "--overwrite")):  # a directory that holds it
        one_line_error(run_cli(list(map(str, args))), "the --model", "give another --output-dir")
        assert (model / "model.safetensors").read_bytes() == weights and (model / "config.json").read_text() == config
    link = tmp_path / "link"
    link.symlink_to(model)
    one_line_error(run_cli(train_args(model, link, "--steps", "1")), "the --model")


def test_a_directory_that_holds_no_run_is_not_written_over_without_overwrite(tiny_dir, tmp_path):
    """A copy of a model, someone's tensorboard/ or config.json: refused, then replaced only with --overwrite."""
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    (other / "tensorboard").mkdir()
    (other / "tensorboard" / "theirs").write_text("x")
    config = (other / "config.json").read_text()
    err = one_line_error(run_cli(train_args(tiny_dir, other, "--steps", "1")), "holds no run", "--overwrite")
    assert "config.json" in err and "tensorboard" in err
    assert (other / "config.json").read_text() == config and (other / "tensorboard" / "theirs").exists()
    assert not (other / "run.json").exists()
    proc = run_cli(train_args(tiny_dir, other, "--steps", "1", "--overwrite"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((other / "run.json").read_text())["command"] == "train"
    assert not (other / "tensorboard" / "theirs").exists()
    # Files a run does not write are not in the way.
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README").write_text("mine")
    assert run_cli(train_args(tiny_dir, notes, "--steps", "1")).returncode == 0
    assert (notes / "README").read_text() == "mine"


# -- 12. an output directory that is not one --------------------------------------------------------------------

def test_an_output_directory_that_is_not_a_directory_is_said_as_such(tiny_dir, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    pipe = fifo(tmp_path / "pipe")
    for out, said in ((char_device(tmp_path / "null"), "is a character device, not a directory"),
                      (pipe, "is a FIFO, not a directory"), (a_file, "is a file, not a directory"),
                      (loop, "is a symlink loop"), (dangling, f"is a symlink to {tmp_path / 'nowhere'}"),
                      (a_file / "run", f"{a_file} is a file, not a directory")):
        one_line_error(run_cli(train_args(tiny_dir, out, "--steps", "1")), f"--output-dir {out}", said)
    assert stat.S_ISFIFO(pipe.lstat().st_mode) and a_file.read_text() == "x"


def test_a_run_s_files_that_are_not_regular_files_are_refused_on_resume(tiny_dir, tmp_path):
    """metrics.jsonl as a FIFO blocked the resumed run for ever; as a symlink, its file was rewritten."""
    out = tmp_path / "run"
    assert run_cli(train_args(tiny_dir, out, "--steps", "1")).returncode == 0
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("theirs\n")
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(elsewhere)
    one_line_error(run_cli(["train", "--resume", str(out), "--steps", "2"]), "metrics.jsonl is a symlink", "remove it")
    assert elsewhere.read_text() == "theirs\n"
    (out / "metrics.jsonl").unlink()
    fifo(out / "metrics.jsonl")
    one_line_error(run_cli(["train", "--resume", str(out), "--steps", "2"]), "metrics.jsonl is a FIFO")


# -- 9. the output directory deleted while a run writes to it ---------------------------------------------------

@pytest.mark.slow
def test_an_output_directory_deleted_mid_run_is_made_again_and_the_run_saves_into_it(tiny_dir, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "rookworld", *train_args(tiny_dir, out, "--steps", "500")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.2)
        os.rename(out, tmp_path / "gone")  # `rm -r` as the run sees it, in one go
        shutil.rmtree(tmp_path / "gone")
        while not (out / "metrics.jsonl").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # the run stops after its step, saving it
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert "SIGTERM again to stop at once" in err and "rookworld train: terminated at step" in err, err
    assert f"the output directory {out} disappeared after step" in err and "made it again" in err
    assert json.loads((out / "run.json").read_text())["command"] == "train"
    saved = sorted((out / "checkpoints").glob("step-*"))
    assert saved and (out / "model.safetensors").exists(), err
    assert f"--resume {out}" in err


# -- 12. input from a pipe or a FIFO: read once ------------------------------------------------------------------

def test_positions_from_process_substitution_and_a_fifo(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text(held_out_lines(5))
    out = tmp_path / "out.jsonl"
    shell = (f"{sys.executable} -m rookworld positions --from <(cat {data}) --exclude <(head -1 {data}) --quiet "
             f"--out {out}")
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 4
    pipe = fifo(tmp_path / "pipe")
    writer = in_thread(write_fifo, pipe, held_out_lines(3))
    proc = run_cli(["positions", "--from", str(pipe), "--out", str(out)])
    writer.join(10)
    assert proc.returncode == 0 and len(out.read_text().splitlines()) == 3, proc.stderr


def test_eval_data_from_a_fifo_and_its_bad_lines_named_by_the_fifo(tiny_dir, tmp_path):
    pipe = fifo(tmp_path / "pipe")
    writer = in_thread(write_fifo, pipe, POSITION + "\n")
    proc = run_cli(["eval", "--model", str(tiny_dir), "--data", str(pipe), "--tasks", "A"])
    writer.join(10)
    assert proc.returncode == 0 and f"--data {pipe}" in proc.stderr, proc.stderr
    writer = in_thread(write_fifo, pipe, POSITION + "\nnot a position\n")
    err = one_line_error(run_cli(["eval", "--model", str(tiny_dir), "--data", str(pipe), "--tasks", "A"]),
                         f"{pipe}:2")
    writer.join(10)
    assert "/dev/fd/" not in err


def test_a_fifo_nobody_writes_is_one_line_after_a_bounded_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "PEER_WAIT_S", 0.5)
    pipe = fifo(tmp_path / "pipe")
    started = time.monotonic()
    one_line_error(run_cli(["positions", "--from", str(pipe), "--out", str(tmp_path / "o.jsonl")]),
                   f"--from {pipe}: nothing wrote to the FIFO", "start its writer first")
    assert time.monotonic() - started < 10 and not (tmp_path / "o.jsonl").exists()
