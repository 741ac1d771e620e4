"""Timelines on real traces: the GPU-state split agrees with HTA's temporal breakdown within
1 point; the FLOPs of a GEMM equal a hand computation from its shapes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import shared_traces

from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.runtime import store
from diag.timeline.rank import load_rank, rank_files
from diag.timeline.sweep import sweep

HTA_CASES = [
    "HolisticTraceAnalysis/tests/data/trace_filter",            # two ranks of a 128-rank job
    "HolisticTraceAnalysis/tests/data/trace_diff/control",      # A100, 8-rank job, rank 3
    "HolisticTraceAnalysis/tests/data/nccl_parser_config",      # A100, NCCL collectives
]


def our_split(trace_dir: Path) -> dict[int, dict[str, float]]:
    """Compute / non-compute (comm or copy only) / idle per rank, in percent of the span from the
    first GPU activity to the last, over the activities HTA keeps: with two or more ProfilerSteps,
    HTA drops what the last step launched (hta/common/trace.py, _filter_irrelevant_gpu_kernels)."""
    con = store.connect(None)
    ingest([str(trace_dir)], con, IngestOptions(jobs=1))
    out = {}
    for fid in rank_files(con):
        tl = load_rank(con, fid)
        launch = np.array([-1 if t is None else t for t in tl.launch_ts_ns], np.int64)
        keep = launch >= 0
        if tl.steps.from_profiler_step and len(tl.steps.step) >= 2:
            keep &= launch < tl.steps.cpu_start_ns[-1]
        kernel = np.array([s == "kernel" for s in tl.source]) & keep
        comm = kernel & np.array([k == "comm" for k in tl.kclass])
        other = (keep & ~kernel) | comm
        seg = sweep({
            "compute": (tl.ts_ns[kernel & ~comm], tl.end_ns[kernel & ~comm]),
            "other": (tl.ts_ns[other], tl.end_ns[other]),
        })
        dur = seg.end_ns - seg.start_ns
        span = float(dur.sum())
        compute = float(dur[seg.active["compute"] > 0].sum())
        other = float(dur[(seg.active["compute"] == 0) & (seg.active["other"] > 0)].sum())
        out[tl.rank] = {"compute": 100 * compute / span, "non_compute": 100 * other / span,
                        "idle": 100 * (span - compute - other) / span}
    return out


@pytest.mark.parametrize("case", HTA_CASES)
def test_state_split_agrees_with_hta(case: str, tmp_path: Path) -> None:
    hta = pytest.importorskip("hta.trace_analysis")
    src = shared_traces() / case
    d = tmp_path / "traces"
    d.mkdir()
    for f in src.glob("*.json.gz"):
        shutil.copy(f, d / f.name)
    theirs = hta.TraceAnalysis(trace_dir=str(d)).get_temporal_breakdown(visualize=False)
    ours = our_split(d)
    assert set(ours) == set(theirs["rank"])
    for _, row in theirs.iterrows():
        mine = ours[int(row["rank"])]
        assert mine["compute"] == pytest.approx(row["compute_time_pctg"], abs=1.0)
        assert mine["non_compute"] == pytest.approx(row["non_compute_time_pctg"], abs=1.0)
        assert mine["idle"] == pytest.approx(row["idle_time_pctg"], abs=1.0)


def test_gemm_flops_equal_a_hand_computation_from_shapes() -> None:
    con = store.connect(None)
    ingest([str(shared_traces() / "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz")], con,
           IngestOptions(jobs=1))
    tl = load_rank(con, rank_files(con)[0])
    checked = 0
    for i, op in enumerate(tl.op_name):
        mnk = tl.gemm_mnk[i]
        if op == "aten::mm" and tl.flops[i] > 0 and mnk is not None:
            m, n, k = mnk
            # all of this op's FLOPs sit on its GEMM kernels: add them up
            same_op = [j for j in range(len(tl)) if tl.op_external_id[j] == tl.op_external_id[i] and tl.flops[j] > 0]
            assert sum(tl.flops[j] for j in same_op) == pytest.approx(2 * m * n * k)
            checked += 1
    assert checked > 10
