"""diag's own processes take Arrow's memory from the system allocator (malloc), not from the
mimalloc pool that pyarrow's wheels default to.

diag builds and drops many small Arrow tables (a chunk's eight tables every 4 MB of JSON, each
rank's rows in the map step); mimalloc keeps the pages it freed for its next allocations, so the
process stays at its high-water mark. Peak memory of the process tree (bench/scale.py's
`measure`, interleaved runs, 2026-12): the 35 MB control trace's `diag analyze` 339 MB with
mimalloc, 290 MB with the system allocator, in the same time (2.06 s and 1.99 s, medians of 7);
the 307 MB trace's `diag ingest` 1012 MB and 933 MB.

Only processes diag starts do this (the `diag` command; its workers inherit the environment), and
a pool the user chose with ARROW_DEFAULT_MEMORY_POOL is kept.
"""

from __future__ import annotations

import os


def use_system_allocator() -> None:
    """Before pyarrow allocates anything in this process."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
