"""Where a model's weights are: a model directory, or a training run's directory, whose latest checkpoint is
its model. The layout is the harness's (`rookworld.harness.checkpoint` writes it); reading it needs no torch, so
that a command can resolve --model and --resume before it loads anything.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rookworld.io.errors import RookworldError
from rookworld.io.files import no_directory_there

STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "train_config.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"step-(\d+)$")


class CheckpointError(RookworldError, ValueError):
    """A checkpoint that cannot be found or read."""


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found) if (p / STATE_FILE).is_file() and _inside(root, p)]


def _inside(root: Path, checkpoint: Path) -> bool:
    """Whether a checkpoint is the run's own: one reached through a symbolic link (its own, or its checkpoints
    directory's) is another run's, which --resume would continue, write into and prune."""
    try:
        return checkpoint.resolve() == root.parent.resolve() / root.name / checkpoint.name
    except (OSError, RuntimeError):  # a loop of links (RuntimeError before Python 3.13)
        return False


def _latest(root: Path) -> Path | None:
    """The checkpoint `latest` names, when it names one of this run's own: a plain `step-N`. (A few bytes are read:
    a `latest` linked to a large file costs nothing; a pipe is no file and is not opened.)"""
    latest = root / LATEST
    try:
        if not latest.is_file():
            return None
        with open(latest, "rb") as f:
            name = f.read(64).decode("utf-8", "replace").strip()
    except OSError:  # unreadable: the checkpoints themselves say which is newest
        return None
    candidate = root / name
    if not _STEP_DIR.fullmatch(name) or not (candidate / STATE_FILE).is_file() or not _inside(root, candidate):
        return None
    return candidate


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory, or the newest checkpoint of an output directory (the one `latest` names, when it
    is the run's own)."""
    path = Path(path).expanduser()
    if (path / STATE_FILE).is_file():
        return path
    latest = _latest(path / "checkpoints")
    if latest is not None:
        return latest
    found = list_checkpoints(path)
    if found:
        return found[-1]
    if (path / "metrics.jsonl").is_file():
        raise CheckpointError(f"--resume {path}: the run there stopped before saving a checkpoint, so there is "
                              "nothing to resume: start it again with --overwrite (and the same settings)")
    if (why := no_directory_there(path)) not in (None, "no such directory"):
        raise CheckpointError(f"--resume {path}: {why}: give the run's --output-dir or one of its checkpoints")
    raise CheckpointError(f"--resume {path}: no checkpoint there (expected {STATE_FILE} in it or in "
                          f"{path}/checkpoints/step-*)")


def step_of(checkpoint: Path) -> int | None:
    """The step a checkpoint directory was saved at, from its name (None for a renamed one)."""
    m = _STEP_DIR.match(checkpoint.name)
    return int(m.group(1)) if m else None


def model_step(directory: Path) -> int | None:
    """The training step of the model in a directory: a checkpoint's own, or a run's latest checkpoint's (which
    the model at the top of a run directory is); None for a model that is neither."""
    if (directory / STATE_FILE).is_file():
        return step_of(directory)
    saved = list_checkpoints(directory)
    return step_of(saved[-1]) if saved else None


def model_source(name: str) -> str:
    """A model directory, or the latest checkpoint of a training run's directory."""
    path = Path(name).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        try:
            return str(resolve_checkpoint(path))
        except CheckpointError:
            pass
    return name
