"""What a run directory holds and which command made it, so that no run writes over another and no message
sends a user to a command that cannot work.

OUTPUT_DIR/run.json names the command (`train` or `sft`); a directory from before it existed is recognised by
its checkpoints' settings. A run that saved no checkpoint has nothing to resume: it is offered --overwrite, and
started afresh without asking when it has not logged a single step.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
from pathlib import Path

from rookworld.io.files import atomic_write, kind, lines_within
from rookworld.harness import checkpoint
from rookworld.settings.config import ConfigError, RunConfig

RUN_FILE = checkpoint.RUN_FILE
#: OUTPUT_DIR/WANDB_ID holds the id of the run's W&B run, so that --resume continues the same one.
WANDB_ID = "wandb_id"
#: torch.compile's cache artifacts of the run (`harness.compiles`), loaded on --resume.
COMPILE_CACHE = "compile_cache.bin"
#: Held (flock) by the run writing to the directory, for as long as its process lives: the kernel drops the lock of a
#: process that dies however it dies, so a crashed run's lock file is stale by itself and never needs clearing.
LOCK_FILE = ".rookworld.lock"
COMMANDS = ("train", "sft")
# What a run writes, besides the model files `sft` (and `train`) keep at the top.
_RUN_FILES = ("metrics.jsonl", "samples.jsonl", "checkpoints", "tensorboard", "wandb", WANDB_ID, RUN_FILE,
              COMPILE_CACHE)
_RUN_DIRS = ("checkpoints", "tensorboard", "wandb")
_MODEL_FILES = ("model.safetensors", "config.json", "vocab.json", "merges.txt")


def run_directory(checkpoint_dir: Path) -> Path:
    """The output directory a checkpoint belongs to (OUTPUT_DIR/checkpoints/step-N)."""
    return checkpoint_dir.parent.parent


def made_by(out: Path) -> str | None:
    """`train` or `sft` for a run directory (or None when it holds no run, or nothing says)."""
    command = checkpoint.recorded_command(out)
    if command in COMMANDS:
        return command
    saved = checkpoint.list_checkpoints(out)
    if not saved:
        return None
    try:
        return _checkpoint_owner(saved[-1])
    except checkpoint.CheckpointError:
        return None


def _checkpoint_owner(checkpoint_dir: Path) -> str:
    """`train` or `sft` for a checkpoint, from its run.json. One saved before checkpoints had theirs
    (2026-11-27) is told by its settings: GRPO's are the ones with a group size. CheckpointError when they
    cannot be read."""
    command = checkpoint.recorded_command(checkpoint_dir)
    if command in COMMANDS:
        return command
    return settings_owner(checkpoint_dir)


def settings_owner(checkpoint_dir: Path) -> str:
    """`train` or `sft` by a checkpoint's saved settings, which a resume loads: GRPO's are the ones with a group
    size. CheckpointError when they cannot be read."""
    return "train" if "group_size" in checkpoint.load_config(checkpoint_dir) else "sft"


def metric_rows(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl, leaving out any line that is not a JSON object (one cut short by a crash);
    OSError when the file cannot be read."""
    return read_rows(path)[0]


def read_rows(path: Path) -> tuple[list[dict], int]:
    """The JSON objects of a metrics.jsonl and how many of its lines are none (cut short by a crash, or longer than
    any row: never held whole); OSError when the file cannot be read."""
    rows, bad = [], 0
    with open(path, errors="replace") as f:
        for line in lines_within(f):
            row = json_row(line)
            if row is None:
                bad += line != ""
            else:
                rows.append(row)
    return rows, bad


def json_row(line: str | None) -> dict | None:
    """A line of a JSON-lines file as the object it holds, or None."""
    try:
        row = json.loads(line) if line else None
    except (ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) else None


def _logged_steps(out: Path) -> int:
    """The rows of steps done in the run's metrics.jsonl: the evaluation at step 0 before any update is not one,
    nor is a line that is not a row."""
    try:
        rows = metric_rows(out / "metrics.jsonl")
    except OSError:
        return 0
    return sum(isinstance(row.get("step"), (int, float)) and row["step"] > 0 for row in rows)


