"""Per-rank timelines: GPU activities with their launch, op, phase, FLOPs and step (the map step).

Everything here needs only one trace file (one rank's capture window); `collectives.py` does
the cross-rank part and `states.py` the sweep that needs both.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import duckdb
import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from diag.ingest.kineto_decode import device_props_for
from diag.knowledge import flops as flops_mod
from diag.knowledge import kernels
from diag.knowledge.links import normalize_collective
from diag.runtime import store
from diag.timeline.columns import (
    _ATTENTION,
    _CLASS_NAMES,
    _COMM,
    _COPY,
    _GEMM,
    _MEMSET,
    _OTHER,
    CLASSES,
    I64,
    _ints,
    _strings,
    _take,
    _valid,
    numpy_of,
)
from diag.timeline.host_spans import HostSpans, launching_threads
from diag.timeline.nesting import containing, distinct
from diag.timeline.op_shapes import _kernel_shapes, innermost_counted
from diag.timeline.phases import (
    TRAINING_PHASES,
    assign_phases,
    is_backward_kernel,
    is_dataloader_span,
    name_codes,
)
from diag.timeline.pipeline_actions import PipeAction, pipeline_actions

_STEP_NUMBER = re.compile(r"ProfilerStep#(\d+)")
MATMUL_CLASSES = frozenset({str(kernels.KernelClass.GEMM), str(kernels.KernelClass.ATTENTION)})  # str: kclass holds str


class Steps(msgspec.Struct):
    step: list[int]
    cpu_start_ns: list[int]
    cpu_end_ns: list[int]
    start_ns: I64
    end_ns: I64
    n_kernels: list[int]
    from_profiler_step: bool
    # Where the last CPU op (ProfilerStep spans aside) or GPU activity inside each window ends, at
    # least the window's start: after it the step is idle with nothing on either side.
    busy_end_ns: I64 = msgspec.field(default_factory=lambda: np.zeros(0, np.int64))
    # GPU activities with no launch record that ran before the first step's own: an earlier
    # iteration's work carried into the capture. The first window begins where they end (issue 36).
    carried: int = 0
    carried_ns: int = 0


class HostMarks(msgspec.Struct, frozen=True):
    """Host events that explain GPU idle time: calls that wait for the GPU (`sync`: stream/device/
    event synchronize, blocking cudaMemcpy, `.item()`'s aten::_local_scalar_dense), optimizer steps
    (`optimizer`) and the profiler's own work (`profiler`: Kineto's overhead events)."""

    kind: list[str]
    name: list[str]
    start_ns: I64
    end_ns: I64
    op: list[str | None]          # the innermost CPU op around it (None: none recorded)
    caller: list[str | None]      # the innermost Python frame around it (with_stack traces)
    tid: I64 = msgspec.field(default_factory=lambda: np.zeros(0, np.int64))   # its thread (-1: none recorded)


class PythonFrames(msgspec.Struct, frozen=True):
    """A CPU-only run's Python frames (with_stack=True) on the thread that ran the most aten op
    time, the training loop's, in the trace's order (by start, outer before inner): the time
    between ops is theirs, and MFU013 names the innermost one at each instant of it."""

    start_ns: I64
    end_ns: I64
    name: list[str]


def _listed(column: str, strings: bool = False) -> functools.cached_property[list[Any]]:
    """A RankTimeline attribute: one of its `acts` columns as a Python list, made once."""
    def read(tl: RankTimeline) -> list[Any]:
        col = tl.acts.column(column)
        return _strings(col) if strings else col.to_pylist()

    return functools.cached_property(read)


# A dataclass, as analysis.RankContext is: its column lists are cached properties.
@dataclass
class RankTimeline:
    """One rank's capture window: its GPU activities (sorted by start) and steps."""

    file_id: int
    rank: int
    capture_window: int
    world_size: int | None
    device_props: dict[str, Any] | None
    gpus_per_node: int | None           # deviceProperties lists every GPU of the host
    steps: Steps
    # Parallel columns over activities. `acts` holds those read from the store as they came
    # (read_ranks: source, name, device, stream, ts, end, bytes (copies), correlation, launch_ts, launch_end,
    # ext, launch_tid, graph: launched by a CUDA/HIP graph launch, grid_blocks: its grid's thread
    # blocks): rank_rows writes them out as they are,
    # and Python reads them by index through the list properties below, made on first use.
    acts: pa.Table
    kernel: npt.NDArray[np.bool_]      # an SM kernel (source 'kernel'), not a copy-engine event
    kclass: npt.NDArray[np.object_]    # str: gemm | attention | comm | copy | memset | other
    collective: list[str | None]
    ts_ns: I64
    end_ns: I64
    op_name: list[str | None]
    op_external_id: list[int | None]   # External id of the launching op: groups the kernels of one op
    phase: npt.NDArray[np.object_]     # str: diag/timeline/phases.py PHASES
    flops: npt.NDArray[np.float64]
    gemm_mnk: list[tuple[int, int, int] | None]
    dtype: list[str | None]
    bytes_moved: list[float | None]
    trace_flops: list[float | None]
    step_of: I64                      # step index (into steps) per activity, -1 when launched outside
    dataloader_spans: tuple[I64, I64]
    host_marks: HostMarks | None = None
    python_frames: PythonFrames | None = None   # a CPU-only run's, where it recorded with_stack
    host_spans: HostSpans | None = None         # a GPU run's launching threads
    host_timeline: bool = False       # no GPU activity: the activities are host ops (CPU-only run)
    pipeline_actions: list[PipeAction] = field(default_factory=list)   # `PP:` schedule actions (pipeline_actions.py)
    backward_pass: bool = True        # a backward or optimizer op or a backward-only kernel ran: training
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ts_ns)

    # Lists of `acts` columns, made on first use: the rules and tests read them by index.
    source = _listed("source", strings=True)   # 'kernel' | 'memcpy' | 'memset'
    name = _listed("name", strings=True)
    stream = _listed("stream")
    correlation = _listed("correlation")
    launch_ts_ns = _listed("launch_ts")
    launch_end_ns = _listed("launch_end")
    launch_tid = _listed("launch_tid")
    external_id = _listed("ext")


