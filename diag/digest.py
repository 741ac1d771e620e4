"""The map step's output: what the cross-rank step and the rules need from one rank, kept small.

A rank's timeline costs about as much memory as its trace file (bench/scale.py: ~1.07 GB per GB);
its digest keeps the steps, the collective calls, the per-step GPU states and each rule's own
summary — kilobytes to a few MB. analyze holds one timeline at a time, so its memory does not
grow with the number of ranks (issue 7), and live re-analysis re-maps only the files that are new.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from diag.collectives import Call, calls_of
from diag.states import StateRuns, StepStates, Waitable, exposed_comm_ns, rank_states
from diag.timeline import MATMUL_CLASSES, RankTimeline, Steps

# cuBLAS/CUTLASS name the TF32 tensor-core path in the kernel: fp32 tensors, TF32 math.
TF32_KERNEL = re.compile(r"tf32|tensorop_s1688|tensorop_s16816|s1688gemm", re.IGNORECASE)


@dataclass
class RankDigest:
    file_id: int
    rank: int
    capture_window: int
    world_size: int | None
    device_props: dict[str, Any] | None
    gpus_per_node: int | None
    host_timeline: bool
    steps: Steps
    calls: list[Call]
    states: list[StepStates]            # per step; wait_ns is filled by the reduce
    waitable: Waitable                  # where the reduce measures waits for the last rank
    exposed_ns: dict[int, int]          # communication kernel (activity index) → time with no compute beside it
    gemm_dtype_flops: dict[str, float]  # dtype the GEMM ran in → FLOPs (picks the peak's dtype)
    matmul_ns: int                      # GEMM/attention kernel time ...
    matmul_with_flops_ns: int           # ... and the part of it whose op shapes gave FLOPs
    rules: dict[str, Any] = field(default_factory=dict)   # rule code → that rule's per-rank digest


def digest_rank(con: duckdb.DuckDBPyConnection, tl: RankTimeline) -> tuple[RankDigest, StateRuns]:
    """One rank's digest, and its state runs (for the lanes table, written by the caller).

    Sets each communication kernel's collective from its CPU-side call first: the op names it
    better than the kernel (an NCCL send/recv kernel may be an all-to-all)."""
    calls = calls_of(con, tl)
    for c in calls:
        tl.collective[c.act] = c.collective
    states, runs, waitable = rank_states(tl)
    matmul = np.isin(tl.kclass, list(MATMUL_CLASSES))
    dur = tl.end_ns[matmul] - tl.ts_ns[matmul]
    digest = RankDigest(
        tl.file_id, tl.rank, tl.capture_window, tl.world_size, tl.device_props, tl.gpus_per_node,
        tl.host_timeline, tl.steps, calls, states, waitable, exposed_comm_ns(tl), _gemm_dtype_flops(tl),
        int(dur.sum()), int(dur[tl.flops[matmul] > 0].sum()),
    )
    return digest, runs


def _gemm_dtype_flops(tl: RankTimeline) -> dict[str, float]:
    """FLOPs by the dtype they ran in: fp32 tensors on TF32 tensor-core kernels count as tf32."""
    weight: dict[str, float] = defaultdict(float)
    tf32: dict[str, bool] = {}
    idx = np.nonzero(tl.flops > 0)[0]
    names = tl.acts.column("name").take(idx).to_pylist()
    for i, f, name in zip(idx.tolist(), tl.flops[idx].tolist(), names, strict=True):
        d = tl.dtype[i]
        if d == "fp32":
            name = name or ""
            if name not in tf32:
                tf32[name] = bool(TF32_KERNEL.search(name))
            d = "tf32" if tf32[name] else d
        if d:
            weight[d] += f
    return dict(weight)

