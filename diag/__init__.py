"""diag: where did the MFU go? (README.md)

In Python (docs/notebook.md): `run = diag.open(path)`, then `run.report`, `run.ledger()`, ... The
notebook API is imported on first use (`diag.open`), so `import diag`, and `diag --help` with it,
loads neither DuckDB nor the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

# The one place the version is written: pyproject.toml reads it ([tool.setuptools.dynamic]),
# `diag --version` prints it and every JSON report carries it as `diag_version`.
__version__ = "0.1.0"

_NOTEBOOK = ("open", "Run")


def __getattr__(name: str) -> Any:
    if name in _NOTEBOOK:
        # By name, not an import statement: every module imports this package (for __version__ at
        # least), and a static import here would make each of them import the API layer above it.
        return getattr(importlib.import_module("diag.notebook"), name)
    raise AttributeError(f"module 'diag' has no attribute {name!r}")


__all__ = ["Run", "__version__", "open"]
