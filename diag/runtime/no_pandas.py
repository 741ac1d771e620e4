"""diag's own processes run as if pandas were not installed, so that pyarrow never imports it.

When pandas is installed, pyarrow imports it the first time it converts Python or NumPy values
(`pa.array` of a list, `Array.to_numpy`, in its Cython layer and again in its C++ helpers): 0.16–0.3 s
of CPU in every `diag analyze` (`python -X importtime`, 2026-12), for an integration diag never
uses: it hands pyarrow no pandas object and asks none back. pandas is an optional dependency of
pyarrow and none of diag's, so this is what a plain `pip install diag` runs anyway: the same arrays,
the same numbers (the control trace's report JSON is byte-equal with and without).

Only processes diag starts do this (the `diag` command, its parse workers): `diag.api` used from
a program of its own leaves that program's pandas alone, and a process that has already imported
pandas keeps it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec


# A finder as sys.meta_path takes one: an object with find_spec. Not a subclass of
# importlib.abc.MetaPathFinder, whose import (importlib.resources, tempfile) cost every command
# ~8 ms at its start (python -X importtime).
class _Absent:
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {fullname!r} (diag runs without pandas: diag/runtime/no_pandas.py)",
                                      name=fullname)
        return None


def keep_pandas_out() -> None:
    """From now on `import pandas` fails in this process, as where it is not installed."""
    if "pandas" in sys.modules or any(isinstance(f, _Absent) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Absent())
