"""Checkpoints: the policy in the Hugging Face GPT-2 layout plus the trainer's state, written atomically.

    OUTPUT_DIR/checkpoints/step-000050/{config.json, model.safetensors, vocab.json, merges.txt, trainer_state.pt,
                                        train_config.json}
                                       (+ one NAME.safetensors per extra module, e.g. the GAE value head)
    OUTPUT_DIR/checkpoints/latest        (the name of the newest complete checkpoint)

A checkpoint is assembled in a temporary directory and renamed into place, and `latest` is replaced
atomically after it, so a crash at any moment leaves the previous checkpoint intact and `latest` valid.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from rookworld.ground.files import atomic_write, publish, temporary_directory
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


def _write_text_atomic(path: Path, text: str) -> None:
    with atomic_write(path, fsync=True) as f:
        f.write(text)


def save_checkpoint(output_dir: str | os.PathLike, step: int, model, state: dict[str, Any], config: dict[str, Any],
                    keep: int, modules: dict[str, torch.nn.Module] | None = None, tokenizer=None) -> Path:
    """Writes checkpoint `step` and prunes all but the newest `keep`; returns its directory. `modules` are
    trained beside the policy but not part of it: each goes to its own NAME.safetensors, so `model.safetensors`
    stays a plain GPT-2. The tokenizer's vocab.json and merges.txt make the directory loadable offline."""
    root = Path(output_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    tmp = temporary_directory(f".{name}.", root)
    try:
        save_pretrained(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / STATE_FILE)
        for module_name, module in (modules or {}).items():
            tensors = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
            save_file(tensors, str(tmp / f"{module_name}.safetensors"))
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        if final.exists():  # saved again (e.g. the final step right after a periodic save)
            shutil.rmtree(final)
        publish(tmp)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_text_atomic(root / LATEST, name + "\n")
    for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


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


def load_state(checkpoint: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The trainer's state, read without running code: torch's weights-only unpickler builds tensors, plain
    containers and numbers (and the numpy arrays of older checkpoints) and refuses everything else, so a run
    directory from someone else cannot execute anything on --resume."""
    path = checkpoint / STATE_FILE
    try:
        with torch.serialization.safe_globals(LEGACY_SAFE_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        refused = str(e).split("\n")[0] if "Unsupported global" not in str(e) else next(
            line.strip() for line in str(e).splitlines() if "Unsupported global" in line)
        raise CheckpointError(f"{path} holds more than training state (tensors, numbers, containers), which "
                              f"rookworld does not load: it could run code ({refused}); resume only from run "
                              f"directories you trust, or start a new run from its model with --model "
                              f"{checkpoint}") from None
    except Exception as e:  # a truncated or foreign file
        raise CheckpointError(f"cannot read {path}: {e}") from None


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


def load_config(checkpoint: Path) -> dict[str, Any]:
    try:
        return json.loads((checkpoint / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {checkpoint / CONFIG_FILE}: {e}") from None
