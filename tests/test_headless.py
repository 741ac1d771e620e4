"""The core is headless (STYLE.md 1): everything under diag/ and rules/ imports, and the CLI
builds its parser, in a fresh interpreter where Textual cannot be imported at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# `sys.modules[name] = None` makes `import name` raise ImportError: textual is unimportable.
PROBE = """
import importlib, pkgutil, sys
sys.modules["textual"] = None
import diag, rules
names = ["diag", "diag.cli", "diag.engine.run", "rules"]
for pkg in (diag, rules):
    names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
# The TUI's data layer (queries, snapshots, sources) and its command registration are headless too.
names += ["diag.tui_commands", "tui.queries", "tui.raster", "tui.snapshot", "tui.sources"]
for name in names:
    importlib.import_module(name)
from diag.cli import build_parser
args = build_parser().parse_args(["tui", "somewhere"])
assert args.command == "tui"
loaded = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] == "textual")
assert not loaded, loaded
print(len(names))
"""


def test_core_imports_without_textual() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        "importing the core needed Textual (import it only inside tui/, and there only in the app):\n"
        + done.stderr[-3000:]
    )
    assert int(done.stdout.split()[-1]) > 20       # it walked the packages, not just the top level
