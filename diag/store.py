"""The DuckDB store: opening it, the schema, and writing one parsed file atomically."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

SQL_DIR = resources.files("diag") / "sql"

# Columns written from Arrow as raw JSON bytes (diag.ingest.kineto.JSON_COLUMNS); DuckDB turns
# them into JSON text in one vectorized pass.
_JSON_COLUMNS = frozenset({"args", "input_dims", "input_types", "grid", "block", "in_split", "out_split", "record"})


def sql_text(name: str) -> str:
    return (SQL_DIR / name).read_text()


def connect(db: str | Path | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) a diag store. `None` gives an in-memory store."""
    con = duckdb.connect(":memory:" if db is None else str(db), read_only=read_only)
    # DuckDB draws its own progress bar on the terminal, over the TUI (DESIGN.md).
    con.execute("SET enable_progress_bar = false")
    if not read_only:
        con.execute(sql_text("schema.sql"))
    return con


def known_hashes(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """content hash → path of every file already in the store."""
    return dict(con.execute("SELECT content_hash, path FROM trace_files").fetchall())


def write_file(
    con: duckdb.DuckDBPyConnection, file_row: dict[str, Any], tables: dict[str, pa.Table]
) -> int:
    """Insert one file's row and its event tables in one transaction; returns its file_id.

    A failure anywhere leaves nothing of the file behind (ingest is atomic per file).
    """
    con.execute("BEGIN TRANSACTION")
    try:
        file_id = con.execute("SELECT nextval('file_id_seq')").fetchone()[0]  # type: ignore[index]
        row = dict(file_row, file_id=file_id, ingested_at=datetime.now(timezone.utc).replace(tzinfo=None))
        for key in ("device_props", "distributed_info", "warnings"):
            row[key] = None if row.get(key) is None else json.dumps(row[key])
        cols = list(row)
        con.execute(
            f"INSERT INTO trace_files ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
            [row[c] for c in cols],
        )
        for name, table in tables.items():
            if table.num_rows:
                _insert(con, name, table, file_id, file_row.get("rank"))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return int(file_id)


def _insert(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table, file_id: int, rank: int | None) -> None:
    exprs = [
        f'CAST(decode("{c}") AS JSON)' if c in _JSON_COLUMNS and pa.types.is_binary(table.schema.field(c).type)
        else f'"{c}"'
        for c in table.column_names
    ]
    con.register("_incoming", table)
    try:
        con.execute(
            f"INSERT INTO {name} (file_id, rank, {', '.join(table.column_names)}) "
            f"SELECT {file_id}, {'NULL' if rank is None else int(rank)}, {', '.join(exprs)} FROM _incoming"
        )
    finally:
        con.unregister("_incoming")