class RankRows(msgspec.Struct, frozen=True):
    """One file's rows as the store gives them (Arrow), before any Python work: read apart from
    the build so that `load_ranks` reads the next file's while this one's timeline is built."""

    file_id: int
    meta: tuple[Any, ...]                 # rank, capture window, world size, device properties, first and last ts
    acts: pa.Table                        # _ACTIVITIES, or _HOST_ACTIVITIES for a CPU-only trace
    host: bool
    ops: pa.Table                         # _CPU_OPS
    spans: list[tuple[Any, ...]]          # ProfilerStep spans: name, start, end
    marks: pa.Table                       # _HOST_MARKS


def load_rank(con: duckdb.DuckDBPyConnection, file_id: int) -> RankTimeline:
    return build_rank(read_rank(con, file_id))


def read_rank(con: duckdb.DuckDBPyConnection, file_id: int) -> RankRows:
    return read_ranks(con, [file_id])[0]


# Files are read together up to this many events: each query costs a few ms whatever its size, and
# 2,000 files of 20 kernels spent most of their analysis on five queries each (issue 16); a file
# of more events (the 35 MB control trace has ~109k) is read alone, as before.
READ_EVENTS = 100_000


def read_batches(con: duckdb.DuckDBPyConnection, files: Sequence[int],
                 max_files: int | None = None) -> list[list[int]]:
    """`files` in order, cut into runs of at most READ_EVENTS events (a bigger file alone) and at
    most `max_files` files."""
    sizes = dict(con.execute("SELECT file_id, coalesce(n_events, 0) FROM trace_files").fetchall())
    batches: list[list[int]] = []
    total = 0
    for f in files:
        if not batches or total + sizes.get(f, 0) > READ_EVENTS or len(batches[-1]) == max_files:
            batches.append([])
            total = 0
        batches[-1].append(f)
        total += sizes.get(f, 0)
    return batches


