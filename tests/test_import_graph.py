"""Imports flow one way (STYLE.md 14): the stages are layers (the import-linter contracts in
pyproject.toml: cli > tui > api > outputs > engine > rules > attribution > timeline >
ingest|capture > knowledge > runtime), and no module imports a module that imports it, at the top
or inside a function."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("diag", "rules", "tui", "fixtures")
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    """Module → the project modules it imports, at the top or inside a function alike."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            graph[module] |= {t for name in targets if (t := resolve(name)) and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out



def test_no_module_imports_a_module_that_imports_it() -> None:
    cycles = _cycles(_graph())
    assert not cycles, f"modules that import each other in a circle: {cycles}"


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    if not Path(LINT_IMPORTS).exists():
        pytest.skip("lint-imports (import-linter, a dev dependency) is not installed")
    return subprocess.run([LINT_IMPORTS, "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})


def test_the_stage_contracts_hold() -> None:
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in proc.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    """The contract is not vacuous: the knowledge layer reaching up into the outputs fails it."""
    for pkg in ("diag", "rules", "tui"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    hardware = tmp_path / "diag" / "knowledge" / "hardware.py"
    hardware.write_text(hardware.read_text() + "\nfrom diag.outputs import report  # noqa: E402,F401\n")
    proc = _lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "diag.knowledge.hardware -> diag.outputs.report" in proc.stdout


def test_the_graph_sees_imports_inside_functions() -> None:
    """The cycle check is only as good as the graph: the lazy imports the handlers make are in it."""
    graph = _graph()
    assert {"diag.outputs.gate", "diag.outputs.gate_output", "diag.api"} <= graph["diag.commands"]
    assert "diag.commands" in graph["diag.tui_commands"] and "diag.tui_commands" in graph["diag.cli"]
