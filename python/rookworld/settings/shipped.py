"""The files that ship beside rookworld's code rather than in its package: the models under models/ and the
held-out positions under data/ of its repository. The presets and the default model name them by their place in
a clone; a command finds them from any directory, first in the current one (a user's own files win), then in the
clone the package was installed from: an editable install runs from it (python/rookworld/../..), and pip records
the directory of a `pip install .` (direct_url.json). A wheel built elsewhere has no clone, and the message that
asks for one says so.
"""

from __future__ import annotations

import functools
import json
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

PACKAGE = Path(__file__).resolve().parents[1]
#: The directories of a clone whose files ship with rookworld.
SHIPPED = ("models", "data")
#: The model ask, play, uci and eval load unless told: the chess-play chain's GRPO model (trained on positions of
#: games, the best of the shipped ones at them), which needs no network and no GPU.
MODEL = "models/chess-play-grpo"
#: The model rookworld is built for, on the Hugging Face hub: the training commands' default, and the others'
#: where no clone is at hand.
HUB_MODEL = "jrahn/RookWorld-LM-124M"
#: How to get the shipped files without a clone at hand, said wherever one is missing.
GET_THEM = ("rookworld's models/ and data/ ship with its repository, not with the installed package: run from a "
            "clone of it (pip install -e it to find them from any directory)")


@functools.cache
def repository() -> Path | None:
    """The clone the package was installed from, when it is still there with its shipped files."""
    for root in (PACKAGE.parent.parent, _installed_from()):
        if root is not None and (root / "pyproject.toml").is_file() and any((root / d).is_dir() for d in SHIPPED):
            return root
    return None


def _installed_from() -> Path | None:
    """The local directory pip installed the package from (PEP 610), or None (a wheel, an index)."""
    try:
        record = metadata.distribution("rookworld").read_text("direct_url.json")
        url = json.loads(record or "{}").get("url", "")
    except (metadata.PackageNotFoundError, ValueError, AttributeError, OSError):
        return None
    parsed = urlparse(url) if isinstance(url, str) else None
    return Path(unquote(parsed.path)) if parsed is not None and parsed.scheme == "file" else None


def is_shipped(path: str) -> bool:
    """Whether a path names a place in a clone's models/ or data/ (such as a preset's model)."""
    parts = Path(path).parts
    return bool(parts) and parts[0] in SHIPPED


def find(path: str) -> str | None:
    """A relative path as a preset or a default names it, where it is: here, else in the clone (an absolute path);
    None when it is in neither. An absolute path is only ever itself."""
    here = Path(path).expanduser()
    if here.exists():
        return path
    root = repository()
    if here.is_absolute() or root is None or not (root / path).exists():
        return None
    return str(root / path)


def elsewhere(path: str) -> str:
    """Where the clone has a shipped file that a user named from another directory ("" when it has not): a flag's
    path is taken as given, and the error that it is not there says where it is."""
    found = find(path) if is_shipped(path) else None
    return f" (the clone rookworld was installed from has {found})" if found and found != path else ""


def model() -> str:
    """The default model of ask, play, uci and eval: the shipped one where it can be found, else the hub's."""
    return find(MODEL) or HUB_MODEL