def load_ranks(con: duckdb.DuckDBPyConnection, files: Sequence[int]) -> Generator[RankTimeline, None, None]:
    """load_rank of each file, in order. The next file's rows are read on two more connections,
    in threads, while this one's timeline is built and used: DuckDB runs a query without the GIL.
    The host ops go on one connection, the rest on the other, at once: a lone file's reads, which
    nothing overlaps, took ~45 ms on the 35 MB control trace one after the other and ~30 ms so. Only
    the reads go to the threads: the build is many short numpy steps, and each would wait up to
    the interpreter's 5 ms switch interval to take the GIL back from the Python running here (a
    build in a thread took 50× as long beside a busy loop). Small files are read several at a
    time (READ_EVENTS)."""
    if not files:
        return
    # Connections of their own: one connection is not for two threads at once.
    events, ops = con.cursor(), con.cursor()
    try:
        for cur in (events, ops):
            cur.execute("SET enable_progress_bar = false")   # per connection, as store.connect sets it
        batches = read_batches(events, files)
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="diag-read") as pool:
            def read(batch: list[int]) -> tuple[list[int], Future[_Events], Future[dict[int, pa.Table]]]:
                return batch, pool.submit(_read_events, events, batch), pool.submit(_read_ops, ops, batch)

            ahead = read(batches[0])
            for nxt in [*batches[1:], None]:
                batch, ev, op = ahead
                rows = _rows(batch, ev.result(), op.result())
                if nxt is not None:
                    ahead = read(nxt)
                for r in rows:
                    yield build_rank(r)
    finally:
        events.close()
        ops.close()


def read_ranks(con: duckdb.DuckDBPyConnection, files: Sequence[int]) -> list[RankRows]:
    """The rows of each of `files`, in order, read by one query per table for them all."""
    return _rows(files, _read_events(con, files), _read_ops(con, files))


class _Events(NamedTuple):
    """A batch's rows but its host ops, by file."""

    meta: dict[int, tuple[Any, ...]]
    acts: dict[int, pa.Table]
    hosts: list[int]                          # the files without GPU activities: their host ops stand in
    spans: dict[int, list[tuple[Any, ...]]]
    marks: dict[int, pa.Table]


def _read_events(con: duckdb.DuckDBPyConnection, files: Sequence[int]) -> _Events:
    ids = store.id_set(files)
    meta = {r[0]: r[1:] for r in con.execute(
        "SELECT file_id, rank, coalesce(capture_window, 0), world_size, device_props, first_ts_ns, last_ts_ns "
        f"FROM trace_files WHERE file_id IN ({ids})"
    ).fetchall()}
    acts = _by_file(store.arrow_table(con, _ACTIVITIES.format(files=ids)), files)
    hosts = [f for f in files if not acts[f].num_rows]
    if hosts:
        acts.update(_by_file(store.arrow_table(con, _HOST_ACTIVITIES.format(files=store.id_set(hosts))), hosts))
    spans: dict[int, list[tuple[Any, ...]]] = {f: [] for f in files}
    for f, *span in con.execute(
        f"""
        SELECT DISTINCT file_id, name, ts_ns, ts_ns + dur_ns FROM cpu_ops
        WHERE file_id IN ({ids}) AND name LIKE 'ProfilerStep#%' ORDER BY file_id, ts_ns
        """
    ).fetchall():
        spans[f].append(tuple(span))
    marks = _by_file(store.arrow_table(con, _HOST_MARKS.format(files=ids)), files)
    return _Events(meta, acts, hosts, spans, marks)


def _read_ops(con: duckdb.DuckDBPyConnection, files: Sequence[int]) -> dict[int, pa.Table]:
    return _by_file(store.arrow_table(con, _CPU_OPS.format(files=store.id_set(files))), files)


def _rows(files: Sequence[int], ev: _Events, ops: dict[int, pa.Table]) -> list[RankRows]:
    return [RankRows(f, tuple(ev.meta[f]), ev.acts[f], f in ev.hosts, ops[f], ev.spans[f], ev.marks[f]) for f in files]


def _by_file(table: pa.Table, files: Sequence[int]) -> dict[int, pa.Table]:
    """A query's rows of several files (sorted by its leading file_id column) apart, without it."""
    fid = table.column("file_id").to_numpy()
    rest = table.drop_columns(["file_id"])
    out = {}
    for f in files:
        lo, hi = np.searchsorted(fid, f, "left"), np.searchsorted(fid, f, "right")
        out[f] = rest.slice(lo, hi - lo)
    return out


