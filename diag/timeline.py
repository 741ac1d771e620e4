"""Per-rank timelines: GPU activities with their launch, op, phase, FLOPs and step (the map step).

Everything here needs only one trace file (one rank's capture window); `collectives.py` does
the cross-rank part and `states.py` the sweep that needs both.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt

from diag import flops as flops_mod
from diag import kernels
from diag.ingest.kineto import device_props_for
from diag.links import normalize_collective
from diag.nesting import containing
from diag.phases import assign_phases, is_dataloader_span, name_codes

I64 = npt.NDArray[np.int64]

_STEP_NUMBER = re.compile(r"ProfilerStep#(\d+)")
MATMUL_CLASSES = frozenset({str(kernels.KernelClass.GEMM), str(kernels.KernelClass.ATTENTION)})  # str: kclass holds str


@dataclass
class Steps:
    step: list[int]
    cpu_start_ns: list[int]
    cpu_end_ns: list[int]
    start_ns: I64
    end_ns: I64
    n_kernels: list[int]
    from_profiler_step: bool


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
    # Parallel columns over activities.
    source: list[str]
    name: list[str]
    kclass: list[str]
    collective: list[str | None]
    stream: list[int | None]
    ts_ns: I64
    end_ns: I64
    correlation: list[int | None]
    launch_ts_ns: list[int | None]
    launch_end_ns: list[int | None]
    launch_tid: list[int | None]
    external_id: list[int | None]
    op_name: list[str | None]
    op_external_id: list[int | None]   # External id of the launching op: groups the kernels of one op
    phase: list[str]
    flops: npt.NDArray[np.float64]
    gemm_mnk: list[tuple[int, int, int] | None]
    dtype: list[str | None]
    bytes_moved: list[float | None]
    trace_flops: list[float | None]
    step_of: I64                      # step index (into steps) per activity, -1 when launched outside
    dataloader_spans: tuple[I64, I64]
    host_timeline: bool = False       # no GPU activity: the activities are host ops (CPU-only run)
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ts_ns)


def load_rank(con: duckdb.DuckDBPyConnection, file_id: int) -> RankTimeline:
    meta = con.execute(
        "SELECT rank, coalesce(capture_window, 0), world_size, device_props FROM trace_files WHERE file_id = ?",
        [file_id],
    ).fetchall()[0]
    rank, window, world, props_text = meta
    acts = _activities(con, file_id)
    ops = _cpu_ops(con, file_id)
    op_tid, op_ts, op_end = (np.asarray(ops[k], np.int64) for k in ("tid", "ts", "end"))
    codes, distinct = name_codes(ops["name"])
    phases = assign_phases(op_tid, op_end, codes, distinct, ops["fwd_tid"])
    by_ext = {e: i for i, e in enumerate(ops["external_id"]) if e is not None}
    host = not acts["ts"]
    if host:
        acts = _host_activities(con, file_id)

    names = acts["name"]
    if host:
        kclass = [_host_class(nm or "") for nm in names]
        collective = [normalize_collective(nm.split(":", 1)[1]) if k == "comm" else None
                      for nm, k in zip(names, kclass, strict=True)]
    else:
        classes = {nm: str(kernels.classify(nm or "")) for nm in set(names)}
        kclass = [
            classes[nm] if src == "kernel" else ("memset" if src == "memset" else "copy")
            for nm, src in zip(names, acts["source"], strict=True)
        ]
        collective = [kernels.collective_of(nm or "") if k == "comm" else None
                      for nm, k in zip(names, kclass, strict=True)]
    # The launching op: by External id where the trace links them; else the innermost CPU op on
    # the launching thread that contains the launch call (older traces give runtime calls an
    # External id of their own that names no op).
    enclosing = _enclosing_ops(op_tid, op_ts, op_end, acts["launch_tid"], acts["launch_ts"])
    op_idx = [by_ext.get(e) if e is not None and e in by_ext else enc
              for e, enc in zip(acts["ext"], enclosing, strict=True)]
    op_name = [ops["name"][i] if i is not None else None for i in op_idx]
    op_ext = [ops["external_id"][i] if i is not None else None for i in op_idx]
    phase = [phases[i] if i is not None else "other" for i in op_idx]

    matmul_groups, other_groups = _launch_groups(op_idx, kclass)
    flops, mnk, dtype, nbytes, tflops = _kernel_flops(acts, matmul_groups, ops)
    _memory_bytes(other_groups, ops, nbytes)
    steps, step_of = _steps(con, file_id, acts)
    dl = np.isin(codes, [i for i, nm in enumerate(distinct) if is_dataloader_span(nm)])
    all_props = json.loads(props_text) if isinstance(props_text, str) else props_text
    props = device_props_for(all_props, acts["device"])
    return RankTimeline(
        file_id=file_id, rank=rank, capture_window=window, world_size=world, device_props=props,
        gpus_per_node=len(all_props) if isinstance(all_props, list) and all_props else None, steps=steps,
        source=acts["source"], name=names, kclass=kclass, collective=collective, stream=acts["stream"],
        ts_ns=np.asarray(acts["ts"], np.int64), end_ns=np.asarray(acts["end"], np.int64),
        correlation=acts["correlation"], launch_ts_ns=acts["launch_ts"], launch_end_ns=acts["launch_end"],
        launch_tid=acts["launch_tid"], external_id=acts["ext"], op_name=op_name, op_external_id=op_ext, phase=phase,
        flops=flops, gemm_mnk=mnk, dtype=dtype, bytes_moved=nbytes, trace_flops=tflops, step_of=step_of,
        dataloader_spans=(op_ts[dl], op_end[dl]),
        host_timeline=host and len(names) > 0,
    )


# CPU-only runs (gloo, no GPU): the host timeline stands in for the GPU's. Compute is time inside
# aten ops, communication time inside gloo collectives (their spans include the wait for a late
# rank, as an NCCL kernel's do), idle neither.
_HOST_MATMUL = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"})


def _host_class(name: str) -> str:
    if name.startswith("gloo:"):
        return "comm"
    if name in _HOST_MATMUL:
        return "gemm"
    if "attention" in name:
        return "attention"
    return "other"


def _host_activities(con: duckdb.DuckDBPyConnection, file_id: int) -> dict[str, list[Any]]:
    rows = con.execute(
        """
        SELECT name, tid, ts_ns, ts_ns + dur_ns, external_id FROM cpu_ops
        WHERE file_id = ? AND ((cat = 'cpu_op' AND name LIKE 'aten::%') OR name LIKE 'gloo:%')
        ORDER BY ts_ns, ts_ns + dur_ns
        """,
        [file_id],
    ).fetchall()
    n = len(rows)
    return {
        "source": ["kernel"] * n, "name": [r[0] for r in rows], "device": [None] * n,
        "stream": [r[1] for r in rows], "ts": [r[2] for r in rows], "end": [r[3] for r in rows],
        "correlation": [None] * n,
        # A host op is its own launch (it belongs to the step it ran in) and never waits for one.
        "launch_ts": [r[2] for r in rows], "launch_end": [None] * n, "ext": [r[4] for r in rows],
        "launch_tid": [r[1] for r in rows],
    }


def _enclosing_ops(tid: I64, ts: I64, end: I64, q_tid: list[int | None], q_ts: list[int | None]) -> list[int | None]:
    """For each launch (thread, time): the innermost CPU op on that thread containing it, or None."""
    known = np.array([t is not None and q is not None for t, q in zip(q_tid, q_ts, strict=True)], bool)
    found = np.full(len(q_ts), -1, np.int64)
    if known.any():
        pick = np.nonzero(known)[0]
        found[pick] = containing(tid, ts, end, np.array([q_tid[i] for i in pick], np.int64),
                                 np.array([q_ts[i] for i in pick], np.int64))
    return [None if i < 0 else i for i in found.tolist()]


def _activities(con: duckdb.DuckDBPyConnection, file_id: int) -> dict[str, list[Any]]:
    return _columns(
        con,
        """
        WITH launch AS (
            SELECT correlation, min(ts_ns) AS ts, arg_min(ts_ns + dur_ns, ts_ns) AS "end",
                   arg_min(external_id, ts_ns) AS ext, arg_min(tid, ts_ns) AS tid
            FROM runtime_calls WHERE file_id = $f AND correlation IS NOT NULL AND correlation <> 0
            GROUP BY correlation
        ), act AS (
            SELECT 'kernel' AS source, name, device, stream, ts_ns, ts_ns + dur_ns AS end_ns, correlation, external_id
            FROM kernels WHERE file_id = $f
            UNION ALL
            SELECT kind, name, device, stream, ts_ns, ts_ns + dur_ns, correlation, external_id
            FROM copies WHERE file_id = $f
        )
        SELECT act.source, act.name, act.device, act.stream, act.ts_ns AS ts, act.end_ns AS "end",
               act.correlation, launch.ts AS launch_ts, launch."end" AS launch_end,
               coalesce(nullif(act.external_id, 0), launch.ext) AS ext, launch.tid AS launch_tid
        FROM act LEFT JOIN launch ON launch.correlation = act.correlation
        ORDER BY act.ts_ns, act.end_ns
        """,
        {"f": file_id},
    )


def _columns(con: duckdb.DuckDBPyConnection, query: str, params: Any) -> dict[str, list[Any]]:
    """A query's result as Python lists per column (through Arrow: far faster than row tuples)."""
    rel = con.sql(query, params=params)
    # DuckDB 2 names it to_arrow_table; 1.x returns the table from arrow().
    table = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _cpu_ops(con: duckdb.DuckDBPyConnection, file_id: int) -> dict[str, list[Any]]:
    return _columns(
        con,
        """
        SELECT coalesce(tid, -1) AS tid, ts_ns AS ts, ts_ns + dur_ns AS "end", name, fwd_tid, external_id,
               input_dims::VARCHAR AS dims, input_types::VARCHAR AS types, trace_flops,
               CASE WHEN name LIKE '%conv%' THEN (args->'Concrete Inputs')::VARCHAR END AS concrete
        FROM cpu_ops WHERE file_id = ? ORDER BY coalesce(tid, -1), ts_ns, dur_ns DESC
        """,
        [file_id],
    )


