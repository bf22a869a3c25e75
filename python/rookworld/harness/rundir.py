"""What a run directory holds and which command made it, so that no run writes over another and no message
sends a user to a command that cannot work.

OUTPUT_DIR/run.json names the command (`train` or `sft`); a directory from before it existed is recognised by
its checkpoints' settings. A run that saved no checkpoint has nothing to resume: it is offered --overwrite, and
started afresh without asking when it has not logged a single step.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
import socket
from pathlib import Path

from rookworld import __version__
from rookworld.ground.files import atomic_write
from rookworld.harness import checkpoint
from rookworld.harness.runlog import WANDB_ID
from rookworld.settings.config import ConfigError, RunConfig

RUN_FILE = "run.json"
#: Held (flock) by the run writing to the directory, for as long as its process lives: the kernel drops the lock of a
#: process that dies however it dies, so a crashed run's lock file is stale by itself and never needs clearing.
LOCK_FILE = ".rookworld.lock"
COMMANDS = ("train", "sft")
# What a run writes, besides the model files `sft` (and `train`) keep at the top.
_RUN_FILES = ("metrics.jsonl", "samples.jsonl", "checkpoints", "tensorboard", "wandb", WANDB_ID, RUN_FILE)
_MODEL_FILES = ("model.safetensors", "config.json", "vocab.json", "merges.txt")


def run_directory(checkpoint_dir: Path) -> Path:
    """The output directory a checkpoint belongs to (OUTPUT_DIR/checkpoints/step-N)."""
    return checkpoint_dir.parent.parent


def made_by(out: Path) -> str | None:
    """`train` or `sft` for a run directory (or None when it holds no run, or nothing says)."""
    try:
        command = json.loads((out / RUN_FILE).read_text()).get("command")
        if command in COMMANDS:
            return command
    except (OSError, ValueError, AttributeError):
        pass
    saved = checkpoint.list_checkpoints(out)
    if saved:
        try:
            config = checkpoint.load_config(saved[-1])
        except checkpoint.CheckpointError:
            return None
        return "train" if "group_size" in config else "sft"
    return None


def _logged_steps(out: Path) -> int:
    try:
        return sum(1 for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip())
    except OSError:
        return 0


def check_resume(command: str, checkpoint_dir: Path) -> None:
    """--resume of a run made by the other command says what to type instead."""
    out = run_directory(checkpoint_dir)
    owner = made_by(out) if (out / "checkpoints").is_dir() else None
    if owner is None:  # a checkpoint directory copied on its own: its settings say
        owner = "train" if "group_size" in checkpoint.load_config(checkpoint_dir) else "sft"
    if owner != command:
        other = "GRPO" if command == "train" else "supervised"
        raise ConfigError(f"--resume {checkpoint_dir}: that is a `rookworld {owner}` run; continue it with "
                          f"rookworld {owner} --resume {out}, or start {other} training from its model with "
                          f"rookworld {command} --model {checkpoint_dir} --output-dir NEW_DIR")


class RunDirectoryLock:
    """Exclusive use of an output directory, taken before anything is written there. A second run into the same
    directory is refused with a message naming the first (two runs together interleaved their metrics and
    overwrote each other's checkpoints, both exiting 0)."""

    def __init__(self, out: Path, command: str):
        try:
            out.mkdir(parents=True, exist_ok=True)
            self._file = open(out / LOCK_FILE, "a+")
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


def _describe(holder: str) -> str:
    try:
        h = json.loads(holder)
        return f"rookworld {h['command']}, process {h['pid']} on {h['host']}, started {h['started']}"
    except (ValueError, KeyError, TypeError):
        return "a rookworld run that has not said which yet"


def prepare_output_dir(cfg: RunConfig, resume_from: Path | None, main: bool, command: str) -> None:
    """A run does not write over another one: a new run needs --resume to continue the run in its directory, or
    --overwrite to replace it (never a run of the other command); a run resumed from one directory into another
    must not land on a third run."""
    out = Path(cfg.output_dir)
    found = [name for name in _RUN_FILES if (out / name).exists()]
    continuing = resume_from is not None and run_directory(resume_from).resolve() == out.resolve()
    if found and not continuing:
        owner = made_by(out)
        saved = checkpoint.list_checkpoints(out)
        if owner is not None and owner != command:
            what = "delete it" if cfg.overwrite else "write over it"
            raise ConfigError(f"--output-dir {out} holds a `rookworld {owner}` run, which this `rookworld {command}` "
                              f"will not {what}: give a new --output-dir (with --model {out} to start from its "
                              f"model){', or remove it yourself' if cfg.overwrite else ''}")
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
        if main:  # --overwrite, or a run that stopped before logging a step: nothing worth keeping
            for name in (*_RUN_FILES, *(_MODEL_FILES if (out / "model.safetensors").exists() else ())):
                path = out / name
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        with atomic_write(out / RUN_FILE) as f:
            json.dump({"command": command, "rookworld": __version__}, f)
            f.write("\n")
