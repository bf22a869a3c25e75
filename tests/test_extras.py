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


def _installed(root, name: str, version: str, *requires: str) -> None:
    """A package's installed metadata, as pip writes it (a dist-info folder), under `root` on sys.path."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\n"
                                   f"Name: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))


def test_an_extra_whose_packages_another_replaced_says_so_on_import(tmp_path, monkeypatch):
    """pip installs one extra over another without a word (verifiers 0.4's mcp==2.0.0 over OpenEnv's fastmcp): the
    adapter reads the installed metadata and warns, naming the requirement that is no longer met and the fix."""
    import warnings

    import pytest

    from rookworld.integrations import extras

    _installed(tmp_path, "rw-server", "1.0", "rw-mcp-kit[client,server]>=3", "rw-web; extra == 'web'",
               "rw-win; sys_platform == 'x'")
    # Its own requirement's, one level down, under the extras the server asks for (and one no one asks for).
    _installed(tmp_path, "rw-mcp-kit", "3.1", "rw-mcp<2; extra == 'client'", "rw-mcp<2; extra == 'server'",
               "rw-mcp>=9; extra == 'other'")
    _installed(tmp_path, "rw-mcp", "2.0.0")               # what the other extra pinned
    _installed(tmp_path, "rw-whole", "1.0", "rw-mcp>=2", "rw-absent>=1; extra == 'more'")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert extras.unmet("rw-server") == ["rw-mcp-kit needs rw-mcp<2, and rw-mcp 2.0.0 is installed"]
    assert extras.unmet("rw-server", depth=1) == []  # the broken requirement is the second level's
    assert extras.unmet("rw-whole") == [] and extras.unmet("rw-not-installed") == []
    with pytest.warns(extras.ExtrasConflict, match=r"rookworld\[openenv\]: rw-mcp-kit needs rw-mcp<2, and rw-mcp "
                                                   r"2\.0\.0 is installed\. Another extra .* its own environment"):
        extras.check("openenv", "rw-server")
    _installed(tmp_path, "rw-lonely", "1.0", "rw-gone>=1")
    assert extras.unmet("rw-lonely") == ["rw-lonely needs rw-gone>=1, which is not installed"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        extras.check("openenv", "rw-whole")  # nothing unmet: no warning