def _kernel_flops(
    acts: dict[str, list[Any]], members: dict[int, list[int]], ops: dict[str, list[Any]]
) -> tuple[npt.NDArray[np.float64], list[Any], list[str | None], list[float | None], list[float | None]]:
    """FLOPs per activity: the launching op's FLOPs from its shapes, split over its matmul kernels
    in proportion to their durations (split-K GEMMs launch more than one)."""
    n = len(acts["ts"])
    out = np.zeros(n, np.float64)
    mnk: list[Any] = [None] * n
    dtype: list[str | None] = [None] * n
    nbytes: list[float | None] = [None] * n
    tflops: list[float | None] = [None] * n
    ts, end = acts["ts"], acts["end"]
    for oi, idx in members.items():
        name = ops["name"][oi] or ""
        if name.removesuffix("_") not in flops_mod.SUPPORTED_OPS or ops["dims"][oi] is None:
            continue
        f = _op_flops(name, ops["dims"][oi], ops["types"][oi], ops["concrete"][oi])
        if f is None:
            continue
        durs = [end[i] - ts[i] for i in idx]
        total = sum(durs)
        for j, i in enumerate(idx):
            share = durs[j] / total if total > 0 else 1.0 / len(idx)
            out[i] = f.flops * share
            mnk[i] = f.m_n_k
            dtype[i] = f.dtype
            nbytes[i] = None if f.bytes_moved is None else f.bytes_moved * share
            tflops[i] = ops["trace_flops"][oi]
    return out, mnk, dtype, nbytes, tflops


