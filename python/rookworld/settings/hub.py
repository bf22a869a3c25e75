"""Which names of a model are local paths and which are Hugging Face hub repo ids (torch-free: flag checks use it).

A name is a local path when it exists, starts like one (`.`, `/`, `~`), or its parent directory exists
(`runs/sftt` beside a `runs/`); otherwise only a plausible `owner/name` is a repo id. A typo in a local path is
then reported as a missing directory, not as a hub that cannot be reached.
"""

from __future__ import annotations

import re
from pathlib import Path

# The hub's own rule, roughly: an owner and a name of letters, digits, '-', '_' and '.', neither starting with
# a '.' or '-', and no '--' or '..'.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9_][\w.-]{0,95}")


def is_local_path(name: str) -> bool:
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~", "\\")):
        return True
    if "/" in name.rstrip("/") and path.parent.is_dir():
        return True
    return not is_repo_id(name)


def is_repo_id(name: str) -> bool:
    return bool(_REPO_ID.fullmatch(name)) and "--" not in name and ".." not in name and not name.endswith(".")
