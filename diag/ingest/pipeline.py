"""`diag ingest`: files → parse → DuckDB, one transaction per file, memory bounded per file.

A file is parsed in chunks (kineto.read_kineto). With one worker the chunks stream straight into
the store; with several, each worker (a spawned process, or a Ray task: diag/runtime/executor.py) parses
whole files and spills their chunks to Parquet, which the parent (the one writer DuckDB allows)
loads in one transaction per file. A bad file leaves nothing behind and never blocks the good
ones; a file whose content hash is already in the store adds 0 rows. A file seen again at a
path already in the store (Prior) is read on from where the last read stopped when it only grew
(an NCCL Inspector log: its new records), and otherwise replaces the file read before.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Generator
from contextlib import ExitStack, closing
from typing import TYPE_CHECKING, Any, Protocol, cast

import duckdb
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from msgspec.structs import replace

from diag.ingest import read_ahead
from diag.ingest.discover import discover, rank_from_name
from diag.ingest.forked import can_split
from diag.ingest.kineto import Begun, read_kineto
from diag.ingest.kineto import begin as begin_kineto
from diag.ingest.kineto_decode import device_props_for, rank_from_distributed_info
from diag.ingest.kineto_tabulate import EVENT_TABLES, SCHEMAS
from diag.ingest.merged import rank_map
from diag.ingest.ranks import assign_by_process
from diag.ingest.sniff import AMBIGUOUS, trace_format
from diag.ingest.source import DEFAULT_MAX_BYTES, SourceBytes, read_source
from diag.runtime import store
from diag.runtime.errors import BadInput, printable
from diag.runtime.executor import LocalExecutor, make_executor
from diag.runtime.lifetime import run_dir

if TYPE_CHECKING:
    import pyarrow.parquet as pq

# Below this much input, starting worker processes (each imports pyarrow, msgspec, numpy: ~1 s)
# costs more than it saves.
_PARALLEL_BYTES = 32 * 1024**2
# Files of less JSON than this are parsed into memory and written many to a transaction
# (store.write_files), up to store.FLUSH_BYTES of Arrow or _HELD_FILES files at a time: a
# transaction and each INSERT cost milliseconds whatever their size, most of the time of 2,000
# files of 20 kernels one at a time (issue 16). A gzipped file counts as _GZIP_RATIO times its
# size (the 35 MB control trace packs 20× smaller), so that a big trace still streams and splits.
_SMALL_FILE_BYTES = 1024**2
_GZIP_RATIO = 20
# Many small Arrow tables take several times their nbytes: 500 files in one batch peaked at
# 178 MB against 118 MB one at a time, 115 MB 64 at a time.
_HELD_FILES = 64


def _small(path: str) -> bool:
    return _size(path) * (_GZIP_RATIO if path.endswith(".gz") else 1) < _SMALL_FILE_BYTES


class IngestOptions(msgspec.Struct, frozen=True):
    salvage: bool = False
    max_bytes: int = DEFAULT_MAX_BYTES
    rank: int | None = None   # --rank: for a single file whose trace and name carry none
    jobs: int | None = None   # worker processes; default: one per core (local) or per cluster CPU (ray)
    executor: str = "local"   # where workers run: diag.runtime.executor.EXECUTORS
    # Where workers write their Parquet spills (default: the system's temporary directory). With
    # Ray on several machines it must be storage every node and the parent see at the same path.
    spill_dir: str | None = None
    # The last file is checkpointed as it commits (store.FileWriter): for a run after which the store
    # closes, or is only read. Not where more is ingested soon after (diag live: every poll would
    # checkpoint, each costing more as the store grows; docs/scale.md).
    checkpoint_last: bool = True


class Skipped(msgspec.Struct, frozen=True):
    path: str
    reason: str
    duplicate: bool = False   # its content is in the store already


class Spilled(msgspec.Struct, frozen=True):
    """A file parsed in a worker: its row, and its tables as Parquet files to load."""

    path: str
    file_row: dict[str, Any]
    parquet: dict[str, str]
    spill_dir: str


class IngestResult(msgspec.Struct):
    ingested: list[tuple[str, int]] = msgspec.field(default_factory=list)   # (path, file_id)
    skipped: list[Skipped] = msgspec.field(default_factory=list)
    errors: list[BadInput] = msgspec.field(default_factory=list)
    warnings: list[str] = msgspec.field(default_factory=list)
    ambiguous: list[str] = msgspec.field(default_factory=list)   # files that fit two formats: shown by every command


class Prior(msgspec.Struct, frozen=True):
    """A file in the store whose path may hold more by now: an append-only NCCL-side log (read on
    from where it stopped), or a trace salvaged up to damage (replaced by its longer version)."""

    file_id: int
    kind: str
    n_events: int
    read_bytes: int | None
    read_hash: str | None
    read_state: dict[str, Any] | None


def priors(con: duckdb.DuckDBPyConnection) -> dict[str, Prior]:
    """Such files, by path as stored."""
    rows = con.execute(
        "SELECT path, file_id, kind, n_events, read_bytes, read_hash, read_state FROM trace_files "
        "WHERE partial OR read_state IS NOT NULL OR kind IN ('nccl_inspector', 'nccl_profiler') ORDER BY file_id"
    ).fetchall()
    return {r[0]: Prior(r[1], r[2], r[3], r[4], r[5], None if r[6] is None else json.loads(r[6])) for r in rows}


class Sink(Protocol):
    rank: int | None
    file_id: int        # the file the rows belong to: set to an earlier one's when they are appended to it

    def split(self, ranks: list[int]) -> None: ...

    def add(self, tables: dict[str, pa.Table]) -> None: ...

    def flush(self) -> None:
        """Write what `add` has buffered; the parse calls it while it waits on its forked child."""


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


def failed(path: str, e: Exception) -> BadInput:
    """A file's failure as the one line that names it; the other files go on (issue 15: a file
    nested 10^6 deep or with a 5000-digit integer once stopped every file after it)."""
    if isinstance(e, BadInput):
        return e
    if isinstance(e, MemoryError):
        return BadInput(path, "out of memory while parsing; lower --max-bytes or free memory")
    if isinstance(e, RecursionError):
        return BadInput(path, "nested too deeply to be a trace")
    return BadInput(path, f"could not be read: {type(e).__name__}: {e}")


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


def ingest(
    paths: list[str],
    con: duckdb.DuckDBPyConnection,
    opts: IngestOptions = IngestOptions(),
    progress: Callable[[int, int, str], None] | None = None,
) -> IngestResult:
    files, named = discover(paths)
    explicit = frozenset(named)   # looked up per file: 10,000 files named on the command line
    if opts.rank is not None and len(files) > 1:
        raise BadInput(paths[0], "--rank names the rank of one file; it was given with several")
    known = frozenset(store.known_hashes(con))
    before = priors(con)
    result = IngestResult()
    seen: dict[str, str] = store.known_hashes(con)
    jobs = min(opts.jobs or os.cpu_count() or 1, len(files))
    # Small files are batched in this process (_in_process; many are parsed on a pool of --jobs
    # workers there) however many there are, --jobs given or not: a spill worker's file goes
    # through Parquet and a transaction of its own (2,000 files of 20 kernels: 33 s that way with
    # --jobs 2, 4 s batched).
    if sum(_size(f) for f in files if not _small(f)) < _PARALLEL_BYTES:
        jobs = 1
    # Ray was asked for by name: its tasks run even where one local process would be quicker.
    workers = bool(files) and (jobs > 1 or opts.executor != "local")
    # Every temporary file of this run (spills, a split file's second half) in one directory,
    # removed at the end, or by the next run if this one is killed (diag/runtime/lifetime.py).
    # The parse takes --jobs cores (by default all of them: workers, or a big file's two halves).
    with run_dir(opts.spill_dir) as scratch, store.appending(con, opts.jobs or os.cpu_count() or 1):
        opts = replace(opts, spill_dir=scratch)
        # closing: an interruption ends the workers now, not when the generator is collected.
        with closing(_in_workers(files, con, known, opts, explicit, seen, jobs, before) if workers else
                     _in_process(files, con, known, opts, explicit, seen, before)) as outcomes:
            for i, (path, outcome) in enumerate(outcomes):
                if progress:
                    progress(i + 1, len(files), path)
                if isinstance(outcome, BadInput):
                    result.errors.append(outcome)
                elif isinstance(outcome, Skipped):
                    result.skipped.append(replace(outcome, path=path))   # as found, not as stored
                else:
                    result.ingested.extend((path, f) for f in outcome[0])
                    result.warnings.extend(f"{path}: {w}" for w in outcome[1])
                    result.ambiguous.extend(f"{path}: {w}" for w in outcome[1] if w.startswith(AMBIGUOUS))
    ingested = [f for _, f in result.ingested]
    if ingested:
        with store.transaction(con):
            result.warnings += assign_by_process(con, [f for (f,) in con.execute(
                f"SELECT file_id FROM trace_files WHERE kind = 'kineto' AND rank IS NULL "
                f"AND file_id IN ({store.id_set(ingested)})").fetchall()])
    _number_windows(con)
    return result


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:   # gone since the scan: reading it says so, as that file's error
        return 0


Outcome = tuple[list[int], list[str]] | Skipped | BadInput   # (file ids: one per rank of a merged file, warnings)


def _in_process(
    files: list[str], con: duckdb.DuckDBPyConnection, known: frozenset[str], opts: IngestOptions,
    explicit: frozenset[str], seen: dict[str, str], before: dict[str, Prior],
) -> Generator[tuple[str, Outcome], None, None]:
    # One file at a time here, so a big one may take both halves of a two-core machine (--jobs 1: not).
    split = can_split(opts.jobs)
    windows = _Windows(con)
    # Small files new at their path are parsed into memory (maybe ahead, in a pool: _parse_ahead)
    # and written many at a time; decided once, as a file may grow while the others are read.
    small = [f for f in files if before.get(printable(f)) is None and _small(f)]
    ahead, is_small = _parse_ahead(small, known, opts, explicit, split), set(small)
    held: list[tuple[str, Outcome | _Held]] = []   # in order
    held_bytes = 0
    with closing(ahead):
        for path in files:
            if path in is_small:
                parsed = next(ahead)
                if parsed is not None:
                    h = _admit(parsed, seen, windows)
                    held.append((path, h))
                    held_bytes += h.nbytes if isinstance(h, _Held) else 0
                    if held_bytes >= store.FLUSH_BYTES or len(held) >= _HELD_FILES:
                        yield from _write_held(con, held)
                        held, held_bytes = [], 0
                    continue
            yield from _write_held(con, held)   # files keep their order
            held, held_bytes = [], 0
            prior = before.get(printable(path))
            try:
                with store.FileWriter(con, last=opts.checkpoint_last and path == files[-1]) as w:
                    out = parse_into(path, known, opts, path in explicit, w, split, prior)
                    result = out if isinstance(out, Skipped) else _commit(con, out, seen, w)
                if isinstance(out, Skipped):
                    pass
                elif "parts" in out:
                    windows = _Windows(con)   # a merged file's windows are its ranks', read back
                else:
                    windows.add(out)
            except store.StoreFault:
                raise
            except Exception as e:  # noqa: BLE001 - one file's failure, whatever it is, is that file's alone
                result = failed(path, e)
            yield path, result
    yield from _write_held(con, held)


# Many small files are parsed ahead by a pool of local workers, a batch of files per call: each
# costs ~2 ms of fixed work (10,000 files of 20 kernels took 23 s in one process, issue 16),
# which more cores divide; this process checks and writes them in order.
POOL_FILES = 512
_POOL_BATCH = 128


def _parse_ahead(paths: list[str], known: frozenset[str], opts: IngestOptions, explicit: frozenset[str],
                 split: bool) -> Generator[_Held | Skipped | BadInput | None, None, None]:
    """_parse_small of each path, in order: here, each when it is asked for, or in a pool."""
    workers = opts.jobs or os.cpu_count() or 1
    if len(paths) < POOL_FILES or workers < 2:
        for p in paths:
            yield _parse_small(p, known, opts, p in explicit, split)
        return
    batches = [paths[i:i + _POOL_BATCH] for i in range(0, len(paths), _POOL_BATCH)]
    with LocalExecutor(workers) as pool:
        for parsed, tables in pool.imap(_parse_batch, ((b, known, opts, [p in explicit for p in b]) for b in batches)):
            yield from _unpacked(parsed, tables)


def _parse_batch(paths: list[str], known: frozenset[str], opts: IngestOptions,
                 explicit: list[bool]) -> tuple[list[_Held | Skipped | BadInput | None], dict[str, pa.Table]]:
    """Worker entry: _parse_small of each path (no split: a small file is never split). The held
    files' tables go back as one table per name, column `_i` the file's place in the batch: Arrow
    pickles a table in ~0.4 ms however small, 2 ms for a file of 20 kernels (as long as its parse)."""
    parsed = [_parse_small(p, known, opts, e, False) for p, e in zip(paths, explicit, strict=True)]
    tables: dict[str, list[pa.Table]] = {}
    for i, h in enumerate(parsed):
        if isinstance(h, _Held):
            for name, parts in h.tables.items():
                tables.setdefault(name, []).extend(t.append_column("_i", pa.array([i] * t.num_rows, pa.int32()))
                                                   for t in parts)
            h.tables = {}
    return parsed, {name: store.concat_small(ts) for name, ts in tables.items()}


def _unpacked(parsed: list[_Held | Skipped | BadInput | None],
              tables: dict[str, pa.Table]) -> list[_Held | Skipped | BadInput | None]:
    """_parse_batch's files with their tables back (slices of the batch's)."""
    for name, table in tables.items():
        bounds = np.searchsorted(table.column("_i").to_numpy(), np.arange(len(parsed) + 1))
        rows = table.drop_columns(["_i"])
        for i in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():   # the held files with rows of this table
            cast(_Held, parsed[i]).tables[name] = [rows.slice(bounds[i], bounds[i + 1] - bounds[i])]
    return parsed


def _parse_small(path: str, known: frozenset[str], opts: IngestOptions, explicit: bool,
                 split: bool) -> _Held | Skipped | BadInput | None:
    """A small file parsed into memory, or why not; None for a merged file (not held)."""
    sink = _Held()
    try:
        out = parse_into(path, known, opts, explicit, sink, split)
    except _Merged:
        return None
    except Exception as e:  # noqa: BLE001 - as in _in_process
        return failed(path, e)
    if isinstance(out, Skipped):
        return out
    sink.row = out
    return sink


def _admit(parsed: _Held | Skipped | BadInput, seen: dict[str, str], windows: _Windows) -> Outcome | _Held:
    """A parsed small file checked against the store and the files before it."""
    if not isinstance(parsed, _Held):
        return parsed
    row = parsed.row
    if row["content_hash"] in seen:
        return Skipped(row["path"], f"same content as {seen[row['content_hash']]}", duplicate=True)
    try:
        windows.check(row)
    except BadInput as e:
        return e
    seen[row["content_hash"]] = row["path"]   # now: the batch's next files are checked against it
    windows.add(row)
    return parsed


def _write_held(
    con: duckdb.DuckDBPyConnection, held: list[tuple[str, Outcome | _Held]]
) -> Generator[tuple[str, Outcome], None, None]:
    """The held small files in one transaction, then every held file's outcome in order."""
    parsed = [h for _, h in held if isinstance(h, _Held)]
    ids = iter(store.write_files(con, [(h.row, h.rank, h.tables) for h in parsed]) if parsed else ())
    for path, h in held:
        yield path, ([next(ids)], list(h.row.get("warnings") or [])) if isinstance(h, _Held) else h


