"""What every settings module shares: the error a bad setting raises, a setting's flag, the checks a setting
declares (each says what is wrong in the same words in every command that takes the setting), and `Slice`, the
frozen part of a command's settings that one part of it reads."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rookworld.io.errors import RookworldError
from rookworld.io.files import no_file_there
from rookworld.settings import shipped


class Slice:
    """The settings one part of a command reads, as a frozen dataclass whose fields are named as the settings
    are: the part is given `Slice.of(cfg)`, so what it reads is its signature, and nothing it holds can change
    under it (auto-batch rewrites the command's own settings, never a part's)."""

    @classmethod
    def of(cls, cfg: Any):
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})


class ConfigError(RookworldError, ValueError):
    """A setting that cannot work, said in one line."""


def need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def flag(name: str) -> str:
    """The command-line flag of setting `name`, without its dashes."""
    return name.replace("_", "-")


def nearest(typed: str, names: Iterable[str]) -> str | None:
    """The name a mistyped one most likely meant, spelt as `names` are (flags, TOML keys, commands): the closest
    spelling, else the name made of its words' initials, as other trainers' long names are rookworld's short ones
    (--learning-rate: --lr)."""
    names = list(names)
    close = difflib.get_close_matches(typed, names, n=1, cutoff=0.6)
    if close:
        return close[0]
    bare = typed.lstrip("-")
    words = [w for w in re.split(r"[-_]", bare) if w]
    initials = typed[: len(typed) - len(bare)] + "".join(w[0] for w in words)
    return initials if len(words) > 1 and initials in names else None


# A check takes the setting's flag (with dashes) and its value, never None, and says what is wrong, or None.


def positive(option: str, value: Any) -> str | None:
    return None if value >= 1 else f"{option} must be a positive integer, got {value}"


def non_negative(option: str, value: Any) -> str | None:
    return None if value >= 0 and not math.isnan(value) else f"{option} must be >= 0, got {value}"


#: The largest value of an integer setting that declares no `most` of its own: every integer a setting carries fits
#: the 32 bits the Rust core and the engines take (a PGN's --min-elo, a UCI `go nodes`), so no number typed in
#: overflows later, in a call or mid-game, where the error would be a traceback instead of a line.
MAX_INT = 2**31 - 1

#: Seeds are offset by up to about 2^33 for the streams a run must never share (evaluation, mate-in-one, held-out
#: stand-ins) and must then still fit the generators' 64 bits.
MAX_SEED = 2**63 - 1


def seed_range(option: str, value: Any) -> str | None:
    return None if 0 <= value <= MAX_SEED else f"{option} must be between 0 and 2^63 - 1, got {value}"


def above_zero(option: str, value: Any) -> str | None:
    return None if value > 0 and not math.isnan(value) else f"{option} must be > 0, got {value}"


#: The largest learning rate taken: above it the optimizer's first steps overflow float32 (AdamW divides the rate
#: by 1 - 0.9 in its first step), and the weights leave their range at once.
MAX_LR = 1e30


def learning_rate(option: str, value: Any) -> str | None:
    if not (value > 0 and not math.isnan(value)):
        return f"{option} must be > 0, got {value}"
    return None if value <= MAX_LR else f"{option} must be at most {MAX_LR:g}, got {value:g}: any step would " \
                                        f"overflow float32"


def share(option: str, value: Any) -> str | None:
    return None if 0.0 <= value <= 1.0 else f"{option} must lie in [0, 1], got {value}"


def existing_files(option: str, value: Any) -> str | None:
    """A file, or a list of files (sft's repeated --data), that exist."""
    for p in [value] if isinstance(value, str) else value:
        if (why := no_file_there(p)) is not None:
            return f"{option}: {why}: {p}{shipped.elsewhere(p) if why == 'no such file' else ''}"
    return None