def check_resume(command: str, checkpoint_dir: Path) -> None:
    """--resume of a run made by the other command says what to type instead. The settings a resume loads decide
    whose run it is: a run.json that disagreed with them had sent `sft --resume` to a GRPO run's settings, a
    TypeError."""
    out = run_directory(checkpoint_dir)
    owner = settings_owner(checkpoint_dir)
    if owner != command:
        other = "GRPO" if command == "train" else "supervised"
        raise ConfigError(f"--resume {checkpoint_dir}: that is a `rookworld {owner}` run; continue it with "
                          f"rookworld {owner} --resume {out}, or start {other} training from its model with "
                          f"rookworld {command} --model {checkpoint_dir} --output-dir NEW_DIR")


class RunDirectoryLock:
    """Exclusive use of an output directory, taken before anything is written there. A second run into the same
    directory is refused with a message naming the first (two runs together interleaved their metrics and
    overwrote each other's checkpoints, both exiting 0)."""

    def __init__(self, out: Path, command: str | None):
        check_directory(out)
        try:
            out.mkdir(parents=True, exist_ok=True)
            self._file = _open_lock_file(out / LOCK_FILE)
        except OSError as e:
            raise ConfigError(f"--output-dir {out}: cannot write there ({e.strerror}): give a directory you can "
                              "write to") from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.seek(0)
            holder = self._file.read().strip()
            self._file.close()
            raise ConfigError(f"--output-dir {out} is in use by another run ({_describe(holder)}): wait for it to "
                              f"end, or give another --output-dir") from None
        self._file.seek(0)
        self._file.truncate()
        started = datetime.datetime.now().isoformat(timespec="seconds")
        json.dump({"command": command, "pid": os.getpid(), "host": socket.gethostname(), "started": started},
                  self._file)
        self._file.flush()

    def release(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()


def _open_lock_file(path: Path):
    """The lock file, never through a symlink (its target would be truncated) nor a FIFO (which blocks)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise ConfigError(f"{path} is a symlink, where a run keeps its lock: remove it") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ConfigError(f"{path} is {kind(mode)}, where a run keeps its lock: remove it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+", encoding="utf-8")


def _describe(holder: str) -> str:
    try:
        h = json.loads(holder)
        return f"rookworld {h['command']}, process {h['pid']} on {h['host']}, started {h['started']}"
    except (ValueError, KeyError, TypeError, RecursionError):
        return "a rookworld run that has not said which yet"


def check_directory(out: Path, flag: str = "--output-dir") -> None:
    """An output directory that is not one, or cannot be made, is said as such (mkdir says "File exists")."""
    try:
        mode = os.stat(out).st_mode
    except FileNotFoundError:
        if os.path.islink(out):
            raise ConfigError(f"{flag} {out} is a symlink to {os.readlink(out)}, which does not exist: make that "
                              f"directory, or give another {flag}") from None
        return
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{flag} {out} is a symlink loop: give another {flag}") from None
        if e.errno == errno.ENOTDIR:
            blocker = next((p for p in reversed(out.absolute().parents) if p.exists() and not p.is_dir()), None)
            raise ConfigError(f"{flag} {out}: cannot write there ({blocker or 'a directory on its way'} is a file, "
                              "not a directory): give a directory you can write to") from None
        return  # mkdir says it
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"{flag} {out} is {kind(mode)}, not a directory: give a directory (a new one is made)")


def _local_model(cfg: RunConfig) -> Path | None:
    model = getattr(cfg, "model", None)
    path = Path(model).expanduser() if model else None
    return path if path is not None and path.is_dir() else None


def _check_inputs(cfg: RunConfig, resume_from: Path | None, continuing: bool, command: str) -> None:
    """The directory a run writes is not the model it starts from (nor holds it): the run writes its model there,
    and --overwrite would delete it before it is read. (A directory inside the model's is safe: the run writes
    only in its own.)"""
    out = Path(cfg.output_dir).resolve()
    inputs = [("--model", _local_model(cfg))]
    if not continuing:
        inputs.append(("--resume", resume_from))
    for flag, path in inputs:
        if path is None:
            continue
        source = path.resolve()
        if out == source or out in source.parents:
            what = "is" if out == source else "holds"
            raise ConfigError(f"--output-dir {cfg.output_dir} {what} the {flag} {path} the run starts from, and the "
                              f"run would write over it: give another --output-dir, such as "
                              f"{source.name}-{command} beside it")


def _check_own_files(out: Path) -> None:
    """The files a run appends to and rewrites are its own regular files: a symlink's file is someone else's, and
    a FIFO blocks whoever reads it. (Its directories may be symlinks: kept on another disk.)"""
    for name in _RUN_FILES:
        path = out / name
        if not os.path.lexists(path):
            continue
        directory = name in _RUN_DIRS
        if path.is_dir() if directory else stat.S_ISREG(path.lstat().st_mode):
            continue
        what = ("a broken symlink" if not path.exists() else "a symlink") if path.is_symlink() else \
            kind(path.lstat().st_mode)
        raise ConfigError(f"{path} is {what}, where a run keeps its {'directory' if directory else 'file'} of "
                          "that name: remove it, or give another --output-dir")


def _is_run(out: Path) -> bool:
    """Whether `out` holds a run (its run.json, its metrics or its checkpoints), not only names a run also uses."""
    return any((out / name).exists() for name in (RUN_FILE, "metrics.jsonl", "checkpoints"))


def prepare_output_dir(cfg: RunConfig, resume_from: Path | None, command: str, *, write: bool) -> None:
    """Checked, and made ready when `write` (rank 0, once every rank has checked it). A run does not write over
    another one: a new run needs --resume to continue the run in its directory, or
    --overwrite to replace it (never a run of the other command); a run resumed from one directory into another
    must not land on a third run. Nor does it write over what is not a run: the model it starts from, ever, or
    files of a run's names in a directory that holds no run, without --overwrite."""
    out = Path(cfg.output_dir)
    continuing = resume_from is not None and run_directory(resume_from).resolve() == out.resolve()
    _check_own_files(out)
    found = [name for name in _RUN_FILES if (out / name).exists()]
    owner = made_by(out) if found and not continuing else None
    if owner is not None and owner != command:
        what = "delete it" if cfg.overwrite else "write over it"
        raise ConfigError(f"--output-dir {out} holds a `rookworld {owner}` run, which this `rookworld {command}` "
                          f"will not {what}: give a new --output-dir (with --model {out} to start from its "
                          f"model){', or remove it yourself' if cfg.overwrite else ''}")
    _check_inputs(cfg, resume_from, continuing, command)
    if not continuing and not _is_run(out):
        _claim(out, cfg.overwrite, write)
        found = []
    if found and not continuing:
        saved = checkpoint.list_checkpoints(out)
        if not cfg.overwrite and (saved or _logged_steps(out)):
            if resume_from is not None:
                raise ConfigError(f"--output-dir {out} already holds another run ({', '.join(found)}) than the one "
                                  f"--resume {cfg.resume} continues: give a new --output-dir, or --overwrite to "
                                  "replace it")
            if not saved:
                raise ConfigError(f"--output-dir {out} holds a run that saved no checkpoint ({', '.join(found)}), "
                                  "so it cannot be resumed: start over with --overwrite, or give a new --output-dir")
            raise ConfigError(f"--output-dir {out} already holds a run ({', '.join(found)}): continue it with "
                              f"--resume {out}, or start over with --overwrite")
        if write:  # --overwrite, or a run that stopped before logging a step: nothing worth keeping
            _remove(out, (*_RUN_FILES, *(_MODEL_FILES if (out / "model.safetensors").exists() else ())))
    if write:
        out.mkdir(parents=True, exist_ok=True)
        mark(out, command)


def _claim(out: Path, overwrite: bool, write: bool) -> None:
    """A directory that holds no run but files a run writes (a model's config.json, someone's tensorboard/): they
    are replaced only with --overwrite."""
    clashing = [name for name in (*_RUN_FILES, *_MODEL_FILES) if os.path.lexists(out / name)]
    if not clashing:
        return
    if not overwrite:
        raise ConfigError(f"--output-dir {out} holds no run but files a run writes ({', '.join(clashing)}): give a "
                          "new or empty --output-dir, or --overwrite to replace them")
    if write:
        _remove(out, clashing)


def _remove(out: Path, names) -> None:
    for name in names:
        path = out / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def mark(out: Path, command: str) -> None:
    """OUTPUT_DIR/run.json: which command's run the directory holds."""
    with atomic_write(out / RUN_FILE) as f:
        json.dump(checkpoint.run_record(command), f)
        f.write("\n")
