"""The analysis map step on an executor (local processes or Ray tasks), away from the store.

DuckDB lets no other process open a store while one writes it, so a worker cannot read the
parent's store. The parent exports one file's rows to Parquet (under the spill directory: shared
storage for Ray on several machines, as for the ingest), the worker loads them into a private
in-memory store, maps them exactly as the parent would (engine.map_rank) and returns the digest
(kB) and the per-file rows (Arrow); the parent inserts those and deletes the export.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from diag import store

if TYPE_CHECKING:
    from diag.digest import RankDigest
    from diag.executor import Executor

# The event tables a rank's map reads (timeline.load_rank, its host marks among them, collectives.calls_of).
SOURCE_TABLES = ("trace_files", "cpu_ops", "runtime_calls", "kernels", "copies", "collective_args", "other_events")


def map_elsewhere(con: duckdb.DuckDBPyConnection, files: list[int], gpu: str | None, executor: Executor[Any],
                  spill_dir: str | None) -> Generator[tuple[RankDigest, dict[str, pa.Table]], None, None]:
    """engine.map_rank of each file, in order, on `executor`."""
    root = Path(tempfile.mkdtemp(prefix="diag-map-", dir=spill_dir))
    try:
        calls = ((str(_export(con, f, root)), f, gpu) for f in files)
        yield from executor.imap(map_exported, calls)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _export(con: duckdb.DuckDBPyConnection, file_id: int, root: Path) -> Path:
    out = root / str(file_id)
    out.mkdir()
    for table in SOURCE_TABLES:
        con.execute(f"COPY (SELECT * FROM {table} WHERE file_id = {int(file_id)}) TO '{out / table}.parquet' "
                    "(FORMAT parquet)")
    return out


def map_exported(directory: str, file_id: int, gpu: str | None) -> tuple[RankDigest, dict[str, pa.Table]]:
    """Worker entry: one exported file mapped in a private in-memory store."""
    from diag.engine import gpu_part, map_rank
    from rules import RULES

    con = store.connect(None)
    try:
        for table in SOURCE_TABLES:
            path = str(Path(directory) / f"{table}.parquet").replace("'", "''")
            con.execute(f"INSERT INTO {table} SELECT * FROM read_parquet('{path}')")
        return map_rank(con, file_id, [r() for r in RULES], gpu_part(gpu))
    finally:
        con.close()
