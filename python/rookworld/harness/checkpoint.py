"""Checkpoints: the policy in the Hugging Face GPT-2 layout plus the trainer's state, written atomically.

    OUTPUT_DIR/checkpoints/step-000050/{config.json, model.safetensors, vocab.json, merges.txt, trainer_state.pt,
                                        train_config.json, fingerprints.json}
                                       (+ one NAME.safetensors per extra module, e.g. the GAE value head)
    OUTPUT_DIR/checkpoints/latest        (the name of the newest complete checkpoint)

A checkpoint is assembled in a temporary directory and renamed into place, and `latest` is replaced
atomically after it, so a crash at any moment leaves the previous checkpoint intact and `latest` valid.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from rookworld import __version__
from rookworld.io.files import atomic_write, publish, read_json_object, temporary_directory
from rookworld.net.pretrained import save_pretrained
# The layout is read without torch in net.sources; the harness's callers find all of a checkpoint's API here.
from rookworld.net.sources import (CONFIG_FILE, LATEST, STATE_FILE, CheckpointError,  # noqa: F401
                                   list_checkpoints, resolve_checkpoint, step_of)


#: What `torch.load(weights_only=True)` may build beyond tensors and plain containers: numpy's RNG state, as
#: checkpoints written before the numpy state was saved as a tensor hold it. Nothing here runs code.
try:
    from numpy._core.multiarray import _reconstruct  # numpy 2
except ImportError:  # numpy 1, whose np._core may be only a partial shim
    from numpy.core.multiarray import _reconstruct
LEGACY_SAFE_GLOBALS = [_reconstruct, np.ndarray, np.dtype,
                       type(np.dtype(np.uint32))]


def rng_state() -> dict[str, Any]:
    """Every generator's state, in types `torch.load(weights_only=True)` reads back: numpy's key as a tensor."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss,
                                                    gauss), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, key, pos, has_gauss, gauss = state["numpy"]
    key = key.numpy() if torch.is_tensor(key) else np.asarray(key)
    np.random.set_state((kind, key.astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


#: A run directory's, and each of its checkpoints': which command's run it is, {"command": "train" or "sft"}.
RUN_FILE = "run.json"


def run_record(command: str) -> dict[str, str]:
    return {"command": command, "rookworld": __version__}


def recorded_command(directory: Path) -> str | None:
    """The command a run directory or a checkpoint says made it (its run.json), or None where it says nothing."""
    try:
        command = read_json_object(directory / RUN_FILE, JSON_BYTES).get("command")
    except (OSError, ValueError):
        return None
    return command if isinstance(command, str) else None


#: Beside a checkpoint's weights: the fingerprints of its model's files and its modules' ("files") and of what the
#: run started from ("reference", GRPO's), by which a resume tells them from any others put in their place.
FINGERPRINTS_FILE = "fingerprints.json"
#: The files a model is loaded from, in the order `rookworld.net.pretrained` tries them.
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")


def digest(path: Path) -> str | None:
    """The SHA-256 of a regular file; None for anything else (a pipe or a device would be read for ever)."""
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fingerprint(directory: str | os.PathLike) -> str | None:
    """The fingerprint of a model directory's weights: the digest of the file it is loaded from; None when it has
    none to read (loading it says why)."""
    name = next((n for n in WEIGHTS_FILES if os.path.lexists(Path(directory) / n)), None)
    return digest(Path(directory) / name) if name else None


def saved_fingerprints(checkpoint: Path) -> dict[str, Any]:
    """What a checkpoint's fingerprints file holds; empty for a checkpoint saved before there was one."""
    path = checkpoint / FINGERPRINTS_FILE
    return _read_json(path) if os.path.lexists(path) else {}


def check_weights(checkpoint: Path) -> None:
    """The checkpoint's model (its config.json and weights) and modules (a value head) are those its training state
    was saved with (a checkpoint from before fingerprints is taken as it is): another model in their place would be
    trained with moments that are not its own, or not of its shape."""
    files = saved_fingerprints(checkpoint).get("files")
    for name, saved in (files.items() if isinstance(files, dict) else ()):
        if Path(name).name != name:  # the checkpoint's own files only
            continue
        found = digest(checkpoint / name)
        if found is not None and found != saved:  # no file at all: loading it says so
            raise CheckpointError(f"{checkpoint / name} is not the one its training state was saved with (it was "
                                  f"replaced or changed since): resume from a checkpoint as it was saved, or train "
                                  f"its model as a new run with --model {checkpoint} --output-dir NEW_DIR")


def _write_text_atomic(path: Path, text: str) -> None:
    with atomic_write(path, fsync=True) as f:
        f.write(text)


@dataclass(frozen=True)
class Saved:
    """What a checkpoint holds. `modules` are trained beside the policy but not part of it: each goes to its own
    NAME.safetensors, so `model.safetensors` stays a plain GPT-2. The tokenizer's vocab.json and merges.txt make
    the directory loadable offline. `fingerprints` are those of what the run started from, saved beside its
    weights' own."""

    model: torch.nn.Module
    state: dict[str, Any]  # the optimizer's, the schedule's, the generators' and the command's own
    config: dict[str, Any]  # the run's settings
    modules: dict[str, torch.nn.Module] = field(default_factory=dict)
    tokenizer: Any = None
    fingerprints: dict[str, str | None] = field(default_factory=dict)
    command: str | None = None  # the command whose run it is (RUN_FILE)


def save_checkpoint(output_dir: str | os.PathLike, step: int, saved: Saved, keep: int, keep_every: int = 0) -> Path:
    """Writes checkpoint `step` and prunes all but the newest `keep` and each `keep_every`th step's; returns its
    directory."""
    root = Path(output_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    tmp = temporary_directory(f".{name}.", root)
    try:
        save_pretrained(saved.model, tmp)
        if saved.tokenizer is not None:
            saved.tokenizer.save_pretrained(tmp)
        torch.save(saved.state, tmp / STATE_FILE)
        for module_name, module in saved.modules.items():
            tensors = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
            save_file(tensors, str(tmp / f"{module_name}.safetensors"))
        (tmp / CONFIG_FILE).write_text(json.dumps(saved.config, indent=2) + "\n")
        if saved.command is not None:
            (tmp / RUN_FILE).write_text(json.dumps(run_record(saved.command)) + "\n")
        files = [WEIGHTS_FILES[0], "config.json", *(f"{module_name}.safetensors" for module_name in saved.modules)]
        (tmp / FINGERPRINTS_FILE).write_text(json.dumps({"files": {n: digest(tmp / n) for n in files},
                                                         **saved.fingerprints}) + "\n")
        if final.exists():  # saved again (e.g. the final step right after a periodic save)
            shutil.rmtree(final)
        publish(tmp)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_text_atomic(root / LATEST, name + "\n")
    for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
        if not (keep_every and step_of(old) % keep_every == 0):
            shutil.rmtree(old, ignore_errors=True)
    return final


def kept_stages(step: int, steps: int, keep_every: int) -> int:
    """How many checkpoints a run at `step` still saves that `keep_every` keeps for good: each save at a multiple
    of it after `step`, to `--steps` (the settings make it a multiple of --save-every)."""
    if not keep_every:
        return 0
    return steps // keep_every - step // keep_every


def remove_leftovers(output_dir: str | os.PathLike) -> list[Path]:
    """Removes what a save killed midway left (a temporary checkpoint directory, `latest`'s temporary file, the
    temporary directory `save_pretrained` writes the run's own model into beside it); only the run holding the
    directory's lock calls it, so nothing of a live save is touched. Returns what it removed."""
    out = Path(output_dir)
    # In checkpoints/ every hidden entry is a save's: `.step-*`, the model's `..step-*.tmp-*` beside it, `.latest.*`.
    found = [*(out / "checkpoints").glob(".*"), *out.parent.glob(f".{out.name}.tmp-*")]
    for path in found:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return found


class SaveFailed(CheckpointError):
    """A checkpoint could not be written (a full disk, most often); the previous one is intact."""


def save_failure(output_dir: str | os.PathLike, step: int, error: BaseException, needed: int) -> SaveFailed:
    """What went wrong in a save, in words: torch's zip writer reports a full disk as `unexpected pos`, so the
    free space is what tells."""
    free = shutil.disk_usage(output_dir).free
    full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT) or free < needed
    why = (f"the disk is full ({free / 1e6:.0f} MB free, a checkpoint takes about {needed / 1e6:.0f} MB)" if full
           else f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    return SaveFailed(f"could not save step {step} into {output_dir}: {why}")


def room_needed(weights: int, saves: int, kept: int, keep: int, model_there: bool, stages: int = 0) -> tuple[int, int]:
    """(bytes, checkpoints) a run's `saves` still need on its disk at their fullest, `weights` the weights' bytes.
    A checkpoint is the weights and the optimizer's two moments; a save writes the new one before it prunes the
    oldest, so with `kept` already there the directory holds min(kept + saves, keep + 1) at once, and the `stages`
    that --keep-every keeps for good beside them (counted whole: at most `keep` too many). The output directory's
    own model is written beside the one there before it replaces it: two at once from the second save on (or the
    first, when one is there)."""
    checkpoints = min(kept + saves, keep + 1) + stages
    models = 2 if model_there or saves > 1 else 1
    return 3 * weights * (checkpoints - kept) + weights * (models - model_there), checkpoints


def check_room(output_dir: str | os.PathLike, needed: tuple[int, int]) -> None:
    """Refuses, before the first step, a run whose disk cannot take its saves at their fullest (`room_needed`):
    found at a save, every step since the last one would be lost, and no later save could be made."""
    free, (size, checkpoints) = shutil.disk_usage(output_dir).free, needed
    if free < size:
        raise SaveFailed(f"{output_dir} has {free / 1e6:.0f} MB free and the run's saves take about "
                         f"{size / 1e6:.0f} MB more at their fullest ({checkpoints} checkpoint"
                         f"{'s' * (checkpoints != 1)} at once, and the model beside them), so not every step of this "
                         f"run could be saved (free some room, or keep fewer: --keep-checkpoints)")


def load_state(checkpoint: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The trainer's state, read without running code: torch's weights-only unpickler builds tensors, plain
    containers and numbers (and the numpy arrays of older checkpoints) and refuses everything else, so a run
    directory from someone else cannot execute anything on --resume."""
    path = checkpoint / STATE_FILE
    try:
        with torch.serialization.safe_globals(LEGACY_SAFE_GLOBALS):
            state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        refused = str(e).split("\n")[0] if "Unsupported global" not in str(e) else next(
            line.strip() for line in str(e).splitlines() if "Unsupported global" in line)
        raise CheckpointError(f"{path} holds more than training state (tensors, numbers, containers), which "
                              f"rookworld does not load: it could run code ({refused}); resume only from run "
                              f"directories you trust, or start a new run from its model with --model "
                              f"{checkpoint}") from None
    except Exception as e:  # a truncated or foreign file
        raise CheckpointError(f"cannot read {path}: {e}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"cannot read {path}: it holds a {type(state).__name__}, not a trainer's state")
    return state


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """`optimizer.load_state_dict(state)`, each state tensor then laid out as its parameter is. torch's fused AdamW
    pairs a parameter's elements with its moments' by memory order, so moments saved from a parameter of another
    layout (a run that started from a Hugging Face file, whose Conv1D weights were loaded as transposed views)
    would update the wrong elements: measured, an SFT run resumed that way drifted from the unbroken one."""
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        for p in group["params"]:
            moments = optimizer.state.get(p, {})
            for key, value in moments.items():
                # torch checks only the number of parameters: moments of another shape crash the fused step.
                if torch.is_tensor(value) and value.dim() and value.shape != p.shape:
                    raise ValueError(f"the optimizer's {key} of shape {list(value.shape)} for a weight of shape "
                                     f"{list(p.shape)}: it is another model's")
                if torch.is_tensor(value) and value.shape == p.shape and value.stride() != p.stride():
                    moments[key] = torch.empty_like(p).copy_(value)


def load_module(checkpoint: Path, name: str, module: torch.nn.Module) -> None:
    """Loads NAME.safetensors of a checkpoint into `module` (see `save_checkpoint`)."""
    path = checkpoint / f"{name}.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{checkpoint} has no {path.name}: it was saved by a run without it")
    try:
        module.load_state_dict(load_file(str(path), device=str(next(module.parameters()).device)))
    except Exception as e:  # a truncated file, or one of another shape
        raise CheckpointError(f"cannot load {path}: {e}") from None


#: More than a checkpoint's settings or fingerprints take (a few KB): a larger file is not one of them.
JSON_BYTES = 1 << 20


def load_config(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's saved settings."""
    return _read_json(checkpoint / CONFIG_FILE)


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object that a checkpoint holds, read as data (`read_json_object`: a pipe or a device in the file's
    place is not opened, nor more than `JSON_BYTES` read, and anything but a JSON object is an error)."""
    try:
        return read_json_object(path, JSON_BYTES)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror if isinstance(e, OSError) and e.strerror else e}") \
            from None