def build_rank(rows: RankRows) -> RankTimeline:
    rank, window, world, props_text = rows.meta[:4]
    acts = rows.acts
    ops, frames = _split_frames(rows.ops)
    op_tid, op_ts, op_end = (_ints(ops.column(k)) for k in ("tid", "ts", "end"))
    codes, distinct = name_codes(ops.column("name"))
    # Forward ops record `Fwd thread id` 0, the autograd engine's its forward thread's (1, 2, ...).
    phases = assign_phases(op_tid, op_end, codes, distinct, _ints(ops.column("fwd_tid")) > 0)
    ts, end = _ints(acts.column("ts")), _ints(acts.column("end"))
    kernel, kclass, collective = _classes(acts, rows.host)
    op_idx = _launching_ops(ops, op_tid, op_ts, op_end, acts)
    flops, mnk, dtype, nbytes, tflops = _kernel_shapes(ops, op_idx, kclass, end - ts)
    if rows.host:
        outer = innermost_counted(_ints(acts.column("stream")), ts, end, np.isin(kclass, (_GEMM, _ATTENTION)), flops)
        kclass = np.where(outer, _OTHER, kclass)
        flops[outer] = 0.0
        for col in (mnk, dtype, nbytes, tflops):
            for i in np.nonzero(outer)[0].tolist():
                col[i] = None
    steps, step_of = _steps(rows, ops, ts, end)
    dl = np.isin(codes, [i for i, nm in enumerate(distinct) if is_dataloader_span(nm)])
    all_props = json.loads(props_text) if isinstance(props_text, str) else props_text
    launched = op_idx >= 0
    phase = np.full(len(op_idx), "other", dtype=object)
    phase[launched] = phases[op_idx[launched]]
    return RankTimeline(
        file_id=rows.file_id, rank=rank, capture_window=window, world_size=world,
        device_props=device_props_for(all_props, acts.column("device").to_pylist()),
        gpus_per_node=len(all_props) if isinstance(all_props, list) and all_props else None, steps=steps,
        acts=acts, kernel=kernel, kclass=_CLASS_NAMES[kclass], collective=collective, ts_ns=ts, end_ns=end,
        op_name=_take(ops.column("name"), op_idx), op_external_id=_take(ops.column("external_id"), op_idx),
        phase=phase, flops=flops, gemm_mnk=mnk, dtype=dtype, bytes_moved=nbytes, trace_flops=tflops,
        step_of=step_of, dataloader_spans=(op_ts[dl], op_end[dl]),
        host_marks=_host_marks(rows.marks, ops, op_tid, op_ts, op_end, frames),
        python_frames=_training_thread_frames(frames, acts, ts, end) if rows.host else None,
        host_spans=None if rows.host else launching_threads(ops, frames, acts),
        host_timeline=rows.host and len(ts) > 0,
        pipeline_actions=_actions(ops, op_ts, op_end, acts, kernel & (kclass != _COMM), steps),
        backward_pass=bool(np.isin(phases, TRAINING_PHASES).any())
        or any(is_backward_kernel(nm) for nm in pc.unique(acts.column("name")).drop_null().to_pylist()),
    )


