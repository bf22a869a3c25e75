"""Checkpoints: the policy in the Hugging Face GPT-2 layout plus the trainer's state, written atomically.

    OUTPUT_DIR/checkpoints/step-000050/{config.json, model.safetensors, vocab.json, merges.txt, trainer_state.pt,
                                        train_config.json}
                                       (+ one NAME.safetensors per extra module, e.g. the GAE value head)
    OUTPUT_DIR/checkpoints/latest        (the name of the newest complete checkpoint)

A checkpoint is assembled in a temporary directory and renamed into place, and `latest` is replaced
atomically after it, so a crash at any moment leaves the previous checkpoint intact and `latest` valid.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rookworld.files import atomic_write, publish, temporary_directory

STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "train_config.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"step-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or read."""


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
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
    from safetensors.torch import save_file

    root = Path(output_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    tmp = temporary_directory(f".{name}.", root)
    try:
        model.save_pretrained(tmp)
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


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found) if (p / STATE_FILE).is_file()]


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory, or the newest checkpoint of an output directory."""
    path = Path(path).expanduser()
    if (path / STATE_FILE).is_file():
        return path
    root = path / "checkpoints"
    latest = root / LATEST
    if latest.is_file():
        candidate = root / latest.read_text().strip()
        if (candidate / STATE_FILE).is_file():
            return candidate
    found = list_checkpoints(path)
    if found:
        return found[-1]
    if (path / "metrics.jsonl").is_file():
        raise CheckpointError(f"--resume {path}: the run there stopped before saving a checkpoint, so there is "
                              "nothing to resume: start it again with --overwrite (and the same settings)")
    raise CheckpointError(f"--resume {path}: no checkpoint there (expected {STATE_FILE} in it or in "
                          f"{path}/checkpoints/step-*)")


def step_of(checkpoint: Path) -> int | None:
    """The step a checkpoint directory was saved at, from its name (None for a renamed one)."""
    m = _STEP_DIR.match(checkpoint.name)
    return int(m.group(1)) if m else None


def load_state(checkpoint: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    try:
        # Our own file: optimizer state and numpy RNG state need the full unpickler.
        return torch.load(checkpoint / STATE_FILE, map_location=map_location, weights_only=False)
    except Exception as e:  # a truncated or foreign file
        raise CheckpointError(f"cannot read {checkpoint / STATE_FILE}: {e}") from None


def load_module(checkpoint: Path, name: str, module: torch.nn.Module) -> None:
    """Loads NAME.safetensors of a checkpoint into `module` (see `save_checkpoint`)."""
    from safetensors.torch import load_file

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
