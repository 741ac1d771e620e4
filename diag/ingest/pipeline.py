"""`diag ingest`: files → parse (in worker processes, one per file) → DuckDB (one writer).

Each file is parsed in a worker process (ranks in parallel) and written by the parent in its own
transaction, so a bad file leaves nothing behind and never blocks the good ones. A file whose
content hash is already in the store adds 0 rows.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from diag import store
from diag.errors import BadInput
from diag.ingest.discover import discover, rank_from_name
from diag.ingest.kineto import device_props_for, parse_kineto, rank_from_distributed_info
from diag.ingest.source import DEFAULT_MAX_BYTES, read_source


@dataclass(frozen=True)
class IngestOptions:
    salvage: bool = False
    max_bytes: int = DEFAULT_MAX_BYTES
    rank: int | None = None   # --rank: for a single file whose trace and name carry none
    jobs: int | None = None   # worker processes; default: one per core


@dataclass(frozen=True)
class Parsed:
    path: str
    file_row: dict[str, Any]
    tables: dict[str, pa.Table]


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass
class IngestResult:
    ingested: list[tuple[str, int]] = field(default_factory=list)   # (path, file_id)
    skipped: list[Skipped] = field(default_factory=list)
    errors: list[BadInput] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def parse_file(path: str, known: frozenset[str], opts: IngestOptions, explicit: bool) -> Parsed | Skipped:
    """Read, detect and parse one file. Runs in a worker process: touches no database."""
    src = read_source(path, opts.max_bytes)
    if src.content_hash in known:
        return Skipped(path, "already ingested (same content)")
    from diag.ingest import nccl

    kind = nccl.detect_kind(src.data[:65536])
    if kind is not None:
        return _parsed_nccl(path, nccl.parse_nccl_file(path, src.data, rank=opts.rank), src.content_hash)
    if b'"traceEvents"' not in src.data:
        if explicit:
            raise BadInput(path, "JSON that is not a trace (no traceEvents)", 0)
        return Skipped(path, "not a trace (no traceEvents)")
    k = parse_kineto(path, src.data, salvage=opts.salvage)
    warnings = list(k.warnings)
    rank, world, backend = rank_from_distributed_info(k.distributed_info)
    source = "distributedInfo"
    if rank is None and opts.rank is not None:
        rank, source = opts.rank, "option"
    if rank is None:
        rank = rank_from_name(path)
        source = "filename"
        if rank is None:
            raise BadInput(
                path,
                "no rank: the trace has no distributedInfo.rank and the file name has none; "
                "name it rank-N.json or pass --rank N",
            )
        warnings.append(f"rank {rank} taken from the file name (no distributedInfo.rank)")
    if not k.has_gpu:
        warnings.append("no GPU activity (kernels, memcpy, memset): CPU-only or an unsupported accelerator")
    devices = k.tables["kernels"].column("device").to_pylist()[:1] or k.tables["copies"].column("device").to_pylist()[:1]
    dev = device_props_for(k.device_props, devices)
    row = {
        "path": path,
        "content_hash": src.content_hash,
        "kind": "kineto",
        "rank": rank,
        "rank_source": source,
        "world_size": world,
        "backend": backend,
        "device_name": None if dev is None else dev.get("name"),
        "device_props": k.device_props,
        "distributed_info": k.distributed_info,
        "schema_version": k.schema_version,
        "schema_era": k.schema_era,
        "time_unit": k.time_unit,
        "base_time_ns": k.base_time_ns,
        "first_ts_ns": k.first_ts_ns,
        "last_ts_ns": k.last_ts_ns,
        "n_events": k.n_events,
        "has_gpu": k.has_gpu,
        "partial": k.partial,
        "damage_offset": k.damage_offset,
        "warnings": warnings,
    }
    return Parsed(path, row, k.tables)


def _parsed_nccl(path: str, p: Any, content_hash: str) -> Parsed:
    table: pa.Table = p.table
    row = {
        "path": path,
        "content_hash": content_hash,
        "kind": p.kind,
        "rank": p.rank,
        "rank_source": p.rank_source,
        "n_events": table.num_rows,
        "has_gpu": False,
        "partial": False,
        "warnings": list(p.warnings),
    }
    return Parsed(path, row, {"nccl_ops": table})


def ingest(
    paths: list[str],
    con: duckdb.DuckDBPyConnection,
    opts: IngestOptions = IngestOptions(),
    progress: Callable[[int, int, str], None] | None = None,
) -> IngestResult:
    files, explicit = discover(paths)
    if opts.rank is not None and len(files) > 1:
        raise BadInput(paths[0], "--rank names the rank of one file; it was given with several")
    known = store.known_hashes(con)
    result = IngestResult()
    seen: dict[str, str] = dict(known)
    for i, outcome in enumerate(_parse_all(files, frozenset(known), opts, frozenset(explicit))):
        path = files[i]
        if progress:
            progress(i + 1, len(files), path)
        if isinstance(outcome, BadInput):
            result.errors.append(outcome)
        elif isinstance(outcome, Skipped):
            result.skipped.append(outcome)
        elif outcome.file_row["content_hash"] in seen:
            result.skipped.append(Skipped(path, f"same content as {seen[outcome.file_row['content_hash']]}"))
        else:
            outcome.file_row["path"] = path
            try:
                _check_window(con, outcome)
                file_id = store.write_file(con, outcome.file_row, outcome.tables)
            except BadInput as e:
                result.errors.append(e)
                continue
            seen[outcome.file_row["content_hash"]] = path
            result.ingested.append((path, file_id))
            result.warnings.extend(f"{path}: {w}" for w in outcome.file_row.get("warnings") or [])
    _number_windows(con)
    return result


def _parse_all(
    files: list[str], known: frozenset[str], opts: IngestOptions, explicit: frozenset[str]
) -> Iterator[Parsed | Skipped | BadInput]:
    """Parse outcomes in the order of `files`; at most 2 per worker in flight, to bound memory."""
    jobs = min(opts.jobs or os.cpu_count() or 1, len(files))
    if jobs <= 1:
        for f in files:
            yield _safe_parse(f, known, opts, f in explicit)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        pending: list[Future[Parsed | Skipped | BadInput]] = []
        nxt = 0
        for _ in range(len(files)):
            while nxt < len(files) and len(pending) < 2 * jobs:
                f = files[nxt]
                pending.append(pool.submit(_safe_parse, f, known, opts, f in explicit))
                nxt += 1
            yield pending.pop(0).result()


def _safe_parse(path: str, known: frozenset[str], opts: IngestOptions, explicit: bool) -> Parsed | Skipped | BadInput:
    try:
        return parse_file(path, known, opts, explicit)
    except BadInput as e:
        return e
    except MemoryError:
        return BadInput(path, "out of memory while parsing; lower --max-bytes or free memory")


def _check_window(con: duckdb.DuckDBPyConnection, p: Parsed) -> None:
    """Two different files claiming the same rank over overlapping time are an error naming both."""
    row = p.file_row
    if row["kind"] != "kineto" or row["rank"] is None or row["first_ts_ns"] is None:
        return
    clash = con.execute(
        "SELECT path FROM trace_files WHERE kind = 'kineto' AND rank = ? "
        "AND first_ts_ns <= ? AND last_ts_ns >= ? LIMIT 1",
        [row["rank"], row["last_ts_ns"], row["first_ts_ns"]],
    ).fetchone()
    if clash:
        raise BadInput(
            p.path,
            f"claims rank {row['rank']} over the same capture window as {clash[0]} "
            "(two different traces of one rank and time); ingest one of them",
        )


def _number_windows(con: duckdb.DuckDBPyConnection) -> None:
    """Several files of one rank are separate capture windows, numbered by their first timestamp."""
    con.execute(
        """
        UPDATE trace_files AS t SET capture_window = w.n
        FROM (SELECT file_id, dense_rank() OVER (PARTITION BY rank ORDER BY first_ts_ns) - 1 AS n
              FROM trace_files WHERE kind = 'kineto') AS w
        WHERE t.file_id = w.file_id
        """
    )


def print_progress_factory() -> Callable[[int, int, str], None] | None:
    """A rich progress bar on stderr when it is a terminal; None (silent) otherwise."""
    if not sys.stderr.isatty():
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(
        TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), transient=True,
    )
    task = None

    def update(done: int, total: int, path: str) -> None:
        nonlocal task
        if total <= 1:
            return
        if task is None:
            prog.start()
            task = prog.add_task(os.path.basename(path), total=total)
        prog.update(task, completed=done, description=os.path.basename(path))
        if done >= total:
            prog.stop()

    return update
