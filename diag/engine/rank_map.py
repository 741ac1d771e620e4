"""The analysis map step on an executor (local processes or Ray tasks), away from the store.

DuckDB lets no other process open a store while one writes it, so a worker cannot read the
parent's store. The parent exports a batch of files' rows to Parquet (under the spill directory:
shared storage for Ray on several machines, as for the ingest), the worker loads them into a
private in-memory store, maps them exactly as the parent would (map_step.map_ranks) and returns
each file's digest (kB) and the batch's per-file rows, one Arrow table each (tables.combined); the
parent inserts those and deletes the export. Small files go in batches (timeline.read_batches, at
most BATCH_FILES): a COPY and a worker call cost milliseconds each, more than a rank of 20
kernels takes to map (issue 16).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from diag.attribution.tables import combined
from diag.engine.map_step import gpu_part, map_ranks
from diag.runtime import store
from diag.timeline.rank import read_batches
from rules import RULES

if TYPE_CHECKING:
    from diag.attribution.digest import RankDigest
    from diag.runtime.executor import Executor

# The event tables a rank's map reads (timeline.load_rank, its host marks among them, collectives.calls_of).
SOURCE_TABLES = ("trace_files", "cpu_ops", "runtime_calls", "kernels", "copies", "collective_args", "other_events")


# Batches small enough that both workers have several while the parent exports the next.
BATCH_FILES = 256


def map_elsewhere(con: duckdb.DuckDBPyConnection, files: list[int], gpu: str | None, executor: Executor[Any],
                  spill_dir: str | None) -> Generator[tuple[list[RankDigest], list[dict[str, pa.Table]]], None, None]:
    """map_step.map_ranks of `files` on `executor`, a batch at a time: the batch's digests in order
    and its files' rows together (tables.combined)."""
    root = Path(tempfile.mkdtemp(prefix="diag-map-", dir=spill_dir))
    try:
        calls = ((str(_export(con, batch, root)), batch, gpu) for batch in read_batches(con, files, BATCH_FILES))
        for digests, rows in executor.imap(map_exported, calls):
            yield digests, [rows]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _export(con: duckdb.DuckDBPyConnection, files: list[int], root: Path) -> Path:
    out = root / str(files[0])
    out.mkdir()
    ids = store.id_set(files)
    for table in SOURCE_TABLES:
        con.execute(f"COPY (SELECT * FROM {table} WHERE file_id IN ({ids})) TO '{out / table}.parquet' (FORMAT parquet)")
    return out


def map_exported(directory: str, files: list[int], gpu: str | None) -> tuple[list[RankDigest], dict[str, pa.Table]]:
    """Worker entry: exported files mapped, in order, in a private in-memory store."""
    con = store.connect(None)
    try:
        for table in SOURCE_TABLES:
            path = str(Path(directory) / f"{table}.parquet").replace("'", "''")
            con.execute(f"INSERT INTO {table} SELECT * FROM read_parquet('{path}')")
        mapped = list(map_ranks(con, files, [r() for r in RULES], gpu_part(gpu)))
        return [d for d, _ in mapped], combined([rows for _, rows in mapped])
    finally:
        con.close()
