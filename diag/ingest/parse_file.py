"""One file's parse: its bytes read (or taken from the read ahead), told apart by content (Kineto,
merged ranks, NCCL-side), checked against what the store holds of its path (unchanged, grown,
replaced), and its tables written into a Sink: held in memory, or spilled to Parquet for a
worker's parent."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from diag.ingest import read_ahead
from diag.ingest.discover import rank_from_name
from diag.ingest.kineto import Begun, read_kineto
from diag.ingest.kineto import begin as begin_kineto
from diag.ingest.kineto_decode import device_props_for, rank_from_distributed_info
from diag.ingest.merged import rank_map
from diag.ingest.sniff import trace_format
from diag.ingest.source import SourceBytes, read_source
from diag.runtime import store
from diag.runtime.errors import BadInput
from diag.runtime.sanitize import printable

if TYPE_CHECKING:
    import pyarrow.parquet as pq
from diag.ingest.options import IngestOptions, Prior, Sink, Skipped, Spilled, failed


def parse_into(
    path: str, known: frozenset[str], opts: IngestOptions, explicit: bool, sink: Sink, split: bool = False,
    prior: Prior | None = None,
) -> dict[str, Any] | Skipped:
    """Read, detect and parse one file, pushing its tables into `sink` as they are parsed (its
    rank set first); with `split`, a big file is parsed by this process and a forked child at
    once. Returns the file's trace_files row, or why it was skipped. `prior`: the file read
    before at this path (see Prior): the row says whether it appends to it or replaces it."""
    taken = read_ahead.take(path, opts.max_bytes, opts.salvage)
    src, begun = taken if taken is not None else (read_source(path, opts.max_bytes, salvage=opts.salvage), None)
    with ExitStack() as done:
        if begun is not None:
            done.enter_context(begun)
        return _parse_source(path, src, begun, done, known, opts, explicit, sink, split, prior)


def _parse_source(
    path: str, src: SourceBytes, begun: Begun | None, done: ExitStack, known: frozenset[str], opts: IngestOptions,
    explicit: bool, sink: Sink, split: bool, prior: Prior | None,
) -> dict[str, Any] | Skipped:
    """parse_into, once the file is read (`begun`: its parse's first steps, if taken already;
    `done`: what parse_into closes at its end)."""
    if src.content_hash in known:
        return Skipped(path, "already ingested (same content)", duplicate=True)
    grown = prior is not None and prior.read_bytes is not None and len(src.data) >= prior.read_bytes and \
        _hash(src, prior.read_bytes) == prior.read_hash
    fmt = trace_format(src.data)
    if fmt.kind not in (None, "kineto"):
        return _nccl_file(path, src, fmt.kind, opts, sink, prior, grown)
    if fmt.kind is None:
        if explicit:
            raise BadInput(path, "JSON that is not a trace (no traceEvents)", 0)
        return Skipped(path, "not a trace (no traceEvents)")
    merged = None if begun is not None else rank_map(src.data)   # begun only for a file that merges no ranks
    if begun is None:
        begun = done.enter_context(begin_kineto(path, src.data, opts.salvage, src.release, split and merged is None))
    info, chunks = read_kineto(path, src.data, salvage=opts.salvage, release=src.release, split=split,
                               rank_map=merged, while_waiting=sink.flush, begun=begun)
    warnings = [fmt.warning] if fmt.warning else []
    rank, world, backend = rank_from_distributed_info(info.distributed_info)
    if world is not None and not 1 <= world < 2**31:   # trace_files.world_size is an INTEGER
        # As a counted value, not the file's error: a 2^31 once failed the whole batch's INSERT (exit 3).
        warnings.append(f"values: distributedInfo.world_size {_number(world)} is not a world size (1 to 2^31 - 1); "
                        "read as unknown")
        world = None
    source: str | None = "distributedInfo"
    if merged is not None:
        # A merge tool keeps the first rank's distributedInfo (sglang) or none: the names decide.
        rank, source = merged.ranks[0], "merged"
        sink.split(merged.ranks)
    if rank is None and opts.rank is not None:
        rank, source = opts.rank, "option"
    if rank is None:
        rank = rank_from_name(path)
        source = "filename" if rank is not None else None   # None: by process, once all files are in
        if rank is not None:
            warnings.append(f"rank {rank} taken from the file name (no distributedInfo.rank)")
    for r in [rank] if merged is None else merged.ranks:
        if r is not None and not 0 <= r < 2**31:   # trace_files.rank is an INTEGER
            raise BadInput(path, f"rank {r} (from {source}) is not a rank")
    sink.rank = rank
    profiler_ranges = 0
    for tables in chunks:
        sink.add(tables)
        if "other_events" in tables:   # the forked second half sends one table per chunk
            profiler_ranges += _count(tables["other_events"], "cat", "cuda_profiler_range")
    if merged is not None:
        warnings.append(f"merges ranks {', '.join(map(str, merged.ranks))}, told apart by {merged.how}: "
                        "one timeline per rank")
        if merged.unplaced:
            warnings.append(f"{merged.unplaced} events of processes that name no rank were kept with rank "
                            f"{merged.ranks[0]}")
    if not info.has_gpu and profiler_ranges:
        # CUPTI's range profiler (torch.profiler's experimental_config profiler_metrics) records
        # counters per range in place of the activity timeline: there are no kernels to sweep.
        warnings.append(f"no GPU activity (kernels, memcpy, memset): the GPU work was captured as {profiler_ranges} "
                        "CUPTI profiler ranges (cuda_profiler_range: counters per range, no kernel timeline)")
    elif not info.has_gpu:
        warnings.append("no GPU activity (kernels, memcpy, memset): CPU-only or an unsupported accelerator")
    dev = device_props_for(info.device_props, info.kernel_devices)
    row = {
        "path": printable(path), "content_hash": src.content_hash, "kind": "kineto", "rank": rank, "rank_source": source,
        "world_size": world, "backend": backend, "device_name": None if dev is None else dev.get("name"),
        "device_props": info.device_props, "distributed_info": info.distributed_info,
        "schema_version": info.schema_version, "schema_era": info.schema_era, "time_unit": info.time_unit,
        "base_time_ns": info.base_time_ns, "first_ts_ns": info.first_ts_ns, "last_ts_ns": info.last_ts_ns,
        "n_events": info.n_events, "has_gpu": info.has_gpu, "partial": info.partial,
        "damage_offset": info.damage_offset, "warnings": [*src.warnings, *warnings, *info.warnings],
        "read_bytes": len(src.data), "read_hash": src.content_hash,
        **({"parts": merged.ranks} if merged is not None else {}),
    }
    return _against(row, prior, len(src.data), grown, appended=False)


def _nccl_file(
    path: str, src: SourceBytes, kind: str, opts: IngestOptions, sink: Sink, prior: Prior | None, grown: bool
) -> dict[str, Any]:
    """An NCCL-side file's row. An Inspector log that only grew since it was read is parsed on from
    where that read stopped, and its new rows go to that file (`sink.file_id`)."""
    from diag.ingest import nccl, nccl_rows

    resume = None
    if grown and prior is not None and prior.kind == kind == "nccl_inspector" and prior.read_state is not None:
        resume = nccl_rows.Resume(int(prior.read_bytes or 0), prior.read_state)
        sink.file_id = prior.file_id
    p = nccl.parse_nccl_file(path, bytes(src.data), rank=opts.rank, resume=resume)
    read = len(src.data) if p.resume is None else p.resume.offset
    before = prior.n_events if resume is not None and prior is not None else 0
    row = {"path": printable(path), "content_hash": src.content_hash, "kind": p.kind, "rank": p.rank,
           "rank_source": p.rank_source, "n_events": before + p.table.num_rows, "has_gpu": False, "partial": False,
           "warnings": [*src.warnings, *p.warnings], "read_bytes": read, "read_hash": _hash(src, read),
           "read_state": None if p.resume is None else p.resume.state}
    sink.rank = p.rank
    sink.add({"nccl_ops": p.table})
    return _against(row, prior, len(src.data), grown, appended=resume is not None)


def _hash(src: SourceBytes, n: int) -> str:
    """sha256 of the first n bytes."""
    return src.content_hash if n == len(src.data) else hashlib.sha256(memoryview(src.data)[:n]).hexdigest()


def _against(row: dict[str, Any], prior: Prior | None, size: int, grown: bool, appended: bool) -> dict[str, Any]:
    """The row, marked to append to the file read before at its path (`appends_to`) or to replace it
    (`replaces`): a log that grew, or a salvaged trace whose whole version has come; a file that
    changed before where it was read is a new file, said in a warning."""
    if prior is None:
        return row
    if appended:
        return {**row, "appends_to": prior.file_id}
    if not grown:
        if prior.read_bytes is None:
            why = "read before without a record of where that read stopped"
        elif size < prior.read_bytes:
            why = f"shrank to {size} bytes from the {prior.read_bytes} read before"
        else:
            why = f"changed within the {prior.read_bytes} bytes read before"
        row["warnings"] = [f"{why}: read as a new file, in place of the {prior.n_events} records read from "
                           "this path before"] + row["warnings"]
    return {**row, "replaces": prior.file_id}


class _Held:
    """A small file's sink: its tables (and then its trace_files row) kept in memory until its
    batch is written."""

    def __init__(self) -> None:
        self.rank: int | None = None
        self.file_id = -1   # store.write_files numbers the batch's files
        self.tables: dict[str, list[pa.Table]] = {}
        self.nbytes = 0
        self.row: dict[str, Any] = {}

    def split(self, ranks: list[int]) -> None:
        raise _Merged

    def add(self, tables: dict[str, pa.Table]) -> None:
        for name, t in tables.items():
            if t.num_rows:
                self.tables.setdefault(name, []).append(t)
                self.nbytes += store.arrow_bytes(t)

    def flush(self) -> None:
        """Nothing to write: the batch writes the held files."""


class _Merged(Exception):
    """A small file that holds several ranks: FileWriter numbers its parts, so it is not held."""


class _ParquetSpill:
    """A worker's sink: each table's chunks appended to one Parquet file."""

    def __init__(self, parent: str | None) -> None:
        self.rank: int | None = None
        self.file_id = -1   # the parent's writer numbers the rows (an appended log's: the row's appends_to)
        if parent is not None:
            os.makedirs(parent, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="diag-spill-", dir=parent)
        self.writers: dict[str, pq.ParquetWriter] = {}

    def __enter__(self) -> _ParquetSpill:
        return self

    def split(self, ranks: list[int]) -> None:
        """The tables carry their rows' ranks; the parent splits the file when it loads them."""

    def add(self, tables: dict[str, pa.Table]) -> None:
        import pyarrow.parquet as pq  # here, not at the top: only parse workers spill (11 ms of imports)

        for name, t in tables.items():
            if t.num_rows:
                if name not in self.writers:
                    self.writers[name] = pq.ParquetWriter(os.path.join(self.dir, f"{name}.parquet"), t.schema,
                                                          compression="none")
                self.writers[name].write_table(t)

    def flush(self) -> None:
        """Nothing buffered: add writes each table as it comes."""

    def __exit__(self, *exc: object) -> None:
        for w in self.writers.values():
            w.close()
        if exc[0] is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def _spill_file(
    path: str, known: frozenset[str], opts: IngestOptions, explicit: bool, prior: Prior | None
) -> Spilled | Skipped | BadInput:
    """Worker entry (a process or a Ray task): parse one file into Parquet. Touches no database."""
    try:
        with _ParquetSpill(opts.spill_dir) as spill:
            out = parse_into(path, known, opts, explicit, spill, prior=prior)
    except Exception as e:  # noqa: BLE001 - one file's failure, whatever it is, is that file's alone
        return failed(path, e)
    if isinstance(out, Skipped):
        shutil.rmtree(spill.dir, ignore_errors=True)
        return out
    return Spilled(path, out, {n: os.path.join(spill.dir, f"{n}.parquet") for n in spill.writers}, spill.dir)


def _count(table: pa.Table, column: str, value: str) -> int:
    """Rows of `table` whose `column` equals `value`: in Python, as pyarrow.compute's import (~35 ms
    of CPU) would be the only one in `diag ingest` (other_events holds a chunk's few metadata,
    instant and counter events)."""
    return table.column(column).to_pylist().count(value) if table.num_rows else 0


def _number(n: int) -> str:
    """An integer for a message: a long one by its length (a 400-digit one filled the line)."""
    return str(n) if -10**20 < n < 10**20 else f"of {len(str(abs(n)))} digits"
