"""diag: where did the MFU go? (README.md)

In Python (docs/notebook.md): `run = diag.open(path)`, then `run.report`, `run.ledger()`, ... The
notebook API is imported on first use (`diag.open`), so `import diag`, and `diag --help` with it,
loads neither DuckDB nor the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.notebook import Run, open  # noqa: A004

# The one place the version is written: pyproject.toml reads it ([tool.setuptools.dynamic]),
# `diag --version` prints it and every JSON report carries it as `diag_version`.
__version__ = "0.1.0"

_NOTEBOOK = ("open", "Run")


def __getattr__(name: str) -> Any:
    if name in _NOTEBOOK:
        from diag import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'diag' has no attribute {name!r}")


__all__ = ["Run", "__version__", "open"]
