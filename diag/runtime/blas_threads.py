"""diag's own processes run NumPy's OpenBLAS on one thread.

diag does no linear algebra, yet the OpenBLAS that NumPy's wheels bundle starts a thread per
further core when NumPy is imported, and that thread spins ~0.1 s waiting for work before it
sleeps (`blas_thread_server` in `perf record` of `diag analyze`, 2026-12): `python -c "import
numpy; time.sleep(0.3)"` takes 0.20 s of CPU, 0.09 s with OPENBLAS_NUM_THREADS=1. In `diag analyze`
that spin runs while the file is read ahead and the DuckDB store opens on the other core.

Only processes diag starts, and only where every process below them is diag's own: not `diag
capture` or `diag example`, whose children are the user's training runs, with their own BLAS. A
value the user set is kept.
"""

from __future__ import annotations

import os


def one_blas_thread() -> None:
    """Before NumPy is imported in this process (its children inherit it)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
