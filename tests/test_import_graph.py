"""Imports flow one way (STYLE.md 14): the command layer is a tree, not a circle. The CLI builds the
parser and imports the commands; the commands import the core; nothing imports the CLI; the gate's
comparison (diag/outputs/gate.py) and its renderers never import a command module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("diag", "rules", "tui", "fixtures")
COMMAND_LAYER = ("diag.cli", "diag.commands", "diag.outputs.gate", "diag.outputs.gate_output", "diag.tui_commands", "diag.knowledge.mfu",
                 "diag.capture.profiler", "diag.capture.example.launch", "diag.api")
CLI = ("diag.cli", "diag.commands", "diag.tui_commands")


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


def test_the_command_layer_has_no_cycle() -> None:
    cycles = [c for c in _cycles(_graph()) if set(c) & set(COMMAND_LAYER)]
    assert not cycles, f"modules of the command layer import each other in a circle: {cycles}"


def test_nothing_imports_the_cli_and_the_core_imports_no_command() -> None:
    graph = _graph()
    assert not [m for m, deps in graph.items() if "diag.cli" in deps]
    below = [m for m in graph if m not in CLI and m not in ("diag.cli",)]
    upward = {m: sorted(graph[m] & set(CLI)) for m in below if graph[m] & set(CLI)}
    assert not upward, f"core modules importing a command module: {upward}"


def test_the_graph_sees_imports_inside_functions() -> None:
    """The check is only as good as the graph: the lazy imports the handlers make are in it."""
    graph = _graph()
    assert {"diag.outputs.gate", "diag.outputs.gate_output", "diag.api"} <= graph["diag.commands"]
    assert "diag.commands" in graph["diag.tui_commands"] and "diag.tui_commands" in graph["diag.cli"]