def _launch_groups(op_idx: list[int | None], kclass: list[str]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The matmul kernels, and the other compute kernels, that each op launched."""
    matmul: dict[int, list[int]] = {}
    other: dict[int, list[int]] = {}
    for i, (oi, k) in enumerate(zip(op_idx, kclass, strict=True)):
        if oi is not None:
            if k in MATMUL_CLASSES:
                matmul.setdefault(oi, []).append(i)
            elif k == "other":
                other.setdefault(oi, []).append(i)
    return matmul, other


def _steps(con: duckdb.DuckDBPyConnection, file_id: int, acts: dict[str, list[Any]]) -> tuple[Steps, I64]:
    spans = con.execute(
        """
        SELECT DISTINCT name, ts_ns, ts_ns + dur_ns FROM cpu_ops
        WHERE file_id = ? AND name LIKE 'ProfilerStep#%' ORDER BY ts_ns
        """,
        [file_id],
    ).fetchall()
    ts = np.asarray(acts["ts"], np.int64)
    end = np.asarray(acts["end"], np.int64)
    n = len(ts)
    if not spans:
        # One window per capture: from the first to the last event of the file.
        lo_hi = con.execute("SELECT first_ts_ns, last_ts_ns FROM trace_files WHERE file_id = ?", [file_id]).fetchall()[0]
        lo = lo_hi[0] if lo_hi[0] is not None else (int(ts.min()) if n else 0)
        hi = lo_hi[1] if lo_hi[1] is not None else (int(end.max()) if n else 0)
        steps = Steps([0], [lo], [hi], np.array([lo], np.int64), np.array([hi], np.int64), [n], False)
        return steps, np.zeros(n, np.int64)
    numbers = [int(m.group(1)) if (m := _STEP_NUMBER.search(s[0])) else i for i, s in enumerate(spans)]
    cpu_start = np.array([s[1] for s in spans], np.int64)
    cpu_end = np.array([s[2] for s in spans], np.int64)
    launch = np.array([v if v is not None else -1 for v in acts["launch_ts"]], np.int64)
    has_launch = np.array([v is not None for v in acts["launch_ts"]], bool)
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
    win_start = np.concatenate([[cpu_start[0]], win_end[:-1]])
    steps = Steps(numbers, cpu_start.tolist(), cpu_end.tolist(), win_start, win_end, counts.tolist(), True)
    return steps, step_of


# Bytes per element of the `Input type` strings record_shapes writes.
_ELEM_BYTES = {
    "float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "int": 4, "long int": 8, "long": 8,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "bool": 1, "unsigned char": 1, "signed char": 1,
}


def _memory_bytes(members: dict[int, list[int]], ops: dict[str, list[Any]], nbytes: list[float | None]) -> None:
    """Bytes a non-matmul kernel must move at least: its op's tensor inputs read once and an output
    the size of the largest input written once (norms, elementwise, optimizer updates). Split over
    the op's kernels like FLOPs are. Fills `nbytes` in place where the shapes allow."""
    for oi, idx in members.items():
        total = _tensor_bytes(ops["dims"][oi], ops["types"][oi])
        if total:
            for i in idx:
                nbytes[i] = total / len(idx)


@functools.lru_cache(maxsize=65536)
def _op_flops(name: str, dims_text: str, types_text: str | None, concrete_text: str | None) -> flops_mod.OpFlops | None:
    # Cached: a step repeats the same few shapes thousands of times.
    try:
        dims = json.loads(dims_text)
        types = json.loads(types_text) if types_text else None
        concrete = json.loads(concrete_text) if concrete_text else None
    except (TypeError, ValueError):
        return None
    return flops_mod.op_flops(name, dims, types, concrete)


@functools.lru_cache(maxsize=65536)
def _tensor_bytes(dims_text: str | None, types_text: str | None) -> float | None:
    # Cached: a step repeats the same few shapes thousands of times.
    if not dims_text or not types_text:
        return None
    try:
        dims, types = json.loads(dims_text), json.loads(types_text)
    except ValueError:
        return None
    sizes = []
    for d, t in zip(dims, types, strict=False):  # malformed records: take what pairs up
        size = _ELEM_BYTES.get(t) if isinstance(t, str) else None
        if size and isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            sizes.append(float(math.prod(d)) * size)
    return sum(sizes) + max(sizes) if sizes else None


def rank_files(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Kineto files to analyze, by rank then capture window."""
    return [r[0] for r in con.execute(
        "SELECT file_id FROM trace_files WHERE kind = 'kineto' ORDER BY rank, capture_window, file_id"
    ).fetchall()]
