"""Settings that are known to work, shipped with the package: `rookworld sft --config NAME` and `rookworld train
--config NAME` read the [sft] or [train] table of NAME.toml here (a path to a TOML file of one's own works the
same). Each file says in its comments how to make its data and what to type.

A preset names the files it reads as they lie in a clone of the repository (models/chess-cpu-sft,
data/chess-cpu-held-out.jsonl) or as its comments make them: each is found in the current directory first, then in
the clone the package was installed from (rookworld.settings.shipped), so that a preset runs from any directory;
what it writes stays relative to the current one.
"""

from __future__ import annotations

import math
import os
import tomllib
from pathlib import Path

from rookworld.settings import shipped
from rookworld.settings.base import flag
from rookworld.settings.hub import is_local_path

DIRECTORY = Path(__file__).resolve().parent
#: The settings that name files a preset's run reads (the others, output_dir above all, name places it writes).
READS = ("model", "data", "eval_data")

#: The peak learning rate that works for a model of fewer parameters than the bound, per command (cpu-demo and
#: learning for the 8.9M-parameter model, rookworld-lm-124m and the defaults for 124M). A run 10x or more away
#: from it is warned: 3e-6, right for GRPO at 124M, leaves a fresh small model where it was. (chess-play's GRPO
#: runs at 2e-5, the rate its SFT model ended on: at 1e-4 it lost next states; LEARNING.md, "In short".)
LEARNING_RATES = {"sft": ((50e6, 1e-3), (float("inf"), 3e-4)), "train": ((50e6, 1e-4), (float("inf"), 3e-6))}


def names() -> list[str]:
    return sorted(p.stem for p in DIRECTORY.glob("*.toml"))


def path(name: str) -> Path | None:
    """The preset file of `name`, or None when it is not one."""
    file = DIRECTORY / f"{name}.toml"
    return file if name in names() else None


def grpo_after(sft_dir: str | os.PathLike) -> str | None:
    """The GRPO command that follows the SFT run written to `sft_dir`, or None: an SFT run from a preset ([sft]'s
    output_dir) is pointed on to the same preset's [train] settings, from this very model when the preset's GRPO
    starts from another (the chess-cpu one starts from the model shipped under models/)."""
    here = os.path.normpath(sft_dir)
    for name in names():
        tables = tomllib.loads(DIRECTORY.joinpath(f"{name}.toml").read_text())
        model = tables.get("train", {}).get("model")
        if not isinstance(model, str):
            continue
        if os.path.normpath(model) == here:
            return f"rookworld train --config {name}"
        if os.path.normpath(tables.get("sft", {}).get("output_dir", "")) == here:
            return f"rookworld train --config {name} --model {sft_dir}"
    return None


def recommended_lr(command: str, n_params: int) -> float:
    return next(lr for bound, lr in LEARNING_RATES[command] if n_params < bound)


def schedule_warnings(command: str, lr: float, warmup_steps: int, steps: int, n_params: int) -> list[str]:
    """What is wrong with a learning-rate schedule before any step runs."""
    out = []
    if warmup_steps >= steps:
        out.append(f"--warmup-steps {warmup_steps} is not shorter than --steps {steps}: the learning rate never "
                   f"reaches --lr {lr:g}; give fewer warm-up steps")
    good = recommended_lr(command, n_params)
    if not good / 10 < lr < good * 10:
        orders = abs(math.log10(lr) - math.log10(good))  # a ratio of 1e308 and 3e-6 is no float
        times = f"{10 ** orders:.0f}x" if orders < 6 else f"10^{orders:.0f} times"
        out.append(f"--lr {lr:g} is {times} {'above' if lr > good else 'below'} the "
                   f"{good:g} that works for a model of this size ({n_params / 1e6:.1f}M parameters) in rookworld "
                   f"{command}; the presets have settings that work (--config {' / '.join(names())})")
    return out


def data_commands(name: str) -> dict[str, str]:
    """The commands a preset's comments give for its data files: the file each one writes (--out) to the command,
    with the files it reads named where they are found (a held-out set in the clone, from another directory)."""
    made: dict[str, str] = {}
    command = ""
    for line in DIRECTORY.joinpath(f"{name}.toml").read_text().splitlines():
        text = line.lstrip("#").split("  #")[0].strip()
        if not line.startswith("#") or not (command or text.startswith("rookworld positions")):
            command = ""
            continue
        command = f"{command} {text.rstrip(chr(92)).strip()}".strip()
        if text.endswith(chr(92)):  # a command continued on the next line
            continue
        words = command.split()
        if "--out" in words[:-1]:
            out = words[words.index("--out") + 1]
            made[out] = " ".join(w if w == out or not shipped.is_shipped(w) else shipped.find(w) or w for w in words)
        command = ""
    return made


def placed(values: dict) -> dict:
    """A preset's settings with the files it reads named where they are: here, else in the clone (the rest, and
    what is in neither place, as the preset names them)."""
    out = dict(values)
    for key in READS:
        value = out.get(key)
        if isinstance(value, str):
            out[key] = shipped.find(value) or value
        elif isinstance(value, list):
            out[key] = [shipped.find(v) or v if isinstance(v, str) else v for v in value]
    return out


def missing(name: str, values: dict) -> str | None:
    """What a preset's run lacks before it starts, in one line: every file not here, each with how to get it (the
    shipped ones from a clone, the data with the commands that make it, a model with the run that makes it). A
    newcomer was told of one file, without the command; a model missing outside the clone was looked for on the
    hub."""
    wanted = [(key, f) for key in READS if key != "model" for v in [values.get(key)]
              for f in ([v] if isinstance(v, str) else v or []) if isinstance(f, str)]
    absent = [(key, f) for key, f in wanted if not Path(f).is_file()]
    model = values.get("model")
    if isinstance(model, str) and is_local_path(model) and not Path(model).expanduser().is_dir():
        absent.insert(0, ("model", model))
    if not absent:
        return None
    parts = []
    from_clone = [(key, f) for key, f in absent if shipped.is_shipped(f)]
    if from_clone:
        instead = " and ".join(dict.fromkeys("--model DIR" if key == "model" else f"--{flag(key)} FILE"
                                             for key, _ in from_clone))
        parts.append(f"{', '.join(f for _, f in from_clone)} {'is' if len(from_clone) == 1 else 'are'} not here: "
                     f"{shipped.GET_THEM}; or pass {instead}")
    data = [f for key, f in absent if key != "model"]
    how = "; ".join(command for out, command in data_commands(name).items() if out in data)  # held-out first
    if own := [f for f in data if not shipped.is_shipped(f)]:
        parts.append(f"its data is not here ({', '.join(own)})" + (f"; make it first (in this directory): {how}"
                                                                   if how else ""))
    elif how:
        parts.append(f"or make the data (in this directory): {how}")
    if model is not None and ("model", model) in absent and not shipped.is_shipped(model):
        maker = next((other for other in names() if _table(other, "sft").get("output_dir") == model), None)
        parts.append(f"its model {model} is not here: " + (f"make it first with rookworld sft --config {maker}, or "
                                                           f"pass --model DIR" if maker else "pass --model DIR"))
    return f"--config {name}: " + "; ".join(parts)


def _table(name: str, command: str) -> dict:
    return tomllib.loads(DIRECTORY.joinpath(f"{name}.toml").read_text()).get(command, {})
