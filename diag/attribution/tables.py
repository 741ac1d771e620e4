"""Writes the analysis tables: a file's rows in the map step (sql/rank_tables.sql), the run's
after the reduce (sql/analysis.sql). The TUI and the gate read them."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from diag.attribution.analysis import RunContext
from diag.runtime import store
from diag.timeline.collectives import collective_rows
from diag.timeline.rank import RankTimeline
from diag.timeline.states import STATES, StateRuns

# Run-level rows are built as Python tuples (~0.3–0.5 kB each) a batch at a time: 128 ranks ×
# 128 MB make 1.2 M collective calls and 0.9 M ledger rows.
ROWS_PER_INSERT = 100_000


def reset_rank_tables(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(store.sql_text("rank_tables.sql"))


def rank_rows(tl: RankTimeline, runs: StateRuns) -> dict[str, pa.Table]:
    """One file's rows of the per-file tables (steps, activities, state runs), as Arrow: built
    where the map runs (maybe another process), inserted by the store's one writer."""
    s = tl.steps
    n_steps = len(s.step)
    n = len(tl)
    step_no = np.asarray(s.step, np.int64)
    mnk = pa.array(tl.gemm_mnk, pa.list_(pa.int64(), 3))
    acts = tl.acts
    return {
        "steps": pa.table({
            "file_id": [tl.file_id] * n_steps, "rank": [tl.rank] * n_steps,
            "capture_window": [tl.capture_window] * n_steps, "step": s.step, "cpu_start_ns": s.cpu_start_ns,
            "cpu_end_ns": s.cpu_end_ns, "start_ns": s.start_ns, "end_ns": s.end_ns, "n_kernels": s.n_kernels,
            "from_profiler_step": [s.from_profiler_step] * n_steps,
        }),
        "activities": pa.table({
            "file_id": np.full(n, tl.file_id, np.int64), "idx": np.arange(n, dtype=np.int64),
            "rank": np.full(n, tl.rank, np.int64),
            "step": pa.array(step_no[np.maximum(tl.step_of, 0)], mask=tl.step_of < 0),
            "source": acts.column("source"), "name": acts.column("name"), "kclass": pa.array(tl.kclass, pa.string()),
            "collective": tl.collective, "stream": acts.column("stream"), "ts_ns": tl.ts_ns, "end_ns": tl.end_ns,
            "correlation": acts.column("correlation"), "launch_ts_ns": acts.column("launch_ts"),
            "launch_end_ns": acts.column("launch_end"), "op_name": tl.op_name,
            "phase": pa.array(tl.phase, pa.string()), "flops": tl.flops, "gemm_m": pc.list_element(mnk, 0),
            "gemm_n": pc.list_element(mnk, 1), "gemm_k": pc.list_element(mnk, 2),
            "dtype": tl.dtype, "bytes_moved": tl.bytes_moved, "trace_flops": tl.trace_flops,
        }),
        "gpu_segments": pa.table({
            "file_id": np.full(len(runs.step), tl.file_id, np.int64),
            "rank": np.full(len(runs.step), tl.rank, np.int64), "step": step_no[runs.step],
            "start_ns": runs.start_ns, "end_ns": runs.end_ns, "state": pa.array(STATES).take(runs.state),
        }),
    }


def insert_rank_rows(con: duckdb.DuckDBPyConnection, files: Sequence[dict[str, pa.Table]]) -> None:
    """Several files' rows, one INSERT per table."""
    for table, data in combined(files).items():
        store.insert_arrow(con, table, data)


def combined(files: Sequence[dict[str, pa.Table]]) -> dict[str, pa.Table]:
    """Several files' rows as one table each, compact: what a map worker sends back (a file's rows
    sliced from its batch's reads would pickle the whole batch's buffers, ~290 kB for a rank of 20
    kernels). A column of only nulls in one file (Arrow's null type) takes the type the others give it."""
    out = {}
    for table in dict.fromkeys(name for rows in files for name in rows):
        parts = [rows[table] for rows in files if table in rows and rows[table].num_rows]
        if parts:
            out[table] = store.concat_small(parts)
    return out


def write_run(con: duckdb.DuckDBPyConnection, run: RunContext) -> None:
    """The collectives, clock offsets, per-step states and the ledger."""
    con.execute(store.sql_text("analysis.sql"))
    _insert_batches(con, "collectives", collective_rows(run.matched, {r: o.offset_ns for r, o in run.offsets.items()}))
    store.insert_rows(
        con, "clock_offsets",
        [(o.rank, o.offset_ns, o.n_matches, o.spread_ns, o.residual_ns) for o in run.offsets.values()],
    )
    step_no = {(r.file_id, i): r.steps.step[i] for r in run.ranks for i in range(len(r.steps.step))}
    rank_of = {r.file_id: r.rank for r in run.ranks}
    _insert_batches(
        con, "gpu_states",
        ((fid, rank_of[fid], step_no[(fid, i)], st.window_ns, st.compute_ns, st.comm_ns, st.copy_ns, st.idle_ns,
          st.matmul_ns, st.non_matmul_ns, st.p2p_only_ns, st.wait_ns, st.dataloader_ns, st.host_bound_ns,
          st.recompute_ns, st.model_flops, st.exec_flops, st.recompute_flops, st.fwd_flops)
         for (fid, i), st in run.states.items()),
    )
    _insert_batches(
        con, "ledger",
        ((lg.rank, lg.step, b, lg.buckets[b], f) for lg in run.ledgers for b, f in lg.fractions().items()),
    )


def _insert_batches(con: duckdb.DuckDBPyConnection, table: str, rows: Iterable[tuple[Any, ...]]) -> None:
    """Insert `rows` ROWS_PER_INSERT at a time: as Python tuples they take far more memory than in the store."""
    it = iter(rows)
    while batch := list(itertools.islice(it, ROWS_PER_INSERT)):
        store.insert_rows(con, table, batch)
