"""Declared dependencies match what the installed packages import, both ways (issue 12): a module
that imports an undeclared package breaks `pip install -e .` on a fresh machine, and a declared
package nothing imports is weight every user downloads for nothing."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pyproject's `tomli; python_version < '3.11'`
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("diag", "rules", "tui", "fixtures")   # [tool.setuptools.packages.find] include
# Extras that provide commands or executors; `dev` holds the tools that test and benchmark diag.
RUNTIME_EXTRAS = ("capture", "ray")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()   # PEP 503


def _declared() -> dict[str, str]:
    """Distribution name → where pyproject.toml declares it ("" for the base dependencies)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = {"": project["dependencies"]} | {e: project["optional-dependencies"][e] for e in RUNTIME_EXTRAS}
    return {_normal(re.match(r"[A-Za-z0-9._-]+", req).group()): extra   # type: ignore[union-attr]
            for extra, reqs in groups.items() for req in reqs}


def _imported() -> dict[str, set[str]]:
    """Top-level third-party module → the files that import it."""
    ours = set(PACKAGES)
    found: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ours:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def _distribution(module: str) -> str:
    # tomli is imported only on Python < 3.11, so it may not be installed here to be looked up.
    dists = importlib.metadata.packages_distributions().get(module, [module])
    return _normal(dists[0])


def test_every_import_is_declared() -> None:
    declared = _declared()
    undeclared = {m: sorted(files) for m, files in _imported().items() if _distribution(m) not in declared}
    assert not undeclared, f"imported but not in pyproject.toml's dependencies or {RUNTIME_EXTRAS}: {undeclared}"


def test_every_declared_dependency_is_imported() -> None:
    used = {_distribution(m) for m in _imported()}
    unused = sorted(d for d in _declared() if d not in used)
    assert not unused, f"declared in pyproject.toml but imported by none of {PACKAGES}: {unused}"


def test_numpy_and_the_extras_are_where_they_belong() -> None:
    """The two facts the check rests on: numpy is a base dependency (sixteen modules import it),
    torch comes with `capture` (`diag capture`, `diag example`)."""
    declared = _declared()
    assert declared["numpy"] == "" and declared["torch"] == "capture" and declared["ray"] == "ray"
