"""The DuckDB store: opening it, the schema, and writing one parsed file atomically."""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from diag.runtime.errors import BadInput
from diag.runtime.paths import NOT_A_STORE
from diag.runtime.sanitize import storable

SQL_DIR = resources.files("diag") / "sql"


def sql_text(name: str) -> str:
    return (SQL_DIR / name).read_text()


_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def named_queries(name: str) -> dict[str, str]:
    """The queries of a diag/sql file made of `-- name: <query>` blocks (notebook.sql, evidence.sql)."""
    parts = _BLOCK.split(sql_text(name))
    return {parts[i]: parts[i + 1].strip().rstrip(";") for i in range(1, len(parts), 2)}


# DuckDB's own default is 80% of physical memory, and it keeps every block it has written or read
# cached up to that limit: ingesting 560 MB of traces left 123 MB of table blocks resident, growing
# with the store. diag's queries are per-file scans, joins and group-bys of one rank's rows, which
# need far less; past the limit DuckDB evicts cached blocks and spills work to temp_directory. So
# a quarter of memory, at most 1 GiB, leaving the rest to the parse workers and the analysis.
MEMORY_LIMIT_BYTES = min(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4, 1024**3)
# An in-memory store (`analyze` without --db, and each worker's private store) holds the whole run
# in table blocks it does not compress: 512 generated ranks peaked at 1.18 GB with 582 MB of them
# (issue 41), and 4,096 ranks would need GBs. The analysis reads one rank's rows at a time, so past
# this limit DuckDB writes the blocks to temp_directory and reads a rank's back when it is mapped.
# 512 ranks passed even at 48 MiB; 4,096 ranks ran out of memory at 256 and at 512 MiB, after the
# map, in engine.run._mesh's query of the files' pg_config (every file lists the default group's
# 4,096 ranks: 24 kB of JSON a file), which is to read them in batches (issue 41).
MEMORY_STORE_LIMIT_BYTES = min(MEMORY_LIMIT_BYTES, 512 * 1024**2)


_memory_ahead: Future[duckdb.DuckDBPyConnection] | None = None


def connect_ahead() -> None:
    """Begin opening an in-memory store in a thread, for the next connect(None) to take. DuckDB's
    connect (~30 ms: it registers every function of its catalog) and the schema's DDL release the
    GIL, so a command that calls this before importing the rest of its modules gets its store
    while they import."""
    global _memory_ahead
    if _memory_ahead is None:
        _memory_ahead = Future()
        threading.Thread(target=_open_into, args=(_memory_ahead,), daemon=True).start()


def _open_into(done: Future[duckdb.DuckDBPyConnection]) -> None:
    try:
        done.set_result(_connect(None, False))
    except BaseException as e:
        done.set_exception(e)


def connect(db: str | Path | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) a diag store. `None` gives an in-memory store."""
    global _memory_ahead
    if db is None and not read_only and _memory_ahead is not None:
        ahead, _memory_ahead = _memory_ahead, None
        return ahead.result()
    return _connect(db, read_only)


CHECKPOINT_THRESHOLD = "256MiB"


def _connect(db: str | Path | None, read_only: bool) -> duckdb.DuckDBPyConnection:
    config: dict[str, str | bool | int | float | list[str]] = {
        "memory_limit": f"{(MEMORY_STORE_LIMIT_BYTES if db is None else MEMORY_LIMIT_BYTES) // 1024**2}MiB",
        # At DuckDB's default of 16 MiB nearly every file's commit checkpoints, and a checkpoint
        # costs more as the store grows: ingesting 128 files of 16 MB, the parent's CPU per file
        # rose from 0.40 to 0.71 s at 16 MiB, from 0.26 to 0.38 s at 256 MiB (docs/scale.md).
        # Rows not yet checkpointed (at most this much) stay in memory, inside memory_limit.
        "checkpoint_threshold": CHECKPOINT_THRESHOLD,
    }
    if db is None:
        # An in-memory store would otherwise spill into `.tmp` under the current directory; a file
        # store spills beside itself (`<db>.tmp`, DuckDB's default), on the disk the user chose.
        config["temp_directory"] = os.path.join(tempfile.gettempdir(), f"diag-duckdb-{os.getpid()}")
    try:
        con = duckdb.connect(":memory:" if db is None else str(db), read_only=read_only, config=config)
    except duckdb.Error as e:
        raise BadInput(str(db), f"cannot open the store: {_reason(e)}") from None
    # DuckDB draws its own progress bar on the terminal, over the TUI (DESIGN.md).
    con.execute("SET enable_progress_bar = false")
    if not read_only:
        con.execute(sql_text("schema.sql").replace(_RAW_TEXT, "USING COMPRESSION zstd" if _zstd_strings(con) else ""))
    return con


# The `args` columns hold each event's args as written, most of a Kineto trace's bytes (96 of the
# 158 MB of the 307 MB trace's cpu_ops). DuckDB's own choice for them, dictionary + FSST, costs more
# CPU for a bigger file than zstd: `diag ingest` of that trace took 8.78 s of CPU (6.84 s) into a
# 57 MB store, with zstd 8.17 s (6.17 s) into 31 MB (medians of 5, interleaved). Only a file store
# compresses (in memory the rows stay as they are), and only a storage format of DuckDB 1.2 or later
# holds zstd strings: DuckDB 2 writes v2.0.0 by default, 1.4 writes v1.0.0 (where the clause leaves
# the column uncompressed) and 1.1 does not know the clause. Elsewhere the marker stays a comment.
_RAW_TEXT = "/*raw_text_compression*/"
_ZSTD_STORAGE = (1, 2, 0)


def _zstd_strings(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store is a file whose storage format holds zstd-compressed strings."""
    version = re.match(r"v(\d+)\.(\d+)\.(\d+)", (_this_database(con, "tags") or {}).get("storage_version", ""))
    return version is not None and tuple(map(int, version.groups())) >= _ZSTD_STORAGE


