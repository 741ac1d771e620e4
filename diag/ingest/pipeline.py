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

import os
import shutil
from collections.abc import Callable, Generator, Iterator
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Any, cast

import duckdb
import numpy as np
import pyarrow as pa
from msgspec.structs import replace

from diag.ingest.discover import discover
from diag.ingest.forked import can_split
from diag.ingest.kineto_decode import device_props_for
from diag.ingest.kineto_tabulate import EVENT_TABLES, SCHEMAS
from diag.ingest.ranks import assign_by_process
from diag.ingest.sniff import AMBIGUOUS
from diag.runtime import store
from diag.runtime.errors import BadInput, Stopped
from diag.runtime.executor import LocalExecutor, make_executor
from diag.runtime.lifetime import run_dir
from diag.runtime.sanitize import printable

if TYPE_CHECKING:
    pass
from diag.ingest.options import IngestOptions, IngestResult, Prior, Skipped, Spilled, failed, priors
from diag.ingest.parse_file import _Held, _Merged, _spill_file, parse_into

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
    return _json_size(path) < _SMALL_FILE_BYTES


def _json_size(path: str) -> int:
    """About how much JSON a file holds: a gzipped file counts as _GZIP_RATIO times its size."""
    return _size(path) * (_GZIP_RATIO if path.endswith(".gz") else 1)


def ingest(
    paths: list[str],
    con: duckdb.DuckDBPyConnection,
    opts: IngestOptions = IngestOptions(),
    progress: Callable[[int, int, str], None] | None = None,
) -> IngestResult:
    files, named, unreadable = discover(paths)
    explicit = frozenset(named)   # looked up per file: 10,000 files named on the command line
    if opts.rank is not None and len(files) > 1:
        raise BadInput(paths[0], "--rank names the rank of one file; it was given with several")
    known = frozenset(store.known_hashes(con))
    before = priors(con)
    result = IngestResult(errors=list(unreadable))
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
                     _in_process(files, con, known, opts, explicit, seen, before)) as outcomes, \
                _stopping(files, result):
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


@contextmanager
def _stopping(files: list[str], result: IngestResult) -> Iterator[None]:
    """A signal during the ingest ends it as Stopped, naming the files stored and those not."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as e:
        code = 130 if isinstance(e, KeyboardInterrupt) else e.code if isinstance(e.code, int) else 143
        stored = {p for p, _ in result.ingested}
        # Skipped (a duplicate) and left out (bad) files were dealt with: "not stored" are those not reached.
        done = stored | {s.path for s in result.skipped} | {e.path for e in result.errors}
        raise Stopped(code, [p for p in files if p in stored], [p for p in files if p not in done]) from None


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
# A batch also stops at this much JSON (a gzipped file counted as in _small): its tables come back
# in one piece, stay until its last file is written, and 2 × workers batches are in flight. 512
# generated ranks of 0.9 MB, 128 files a batch, held ~1 GB in this process and ~350 MB in each
# worker (issue 41); files of 20 kernels (~13 kB) still go 128 at a time.
_POOL_BATCH_BYTES = 16 * 1024**2
# Only files this small on average go to the pool: its gain is their fixed cost divided among cores,
# and its price is per byte (each table pickled back, a worker's imports and batches in memory).
# 512 generated ranks of 0.67 MB took 20% more CPU with the pools than in one process, and peaked
# at 705 MB against 402 MB (issue 41); a file of 20 kernels is ~13 kB.
POOL_MEAN_BYTES = 64 * 1024


def _parse_ahead(paths: list[str], known: frozenset[str], opts: IngestOptions, explicit: frozenset[str],
                 split: bool) -> Generator[_Held | Skipped | BadInput | None, None, None]:
    """_parse_small of each path, in order: here, each when it is asked for, or in a pool."""
    workers = opts.jobs or os.cpu_count() or 1
    if len(paths) < POOL_FILES or workers < 2 or sum(map(_json_size, paths)) > POOL_MEAN_BYTES * len(paths):
        for p in paths:
            yield _parse_small(p, known, opts, p in explicit, split)
        return
    batches = _pool_batches(paths)
    with LocalExecutor(workers) as pool:
        for parsed, tables in pool.imap(_parse_batch, ((b, known, opts, [p in explicit for p in b]) for b in batches)):
            yield from _unpacked(parsed, tables)


def _pool_batches(paths: list[str]) -> list[list[str]]:
    """`paths` in order, cut into runs of at most _POOL_BATCH files and _POOL_BATCH_BYTES of JSON."""
    batches: list[list[str]] = []
    total = 0
    for p in paths:
        size = _json_size(p)
        if not batches or len(batches[-1]) == _POOL_BATCH or total + size > _POOL_BATCH_BYTES:
            batches.append([])
            total = 0
        batches[-1].append(p)
        total += size
    return batches


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
