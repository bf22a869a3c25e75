"""Whether the packages an extra installed still fit together. pip installs one extra over another without a word
when the two need different versions of one package: `[verifiers-v1]` (verifiers 0.4 pins mcp==2.0.0) after
`[openenv]` (its fastmcp needs another mcp) replaces what OpenEnv needs, and the first sign is an import error deep
inside it. pip runs no code of rookworld's when it installs, so the adapter says it when it is imported."""

from __future__ import annotations

import re
import warnings
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement

#: How deep requirements are followed from the extra's package: OpenEnv's mcp is its third (openenv, fastmcp,
#: fastmcp-slim[client], mcp).
DEPTH = 3
#: The most requirements looked at: a package's metadata is read, not trusted to be small.
MOST = 500


class ExtrasConflict(UserWarning):
    """An extra's packages were replaced by another's (module docstring)."""


def unmet(package: str, depth: int = DEPTH) -> list[str]:
    """The requirements of installed `package`, and of theirs to `depth` (with the extras each asks for), that the
    installed versions do not meet, in words; none when `package` is not installed."""
    found, seen, todo = [], set(), [(package, frozenset(), 0)]
    while todo and len(seen) < MOST:
        name, wanted, level = todo.pop()
        if (_key(name), wanted) in seen:
            continue
        seen.add((_key(name), wanted))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires[:MOST]:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in {"", *wanted}):
                continue  # an extra nobody asked for, or another platform's
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                found.append(f"{name} needs {req.name}{req.specifier}, which is not installed")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                found.append(f"{name} needs {req.name}{req.specifier}, and {req.name} {have} is installed")
            elif level + 1 < depth:
                todo.append((req.name, frozenset(req.extras), level + 1))
    return list(dict.fromkeys(found))  # one line for a requirement two extras repeat


def check(extra: str, package: str) -> None:
    """An ExtrasConflict warning when `package` (the one rookworld[`extra`] is for) has unmet requirements."""
    if problems := unmet(package):
        warnings.warn(f"rookworld[{extra}]: {'; '.join(problems[:3])}. Another extra installed after this one "
                      f"replaced what {package} needs (verifiers 0.4 and OpenEnv need different versions of mcp): "
                      f"give each its own environment (python -m venv ENV && ENV/bin/pip install '.[{extra}]')",
                      ExtrasConflict, stacklevel=2)


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