def _this_database(con: duckdb.DuckDBPyConnection, column: str) -> Any:
    """A column of duckdb_databases() for the store (its `path`: None in memory; its `tags`)."""
    row = con.execute(f"SELECT {column} FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    return row[0] if row else None


def name(con: duckdb.DuckDBPyConnection) -> str:
    """The store's file as messages name it (an in-memory store has none)."""
    return str(_this_database(con, "path") or "the in-memory store")


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Commit what the block wrote, or roll it all back if it raises."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


@contextmanager
def appending(con: duckdb.DuckDBPyConnection, parse_cores: int) -> Iterator[None]:
    """While an ingest writes: DuckDB appends and compresses the rows the parse hands it, on the
    cores the parse leaves (at least one), and writes each full row group as it fills rather than
    five at once. A second DuckDB thread beside a parse that already holds both cores of a small
    machine only competes with it: `diag ingest` of the 307 MB trace peaked at 1006 MB and took
    8.85 s of CPU with DuckDB's defaults, 843 MB and 7.75 s so (medians of 9, interleaved)."""
    before = dict(con.execute("SELECT name, value FROM duckdb_settings() "
                              "WHERE name IN ('threads', 'write_buffer_row_group_count')").fetchall())
    con.execute(f"SET threads = {max(1, (os.cpu_count() or 1) - parse_cores)}")
    con.execute("SET write_buffer_row_group_count = 1")
    try:
        yield
    except BaseException:
        # The store's own failure (a full disk) is the one to tell, not a setting it then refuses.
        with suppress(duckdb.Error):
            _set(con, before)
        raise
    _set(con, before)


def _set(con: duckdb.DuckDBPyConnection, settings: dict[str, str]) -> None:
    for name, value in settings.items():
        con.execute(f"SET {name} = {int(value)}")


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """Append `rows` (tuples in the table's column order) in one vectorized INSERT. DuckDB's
    executemany runs one statement per row, about 5 ms each: 66 s of an 80 s analyze of 8 ranks
    × 87 steps went to it (docs/scale.md)."""
    if not rows:
        return
    names = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    insert_arrow(con, table, pa.table({n: pa.array([r[i] for r in rows]) for i, n in enumerate(names)}))


def id_set(ids: Iterable[int]) -> str:
    """SQL for `file_id IN (…)` over many ids: a subquery of one list. DuckDB parses and binds a
    list of literals one constant at a time: a query over 256 files' ids took 2–3× as long with
    `IN (1, 2, …)` as with `IN (SELECT unnest([1, 2, …]))` (the same rows in the same order)."""
    return f"SELECT unnest([{', '.join(str(int(i)) for i in ids)}])"


def arrow_table(con: duckdb.DuckDBPyConnection, query: str, params: Any = None) -> pa.Table:
    """A query's result as one Arrow table."""
    rel = con.sql(query, params=params)
    # DuckDB 2 names it to_arrow_table; 1.x returns the table from arrow().
    return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()


@contextmanager
def registered(con: duckdb.DuckDBPyConnection, name: str, data: pa.Table) -> Iterator[None]:
    """`data` readable as `name` inside the block. After a statement fails in a transaction, DuckDB
    refuses the unregister as well ("Current transaction is aborted"): the statement's own error
    is the one that goes on."""
    con.register(name, data)
    try:
        yield
    except BaseException:
        with suppress(duckdb.Error):
            con.unregister(name)
        raise
    con.unregister(name)


def insert_arrow(con: duckdb.DuckDBPyConnection, table: str, data: pa.Table) -> None:
    """Append an Arrow table whose columns are `table`'s, in order."""
    insert_from(con, f"INSERT INTO {table} SELECT * FROM _incoming", data)


def insert_from(con: duckdb.DuckDBPyConnection, sql: str, data: pa.Table) -> None:
    """Run `sql`, an INSERT that selects from `_incoming`, with `data` as _incoming: DuckDB finds
    it by that name among this function's locals (a replacement scan). Registered as a view and
    dropped again, it cost ~0.6 ms more an insert, about as much as a small table's insert itself
    (100 rows: 1.31 → 0.69 ms): `diag ingest` of 2,000 small files 3.26 → 3.15 s."""
    _incoming = data  # noqa: F841 - read by DuckDB, by name
    con.execute(sql)


def known_hashes(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """content hash → path of every file already in the store."""
    return dict(con.execute("SELECT content_hash, path FROM trace_files").fetchall())


def drop_file(con: duckdb.DuckDBPyConnection, file_id: int) -> None:
    """Every row of one file, from every table that holds rows of files (the analysis's too)."""
    tables = con.execute(
        "SELECT DISTINCT c.table_name FROM duckdb_columns() c JOIN duckdb_tables() t "
        "ON t.schema_name = c.schema_name AND t.table_name = c.table_name "
        "WHERE c.column_name = 'file_id' AND c.schema_name = 'main'"
    ).fetchall()
    for (table,) in tables:
        con.execute(f'DELETE FROM "{table}" WHERE file_id = ?', [file_id])


def parts_of(con: duckdb.DuckDBPyConnection, file_id: int) -> list[int]:
    """A file's id and those of the other ranks split from the same merged file (diag/ingest/merged.py):
    the rows of one path and one read."""
    return [f for (f,) in con.execute(
        "SELECT o.file_id FROM trace_files f JOIN trace_files o ON o.file_id = f.file_id "
        "OR (o.path = f.path AND o.read_hash = f.read_hash) WHERE f.file_id = ?", [file_id]).fetchall()]


def arrow_bytes(table: pa.Table) -> int:
    """A table's size for the flush thresholds (FLUSH_BYTES; engine's and ingest's batches of small
    files). Arrow's `nbytes` walks every buffer to count only its sliced part: 51 µs a table of
    80 rows, 0.5 s of an analyze of 2,000 small files; the buffers' whole size takes 3 µs. It counts more only for slices (DuckDB's result vectors:
    a small rank's activities 9.4 kB against 3.8 kB), which then flush a little sooner."""
    return int(table.get_total_buffer_size())


# Arrow buffered per file before it is inserted: a few chunks' worth, small beside the chunk's
# Python objects (a 4 MB chunk of JSON is ~3.5 MB of Arrow).
FLUSH_BYTES = 16 * 1024**2


class StoreFault(BadInput):
    """The store failed, not the file being written (a full disk): no other file can go in either,
    so the run stops here with this one line (exit 2) instead of a warning per file."""


class FileWriter:
    """One file's rows, written in one transaction: `add` chunks as they are parsed, then
    `finish` with the file's row. Leaving the `with` block any other way rolls everything back,
    so a failure leaves nothing of the file behind (ingest is atomic per file).

    A file that merges several ranks (diag/ingest/merged.py) is `split` into one file id per rank:
    its tables then carry a `rank` column, and each row goes to its rank's id."""

    def __init__(self, con: duckdb.DuckDBPyConnection, rank: int | None = None, last: bool = False) -> None:
        self.con = con
        self.rank = rank   # set before the first add: every row carries it
        self.last = last   # the run writes no other file after this one (see finish)
        self.file_id = -1
        self.parts: dict[int, int] = {}   # rank → file id, for a merged file
        self.done = False
        self.pending: dict[str, list[pa.Table]] = {}
        self.pending_bytes = 0

    def __enter__(self) -> FileWriter:
        self.con.execute("BEGIN TRANSACTION")
        # fetchall: DuckDB refuses other work on a connection while a result is left half-read.
        self.file_id = int(self.con.execute("SELECT nextval('file_id_seq')").fetchall()[0][0])
        return self

    def split(self, ranks: list[int]) -> None:
        """One file id per rank (the first rank keeps this file's id), before the first add."""
        ids = [self.file_id] + [int(r[0]) for r in self.con.execute(
            "SELECT nextval('file_id_seq') FROM range(?)", [len(ranks) - 1]).fetchall()]
        self.parts = dict(zip(ranks, ids, strict=True))

    def add(self, tables: dict[str, pa.Table]) -> None:
        """Buffer a chunk's tables; write them once FLUSH_BYTES of Arrow have gathered. Each
        INSERT costs ~2 ms besides its rows: the 35 MB control trace's 9 chunks × 7 tables took
        0.26 s one chunk at a time and 0.13 s in one go."""
        for name, table in tables.items():
            if table.num_rows:
                self.pending.setdefault(name, []).append(table)
                self.pending_bytes += arrow_bytes(table)
        if self.pending_bytes >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        for name, parts in self.pending.items():
            table = pa.concat_tables(parts)
            insert_from(self.con, self._insert_sql(name, table, "_incoming"), table)
        self.pending = {}
        self.pending_bytes = 0

    def add_parquet(self, name: str, path: str, schema: pa.Schema) -> None:
        self.con.execute(self._insert_sql(name, schema.empty_table(), f"read_parquet('{_sql_str(path)}')"))

    def _insert_sql(self, name: str, like: pa.Table, source: str) -> str:
        cols = _names(like)
        if "rank" in like.column_names:
            cases = " ".join(f"WHEN {int(r)} THEN {int(f)}" for r, f in self.parts.items())
            file_id, rank = f'CASE "rank" {cases} END', '"rank"'
        else:
            file_id, rank = str(self.file_id), "NULL" if self.rank is None else str(int(self.rank))
        return (f"INSERT INTO {name} (file_id, rank, {', '.join(cols)}) "
                f"SELECT {file_id}, {rank}, {', '.join(_quoted(cols))} FROM {source}")

    def finish(self, *file_rows: dict[str, Any], update: bool = False) -> int:
        """Write the file's row (a merged file: one per rank, each with its file_id) and commit.
        `update`: the rows added belong to a file already in the store (`file_id` set to it: an
        appended log), whose row takes these values."""
        self.flush()
        for file_row in file_rows:
            row = _stored_row(file_row, file_row.get("file_id", self.file_id))
            cols = list(row)
            if update:
                cols.remove("file_id")
                self.con.execute(f"UPDATE trace_files SET {', '.join(f'{c} = ?' for c in cols)} WHERE file_id = ?",
                                 [row[c] for c in cols] + [row["file_id"]])
            else:
                self.con.execute(
                    f"INSERT INTO trace_files ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                    [row[c] for c in cols],
                )
        self._commit()
        self.done = True
        return self.file_id

    def _commit(self) -> None:
        """COMMIT. The run's last file is checkpointed as it commits: DuckDB checkpoints a commit
        whose write-ahead log would pass the threshold, and writes no log for it. Else its rows
        would be logged, then checkpointed when the store closes: 60 MB of log for the 307 MB
        trace, its commit and close 0.71 → 0.45 s."""
        if not self.last:
            self.con.execute("COMMIT")
            return
        self.con.execute("SET checkpoint_threshold = '0B'")
        try:
            self.con.execute("COMMIT")
        finally:
            self.con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if not self.done:
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error:
                # The failed write already ended the transaction (a full disk aborts it): "cannot
                # rollback - no transaction is active" would hide the cause, which `exc` names.
                if exc is None:
                    raise
        if exc is not None and disk_full(exc):
            raise StoreFault(_db_path(self.con), f"cannot write the store: {_reason(exc)}; nothing of this "
                                               "file was kept (free space, or give --db on another disk)") from None


# DuckDB's words for a store another process holds: "... Conflicting lock is held in /usr/bin/python3 (PID 123) ..."
_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (.*?) \(PID (\d+)\)")
_NO_SPACE = ("No space left on device", "Disk quota exceeded", "File too large")


def _reason(e: BaseException) -> str:
    """DuckDB's message as one line about the cause, without its class prefix and the path the
    caller's line names already."""
    text = str(e).split("\n")[0]
    holder = _LOCK_HOLDER.search(text)
    if holder:
        return (f"in use by another process (PID {holder.group(2)}, {holder.group(1)}); DuckDB allows one "
                "writer: wait for it to finish, or give another --db")
    text = re.sub(r"^[A-Za-z ]*Error: ", "", text)
    text = re.sub(r'^(Cannot open file|The file) "[^"]*"(: )?', "", text).strip()
    if "not a valid DuckDB database file" in text:
        return NOT_A_STORE
    return text


def disk_full(e: BaseException) -> bool:
    return isinstance(e, duckdb.Error) and any(s in str(e) for s in _NO_SPACE)


def _db_path(con: duckdb.DuckDBPyConnection) -> str:
    try:
        path = _this_database(con, "path")
    except duckdb.Error:
        path = None
    return str(path or "the store")


def write_files(con: duckdb.DuckDBPyConnection,
                files: Sequence[tuple[dict[str, Any], int | None, dict[str, list[pa.Table]]]]) -> list[int]:
    """Several small parsed files — (trace_files row, rank, each table's chunks) — in one
    transaction with one INSERT per table, returning their file_ids in order. A transaction
    and an INSERT cost milliseconds whatever their size: written one file at a time, 2,000
    files of 20 kernels spent most of their ingest there (issue 16). All or none is written."""
    try:
        with transaction(con):
            ids = sorted(int(r[0]) for r in con.execute("SELECT nextval('file_id_seq') FROM range(?)",
                                                       [len(files)]).fetchall())
            for name in dict.fromkeys(n for _, _, tables in files for n in tables):
                parts = [
                    t.append_column("_file_id", pa.array([fid] * t.num_rows, pa.int64()))
                     .append_column("_rank", pa.array([rank] * t.num_rows, pa.int64()))
                    for fid, (_, rank, tables) in zip(ids, files, strict=True) for t in tables.get(name, ())
                ]
                data = concat_small(parts)
                insert_from(con, f"INSERT INTO {name} (file_id, rank, {', '.join(_names(data))}) "
                                 f"SELECT _file_id, _rank, {', '.join(_quoted(_names(data)))} FROM _incoming", data)
            by_cols: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            for fid, (row, _, _) in zip(ids, files, strict=True):
                stored = _stored_row(row, fid)
                by_cols.setdefault(tuple(stored), []).append(stored)
            for cols, rows in by_cols.items():
                # As Arrow, not as one VALUES list of parameters: DuckDB binds each parameter on
                # its own, ~42 ms for 64 files' rows against ~8 ms (a quarter of the parent's CPU
                # in an ingest of 2,000 small files).
                insert_from(con, f"INSERT INTO trace_files ({', '.join(cols)}) "
                                 f"SELECT {', '.join(_quoted(list(cols)))} FROM _incoming",
                            pa.table({c: [r[c] for r in rows] for c in cols}))
    except duckdb.Error as e:
        if disk_full(e):
            others = f", nor of the {len(files) - 1} small files written with it" if len(files) > 1 else ""
            raise StoreFault(_db_path(con), f"cannot write the store: {_reason(e)}; nothing of this file was kept"
                                            f"{others} (free space, or give --db on another disk)") from None
        raise
    return ids


def concat_small(parts: list[pa.Table]) -> pa.Table:
    """Several files' tables as one, for one INSERT. Their many small chunks go into one each:
    DuckDB scans an Arrow table chunk by chunk, and 64 tables of 80 rows inserted in 23 ms as
    they were, 11 ms combined (2026-12). One file's table is left as it is (a big file's would
    be copied whole)."""
    table = pa.concat_tables(parts, promote_options="default")
    return table.combine_chunks() if len(parts) > 1 else table


def _stored_row(file_row: dict[str, Any], file_id: int) -> dict[str, Any]:
    """A trace_files row as stored: its id, when, and its JSON columns as text."""
    row = dict(file_row, file_id=file_id, ingested_at=datetime.now(timezone.utc).replace(tzinfo=None))
    for key in ("device_props", "distributed_info", "warnings", "read_state"):
        # storable: a warning may quote a lone surrogate from the file, which DuckDB's JSON refuses.
        row[key] = None if row.get(key) is None else storable(json.dumps(row[key], ensure_ascii=False))
    return row


def _names(like: pa.Table) -> list[str]:
    """The columns to insert: not those that say whose a row is (a merged file's `rank`, a batch's
    `_file_id` and `_rank`), which become file_id and rank."""
    return [c for c in like.column_names if c not in ("rank", "_file_id", "_rank")]


def _quoted(names: list[str]) -> list[str]:
    return [f'"{n}"' for n in names]


def _sql_str(s: str) -> str:
    return s.replace("'", "''")