class _Windows:
    """Each rank's capture windows, from the store once and then from the files this ingest
    adds: small files are checked here, not by a query each (~5 ms), and against the files of
    their batch, which are not in the store yet."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.by_rank: dict[int, list[tuple[int, int, str]]] = {}
        for rank, first, last, path in con.execute(
            "SELECT rank, first_ts_ns, last_ts_ns, path FROM trace_files "
            "WHERE kind = 'kineto' AND rank IS NOT NULL AND first_ts_ns IS NOT NULL"
        ).fetchall():
            self.by_rank.setdefault(rank, []).append((first, last, path))

    @staticmethod
    def _of(row: dict[str, Any]) -> bool:
        return row["kind"] == "kineto" and row["rank"] is not None and row["first_ts_ns"] is not None

    def check(self, row: dict[str, Any]) -> None:
        """As _check_window: two different files claiming the same rank over overlapping time."""
        if not self._of(row):
            return
        for first, last, path in self.by_rank.get(row["rank"], ()):
            if first <= row["last_ts_ns"] and last >= row["first_ts_ns"]:
                raise _clash(row, path)

    def add(self, row: dict[str, Any]) -> None:
        if self._of(row):
            self.by_rank.setdefault(row["rank"], []).append((row["first_ts_ns"], row["last_ts_ns"], row["path"]))


def _in_workers(
    files: list[str], con: duckdb.DuckDBPyConnection, known: frozenset[str], opts: IngestOptions,
    explicit: frozenset[str], seen: dict[str, str], jobs: int, before: dict[str, Prior],
) -> Generator[tuple[str, Outcome], None, None]:
    """Parse on `jobs` workers of `opts.executor` (Ray: the cluster's CPUs unless --jobs says),
    at most two files per worker in flight (bounded spill)."""
    import pyarrow.parquet as pq  # only this path reads spills back (as _ParquetSpill.add)

    with make_executor(opts.executor, opts.jobs if opts.executor == "ray" else jobs) as ex:
        calls = ((f, known, opts, f in explicit, before.get(printable(f))) for f in files)
        for path, res in zip(files, ex.imap(_spill_file, calls), strict=True):
            if not isinstance(res, Spilled):
                yield path, res
                continue
            if not os.path.isdir(res.spill_dir):
                yield path, BadInput(path, f"the worker's spill {res.spill_dir} is not visible to this process: with "
                                           "--executor ray on several machines, --spill-dir must be storage every "
                                           "node mounts at the same path")
                continue
            try:
                with store.FileWriter(con) as w:
                    w.rank = res.file_row["rank"]
                    w.file_id = res.file_row.get("appends_to", w.file_id)
                    parts = res.file_row.get("parts")
                    if parts:
                        w.split(parts)
                    for name, parquet in res.parquet.items():
                        # A merged file's tables carry a rank column beside SCHEMAS' columns.
                        w.add_parquet(name, parquet, SCHEMAS[name] if name in SCHEMAS and not parts
                                      else pq.read_schema(parquet))
                    result: Outcome = _commit(con, res.file_row, seen, w)
            except store.StoreFault:
                raise
            except Exception as e:  # noqa: BLE001 - as in _in_process
                result = failed(path, e)
            finally:
                shutil.rmtree(res.spill_dir, ignore_errors=True)
            yield path, result


def _commit(con: duckdb.DuckDBPyConnection, row: dict[str, Any], seen: dict[str, str], w: store.FileWriter) -> Outcome:
    """Finish a file's transaction, unless it duplicates one already in or clashes with one (then
    the writer's `with` block rolls it back)."""
    if row["content_hash"] in seen:
        return Skipped(row["path"], f"same content as {seen[row['content_hash']]}", duplicate=True)
    row = dict(row)
    appends_to, replaces = row.pop("appends_to", None), row.pop("replaces", None)
    if replaces is not None:
        for file_id in store.parts_of(con, replaces):
            store.drop_file(con, file_id)
    if appends_to is not None:
        # The file's rank is that of all its lines: the new ones may have settled or changed it.
        con.execute("UPDATE nccl_ops SET rank = ? WHERE file_id = ? AND rank IS DISTINCT FROM ?",
                    [row["rank"], appends_to, row["rank"]])
    rows = _part_rows(con, row, w) if "parts" in row else [row]
    for r in rows:
        _check_window(con, r)
    w.finish(*rows, update=appends_to is not None)
    seen[row["content_hash"]] = row["path"]
    return [r.get("file_id", w.file_id) for r in rows], list(row.get("warnings") or [])


def _part_rows(con: duckdb.DuckDBPyConnection, row: dict[str, Any], w: store.FileWriter) -> list[dict[str, Any]]:
    """A merged file's row, one per rank: each with that rank's counts and extent, read back from
    the rows just written. The first rank keeps the file's content hash; the others add `:rank<N>`
    (the hash is unique in trace_files, and re-ingesting the file still finds it)."""
    w.flush()
    row = {k: v for k, v in row.items() if k != "parts"}
    ids = ", ".join(str(f) for f in w.parts.values())
    counts = dict(con.execute(
        "SELECT file_id, sum(n) FROM (" + " UNION ALL ".join(
            f"SELECT file_id, count(*) AS n FROM {t} WHERE file_id IN ({ids}) GROUP BY file_id" for t in EVENT_TABLES
        ) + ") GROUP BY file_id").fetchall())
    extent = {f: (lo, hi) for f, lo, hi in con.execute(
        "SELECT file_id, min(ts_ns), max(ts_ns + dur_ns) FROM (" + " UNION ALL ".join(
            f"SELECT file_id, ts_ns, dur_ns FROM {t} WHERE file_id IN ({ids})"
            for t in ("cpu_ops", "runtime_calls", "kernels", "copies", "gpu_annotations")
        ) + ") GROUP BY file_id").fetchall()}
    devices = dict(con.execute(
        f"SELECT file_id, min(device) FROM (SELECT file_id, device FROM kernels WHERE file_id IN ({ids}) "
        f"UNION ALL SELECT file_id, device FROM copies WHERE file_id IN ({ids})) GROUP BY file_id").fetchall())
    out = []
    for i, (rank, file_id) in enumerate(w.parts.items()):
        dev = device_props_for(row["device_props"], [devices.get(file_id)])
        lo, hi = extent.get(file_id, (None, None))
        out.append(dict(
            row, file_id=file_id, rank=rank, content_hash=row["content_hash"] + ("" if i == 0 else f":rank{rank}"),
            n_events=int(counts.get(file_id, 0)), first_ts_ns=lo, last_ts_ns=hi, has_gpu=file_id in devices,
            device_name=None if dev is None else dev.get("name"),
        ))
    return out


def _check_window(con: duckdb.DuckDBPyConnection, row: dict[str, Any]) -> None:
    """Two different files claiming the same rank over overlapping time are an error naming both."""
    if row["kind"] != "kineto" or row["rank"] is None or row["first_ts_ns"] is None:
        return
    clash = con.execute(
        "SELECT path FROM trace_files WHERE kind = 'kineto' AND rank = ? "
        "AND first_ts_ns <= ? AND last_ts_ns >= ? LIMIT 1",
        [row["rank"], row["last_ts_ns"], row["first_ts_ns"]],
    ).fetchall()
    if clash:
        raise _clash(row, clash[0][0])


def _clash(row: dict[str, Any], other: str) -> BadInput:
    return BadInput(row["path"], f"claims rank {row['rank']} over the same capture window as {other} "
                                 "(two different traces of one rank and time); ingest one of them")


def _number_windows(con: duckdb.DuckDBPyConnection) -> None:
    """Several files of one rank are separate capture windows, numbered by their first timestamp.
    One statement: executemany would run one UPDATE per file (milliseconds each, thousands of ranks)."""
    con.execute(
        """
        UPDATE trace_files SET capture_window = w.n
        FROM (SELECT file_id, row_number() OVER (PARTITION BY rank ORDER BY first_ts_ns, file_id) - 1 AS n
              FROM trace_files WHERE kind = 'kineto') AS w
        WHERE trace_files.file_id = w.file_id AND trace_files.capture_window IS DISTINCT FROM w.n
        """
    )


def _count(table: pa.Table, column: str, value: str) -> int:
    """Rows of `table` whose `column` equals `value`."""
    return int(pc.sum(pc.equal(table.column(column), value)).as_py() or 0)
