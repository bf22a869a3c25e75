"""The integrations stay optional (issue 46): installing rookworld pulls in none of TRL, verifiers or OpenEnv, each
has its own extra, and only its own adapter module (and the command that serves it) imports it."""

from __future__ import annotations

import ast
import re
import sys

from conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PACKAGE = REPO / "python" / "rookworld"
#: Each trainer's package, the extra that installs it, and the modules allowed to import it.
FRAMEWORKS = {
    "trl": ("trl", {"rookworld.integrations.trl"}),
    "verifiers": ("verifiers", {"rookworld.integrations.verifiers", "rookworld.integrations.verifiers_v1"}),
    "verifiers-v1": ("verifiers", {"rookworld.integrations.verifiers", "rookworld.integrations.verifiers_v1"}),
    "openenv": ("openenv", {"rookworld.integrations.openenv"}),
}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def test_the_core_install_takes_no_trainer():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    assert not core & {"trl", "verifiers", "openenv", "openenv-core", "datasets", "transformers"}, core
    extras = project["optional-dependencies"]
    for extra, (package, _) in FRAMEWORKS.items():
        assert package in {_name(r) for r in extras.get(extra, [])}, f"no [{extra}] extra installs {package}"


def _module(path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_only_an_adapter_imports_its_trainer():
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                for package, allowed in FRAMEWORKS.values():
                    if top == package:
                        assert module in allowed, f"{module} imports {name} (line {node.lineno})"
