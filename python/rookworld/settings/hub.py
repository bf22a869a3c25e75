"""Which names of a model are local paths and which are Hugging Face hub repo ids (torch-free: flag checks use it).

A name is a local path when it exists, starts like one (`.`, `/`, `~`), or its first directory exists (`runs/sftt`
beside a `runs/`) or is one rookworld keeps its models in (`models/chess-cpu-sft` of a preset, run outside the
clone); otherwise only a plausible `owner/name` is a repo id. A typo in a local path is then reported as a missing
directory, not as a hub that cannot be reached.
"""

from __future__ import annotations

import re
from pathlib import Path

from rookworld.settings.shipped import SHIPPED

# The hub's own rule, roughly: an owner and a name of letters, digits, '-', '_' and '.', neither starting with
# a '.' or '-', and no '--' or '..'.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9_][\w.-]{0,95}")
#: Where rookworld's own models are: the shipped ones (models/ of a clone) and every run's (runs/, where the
#: presets and the defaults write). A name under them is a path even where they are not.
MODEL_PLACES = (*SHIPPED, "runs")


def is_local_path(name: str) -> bool:
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~", "\\")):
        return True
    first, *rest = re.split(r"[/\\]", name.strip("/\\"))
    if rest and (first in MODEL_PLACES or Path(first).exists()):
        return True
    return not is_repo_id(name)


def is_repo_id(name: str) -> bool:
    return bool(_REPO_ID.fullmatch(name)) and "--" not in name and ".." not in name and not name.endswith(".")