def _split_frames(spans: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The host spans as ops (CPU ops and annotations) and Python frames (`python_function`,
    recorded with with_stack=True), each in the spans' order. Phases, launching ops and FLOPs are
    read from the ops alone: the script's `<module>` frame wraps every ProfilerStep span, which
    would give every op a parent outside any step and so the phase `other` (forward FLOPs 0, MFU
    unknown), and the op that launched a kernel is the innermost op, never the frame around it."""
    py = pc.equal(spans.column("cat"), "python_function").fill_null(False)
    return spans.filter(pc.invert(py)), spans.filter(py)


def _training_thread_frames(frames: pa.Table, acts: pa.Table, ts: I64, end: I64) -> PythonFrames | None:
    """The Python frames of the thread that ran the most aten op time (a host activity's stream
    is its thread): a data loader's or a pin-memory thread's frames sit blocked through the gaps
    and would name nothing. None without frames on that thread."""
    if frames.num_rows == 0 or len(ts) == 0:
        return None
    tid = _ints(acts.column("stream"))
    threads = distinct(tid)
    busy = np.zeros(len(threads), np.int64)
    np.add.at(busy, np.searchsorted(threads, tid), end - ts)
    own = frames.filter(pc.equal(frames.column("tid"), int(threads[np.argmax(busy)])).fill_null(False))
    if own.num_rows == 0:
        return None
    return PythonFrames(_ints(own.column("ts")), _ints(own.column("end")), _strings(own.column("name")))


def _host_marks(marks: pa.Table, ops: pa.Table, tid: I64, ts: I64, end: I64, frames: pa.Table) -> HostMarks:
    """The marks with the CPU op and the Python frame each ran inside (innermost on its thread)."""
    m_tid, m_ts = _ints(marks.column("tid")), _ints(marks.column("ts"))
    inner = containing(tid, ts, end, m_tid, m_ts)
    f_tid, f_ts, f_end = (_ints(frames.column(k)) for k in ("tid", "ts", "end"))
    caller = containing(f_tid, f_ts, f_end, m_tid, m_ts)
    return HostMarks(
        _strings(marks.column("kind")), _strings(marks.column("name")), m_ts, _ints(marks.column("end")),
        _take(ops.column("name"), inner), _take(frames.column("name"), caller), m_tid,
    )


# CPU-only runs (gloo, no GPU): the host timeline stands in for the GPU's. Compute is time inside
# aten ops, communication time inside gloo collectives (their spans include the wait for a late
# rank, as an NCCL kernel's do), idle neither. Matmul-class ops are those flops.py counts (GEMMs,
# convolutions, attention); op_shapes.innermost_counted then keeps one op of each tree as the matmul.


def _host_class(name: str) -> str:
    if name.startswith("gloo:"):
        return "comm"
    if "attention" in name:
        return "attention"
    if name.removesuffix("_") in flops_mod.SUPPORTED_OPS:
        return "gemm"
    return "other"


def _classes(acts: pa.Table, host: bool) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.intp], list[str | None]]:
    """Which activities are SM kernels, each one's class (index into CLASSES) and, for
    communication kernels, the collective its name gives: worked out once per distinct name (a
    rank's 9k activities have ~170)."""
    codes, names = name_codes(acts.column("name"))
    if host:
        by_name = [_host_class(nm) for nm in names]
        collectives = [normalize_collective(nm.split(":", 1)[1]) if k == "comm" else None
                       for nm, k in zip(names, by_name, strict=True)]
    else:
        by_name = [str(kernels.classify(nm)) for nm in names]
        collectives = [kernels.collective_of(nm) if k == "comm" else None for nm, k in zip(names, by_name, strict=True)]
    kclass = np.array([CLASSES.index(k) for k in by_name], np.intp)[codes]
    source = acts.column("source")
    kernel = numpy_of(pc.equal(source, "kernel").fill_null(False), bool)
    if not host:
        # Copy-engine events are typed by ingest: memcpy or memset, whatever their name says.
        memset = numpy_of(pc.equal(source, "memset").fill_null(False), bool)
        kclass = np.where(kernel, kclass, np.where(memset, _MEMSET, _COPY))
    collective = np.full(len(codes), None, dtype=object)
    comm = kclass == _COMM
    collective[comm] = np.array(collectives, dtype=object)[codes[comm]]
    return kernel, kclass, collective.tolist()


def _actions(ops: pa.Table, op_ts: I64, op_end: I64, acts: pa.Table, compute: npt.NDArray[np.bool_],
             steps: Steps) -> list[PipeAction]:
    """torch.distributed.pipelining's `PP:` actions, with the compute kernels launched inside each."""
    named = np.nonzero(numpy_of(pc.starts_with(ops.column("name").fill_null(""), "PP:"), bool))[0]
    if not len(named):
        return []
    launched = compute & _valid(acts.column("launch_ts"))
    launch = _ints(acts.column("launch_ts"))[launched]
    dur = (_ints(acts.column("end")) - _ints(acts.column("ts")))[launched]
    order = np.argsort(launch, kind="stable")
    return pipeline_actions(_strings(ops.column("name").take(named)), op_ts[named], op_end[named], launch[order],
                            dur[order], steps.cpu_start_ns, steps.cpu_end_ns)


def _launching_ops(ops: pa.Table, tid: I64, ts: I64, end: I64, acts: pa.Table) -> I64:
    """Each activity's launching op (index into ops), or -1: the op of its External id where the
    trace links them (the last op of that id); else the innermost CPU op on the launching thread
    that contains the launch call (older traces give runtime calls an External id of their own
    that names no op)."""
    out = np.full(acts.num_rows, -1, np.int64)
    have = np.nonzero(_valid(ops.column("external_id")))[0]
    op_ext = _ints(ops.column("external_id"))[have]
    order = np.argsort(op_ext, kind="stable")
    keys, at = op_ext[order], have[order]
    last = np.append(keys[1:] != keys[:-1], True)[: len(keys)]   # the last op of each id, in op order
    keys, at = keys[last], at[last]
    if len(keys):
        ext = _ints(acts.column("ext"))
        pos = np.minimum(np.searchsorted(keys, ext), len(keys) - 1)
        found = _valid(acts.column("ext")) & (keys[pos] == ext)
        out[found] = at[pos[found]]
    launch_tid, launch_ts = acts.column("launch_tid"), acts.column("launch_ts")
    ask = np.nonzero((out < 0) & _valid(launch_tid) & _valid(launch_ts))[0]
    if len(ask):
        out[ask] = containing(tid, ts, end, _ints(launch_tid)[ask], _ints(launch_ts)[ask])
    return out


# Each query reads the files listed in {files}, its rows ordered by a leading file_id column.
_ACTIVITIES = """
    WITH launch AS (
        SELECT file_id, correlation, min(ts_ns) AS ts, arg_min(ts_ns + dur_ns, ts_ns) AS "end",
               arg_min(external_id, ts_ns) AS ext, arg_min(tid, ts_ns) AS tid,
               -- cudaGraphLaunch / cuGraphLaunch / hipGraphLaunch: CUPTI gives every kernel of the
               -- graph the launch call's correlation id (Kineto draws the call's flow to them).
               bool_or(name ILIKE '%GraphLaunch%') AS graph
        FROM runtime_calls WHERE file_id IN ({files}) AND correlation IS NOT NULL AND correlation <> 0
        GROUP BY file_id, correlation
    ), act AS (
        -- grid_blocks: the kernel's thread blocks (grid x·y·z), what a resident kernel holds SMs by.
        SELECT file_id, 'kernel' AS source, name, device, stream, ts_ns, ts_ns + dur_ns AS end_ns, correlation,
               external_id, NULL::BIGINT AS bytes,
               TRY_CAST(grid->>'$[0]' AS BIGINT) * coalesce(TRY_CAST(grid->>'$[1]' AS BIGINT), 1)
                   * coalesce(TRY_CAST(grid->>'$[2]' AS BIGINT), 1) AS grid_blocks
        FROM kernels WHERE file_id IN ({files})
        UNION ALL
        SELECT file_id, kind, name, device, stream, ts_ns, ts_ns + dur_ns, correlation, external_id, bytes, NULL::BIGINT
        FROM copies WHERE file_id IN ({files})
    )
    SELECT act.file_id, act.source, act.name, act.device, act.stream, act.ts_ns AS ts, act.end_ns AS "end", act.bytes,
           act.correlation, launch.ts AS launch_ts, launch."end" AS launch_end,
           coalesce(nullif(act.external_id, 0), launch.ext) AS ext, launch.tid AS launch_tid,
           coalesce(launch.graph, false) AS graph, act.grid_blocks
    FROM act LEFT JOIN launch ON launch.file_id = act.file_id AND launch.correlation = act.correlation
    ORDER BY act.file_id, act.ts_ns, act.end_ns
"""

# A host op is its own launch (it belongs to the step it ran in) and never waits for one.
_HOST_ACTIVITIES = """
    SELECT file_id, 'kernel' AS source, name, NULL::INTEGER AS device, tid AS stream, ts_ns AS ts, ts_ns + dur_ns AS "end",
           NULL::BIGINT AS bytes, NULL::BIGINT AS correlation, ts_ns AS launch_ts, NULL::BIGINT AS launch_end, external_id AS ext,
           tid AS launch_tid, false AS graph, NULL::BIGINT AS grid_blocks
    FROM cpu_ops
    WHERE file_id IN ({files}) AND ((cat = 'cpu_op' AND name LIKE 'aten::%') OR name LIKE 'gloo:%')
    ORDER BY file_id, ts_ns, ts_ns + dur_ns
"""

# Host calls that wait for the GPU, optimizer steps and the profiler's own overhead (HostMarks).
_HOST_MARKS = """
    SELECT file_id, 'sync' AS kind, name, coalesce(tid, -1) AS tid, ts_ns AS ts, ts_ns + dur_ns AS "end"
    FROM runtime_calls WHERE file_id IN ({files}) AND name IN (
        'cudaStreamSynchronize', 'cudaDeviceSynchronize', 'cudaEventSynchronize', 'cudaMemcpy',
        'cuStreamSynchronize', 'cuCtxSynchronize', 'cuEventSynchronize', 'hipStreamSynchronize',
        'hipDeviceSynchronize', 'hipEventSynchronize', 'hipMemcpy')
    UNION ALL
    SELECT file_id, CASE WHEN name LIKE 'Optimizer.step#%' THEN 'optimizer' ELSE 'sync' END, name,
           coalesce(tid, -1), ts_ns, ts_ns + dur_ns
    FROM cpu_ops WHERE file_id IN ({files}) AND (name = 'aten::_local_scalar_dense' OR name LIKE 'Optimizer.step#%')
    UNION ALL
    SELECT file_id, 'profiler', name, -1, ts_ns, ts_ns + coalesce(dur_ns, 0)
    FROM other_events WHERE file_id IN ({files}) AND cat = 'overhead' AND ts_ns IS NOT NULL
    ORDER BY file_id, ts
"""

# Every host span: CPU ops, annotations and Python frames (`python_function`, with_stack=True).
# build_rank reads phases, launching ops and FLOPs from the ops alone (`_split_frames`).
_CPU_OPS = """
    SELECT file_id, coalesce(tid, -1) AS tid, ts_ns AS ts, ts_ns + dur_ns AS "end", name, cat, fwd_tid, external_id,
           input_dims::VARCHAR AS dims, input_types::VARCHAR AS types, trace_flops,
           CASE WHEN name LIKE '%conv%' OR name LIKE '%attention%'
                THEN (args->'Concrete Inputs')::VARCHAR END AS concrete, seq_num AS seq
    FROM cpu_ops WHERE file_id IN ({files}) ORDER BY file_id, coalesce(tid, -1), ts_ns, dur_ns DESC
"""


def _steps(rows: RankRows, ops: pa.Table, ts: I64, end: I64) -> tuple[Steps, I64]:
    spans = rows.spans
    n = len(ts)
    if not spans:
        # One window per capture: from the first to the last event of the file.
        lo_hi = rows.meta[4:]
        lo = lo_hi[0] if lo_hi[0] is not None else (int(ts.min()) if n else 0)
        hi = lo_hi[1] if lo_hi[1] is not None else (int(end.max()) if n else 0)
        steps = Steps([0], [lo], [hi], np.array([lo], np.int64), np.array([hi], np.int64), [n], False,
                      np.array([hi], np.int64))
        return steps, np.zeros(n, np.int64)
    numbers = [int(m.group(1)) if (m := _STEP_NUMBER.search(s[0])) else i for i, s in enumerate(spans)]
    cpu_start = np.array([s[1] for s in spans], np.int64)
    cpu_end = np.array([s[2] for s in spans], np.int64)
    launch = _ints(rows.acts.column("launch_ts"))
    has_launch = _valid(rows.acts.column("launch_ts"))
    idx = np.searchsorted(cpu_start, launch, side="right") - 1
    valid = has_launch & (idx >= 0)
    valid &= launch <= cpu_end[np.clip(idx, 0, None)]
    step_of = np.where(valid, idx, -1).astype(np.int64)
    last_end = cpu_end.copy()
    counts = np.zeros(len(spans), np.int64)
    if valid.any():
        np.maximum.at(last_end, step_of[valid], end[valid])
        np.add.at(counts, step_of[valid], 1)
    win_end = np.maximum.accumulate(last_end)  # windows never run backwards
    carried = _carried(ts, end, has_launch, step_of, int(cpu_start[0]), launch)
    first = max(int(cpu_start[0]), int(end[carried].max())) if carried.any() else int(cpu_start[0])
    win_start = np.concatenate([[min(first, int(win_end[0]))], win_end[:-1]])
    busy = np.maximum(_last_end_before(ts, end, win_end), win_start)
    op_ts, op_end = _ints(ops.column("ts")), _ints(ops.column("end"))   # Python frames left out: they wrap it all
    not_step = ~numpy_of(pc.starts_with(ops.column("name").fill_null(""), "ProfilerStep#"), bool)
    busy = np.maximum(busy, _last_end_before(op_ts[not_step], op_end[not_step], win_end))
    steps = Steps(numbers, cpu_start.tolist(), cpu_end.tolist(), win_start, win_end, counts.tolist(), True, busy,
                  int(carried.sum()), int((end - ts)[carried].sum()))
    return steps, step_of


# Work queued before the capture runs back to back: a gap longer than this between it and the
# next unlaunched activity (or the step's start) ends it. Kernels of one queue start within a few
# µs of each other; 100 µs leaves room for copies and small launches between them.
_QUEUED_GAP_NS = 100_000


def _carried(ts: I64, end: I64, has_launch: npt.NDArray[np.bool_], step_of: I64, start_ns: int,
             launch_ns: I64) -> npt.NDArray[np.bool_]:
    """GPU work the first step did not launch, still queued when it began (an earlier iteration's):
    the activities with no launch record before the first activity the step launched that run back
    to back either from the step's start (`start_ns`), or up to that first activity when it was
    launched while they ran, so that it waited in the queue behind them. The second catches a
    warm-up step left unsynchronized whose first kernels began before the capture and are not in
    it (the recorded ones then start a kernel's length after the step's start: 0.5 ms on an H200).
    The first step begins no earlier than their end. Unlaunched work after an idle gap, with the
    GPU idle when the step's first kernel was launched, is not carried over (another thread's, say)."""
    out = np.zeros(len(ts), bool)
    own = np.nonzero(step_of == 0)[0]
    if not len(own):
        return out
    first = int(own[np.argmin(ts[own])])
    cand = np.nonzero(~has_launch & (ts < ts[first]))[0]
    reach = start_ns
    for i in cand[np.argsort(ts[cand], kind="stable")].tolist():
        if ts[i] > reach + _QUEUED_GAP_NS:
            break
        out[i] = True
        reach = max(reach, int(end[i]))
    chain: list[int] = []
    reach = int(ts[first])
    for i in cand[np.argsort(-end[cand], kind="stable")].tolist():
        if end[i] < reach - _QUEUED_GAP_NS:
            break
        chain.append(i)
        reach = min(reach, int(ts[i]))
    if chain and end[chain[0]] > launch_ns[first]:
        out[chain] = True
    return out


def _last_end_before(ts: I64, end: I64, t: I64) -> I64:
    """For each time t: the latest end, capped at t, of the spans starting before t; -1 if none."""
    if not len(ts):
        return np.full(len(t), -1, np.int64)
    order = np.argsort(ts, kind="stable")
    reach = np.maximum.accumulate(end[order])
    k = np.searchsorted(ts[order], t, side="left") - 1
    return np.where(k >= 0, np.minimum(reach[np.clip(k, 0, None)], t), -1)


def rank_files(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Kineto files to analyze, by rank then capture window."""
    return [r[0] for r in con.execute(
        "SELECT file_id FROM trace_files WHERE kind = 'kineto' ORDER BY rank, capture_window, file_id"
    ).fetchall()]
