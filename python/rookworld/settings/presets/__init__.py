"""Settings that are known to work, shipped with the package: `rookworld sft --config NAME` and `rookworld train
--config NAME` read the [sft] or [train] table of NAME.toml here (a path to a TOML file of one's own works the
same). Each file says in its comments how to make its data and what to type.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent

#: The peak learning rate of the presets for a model of fewer parameters than the bound, per command (cpu-demo and
#: learning for the 8.9M-parameter model, rookworld-lm-124m and the defaults for 124M). A run 10x or more away
#: from it is warned: 3e-6, right for GRPO at 124M, leaves a fresh small model where it was.
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
        out.append(f"--lr {lr:g} is {max(lr / good, good / lr):.0f}x {'above' if lr > good else 'below'} the "
                   f"{good:g} that works for a model of this size ({n_params / 1e6:.1f}M parameters) in rookworld "
                   f"{command}; the presets have settings that work (--config {' / '.join(names())})")
    return out


def data_commands(name: str) -> dict[str, str]:
    """The commands a preset's comments give for its data files: the file each one writes (--out) to the command."""
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
            made[words[words.index("--out") + 1]] = command
        command = ""
    return made


def missing_data(name: str, values: dict) -> str | None:
    """What a preset's run lacks before it starts: every data file not here, with the commands that make them (a
    newcomer was told of one file, without the command)."""
    files = [values.get("data"), values.get("eval_data")]
    wanted = [f for v in files for f in ([v] if isinstance(v, str) else v or []) if isinstance(f, str)]
    missing = [f for f in wanted if not Path(f).is_file()]
    if not missing:
        return None
    made = data_commands(name)
    how = [command for out, command in made.items() if out in missing]  # in the file's order: held-out first
    return (f"--config {name}: its data is not here ({', '.join(missing)})" +
            (f"; make it first (in this directory): {'; '.join(how)}" if how else ""))
