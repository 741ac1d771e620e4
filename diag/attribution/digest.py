"""The map step's output: what the cross-rank step and the rules need from one rank, kept small.

A rank's timeline costs about as much memory as its trace file (bench/scale.py: ~1.07 GB per GB);
its digest keeps the steps, the collective calls, the per-step GPU states and each rule's own
summary — kilobytes to a few MB. analyze holds one timeline at a time, so its memory does not
grow with the number of ranks (issue 7), and live re-analysis re-maps only the files that are new.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import duckdb
import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow.compute as pc

from diag.attribution.workload_mix import Mix, attention_bmms, mix_of
from diag.knowledge import isa, kernels
from diag.timeline.collectives import Call, calls_of
from diag.timeline.columns import numpy_of
from diag.timeline.pipeline_actions import PipeAction
from diag.timeline.rank import MATMUL_CLASSES, RankTimeline, Steps
from diag.timeline.states import I64, StateRuns, StepStates, Waitable, exposed_comm_ns, rank_states

# cuBLAS/CUTLASS name the TF32 tensor-core path in the kernel: fp32 tensors, TF32 math (gemm_shape.py,
# MFU009; the dtype mix reads the same from data/kernels.toml [[gemm_dtype]]).
TF32_KERNEL = re.compile(r"tf32|tensorop_s1688|tensorop_s16816|s1688gemm", re.IGNORECASE)


class RankDigest(msgspec.Struct):
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
    gemm_dtype_flops: dict[str, float]  # dtype the GEMM ran in → FLOPs (the dtype mix of the peak)
    matmul_ns: int                      # GEMM/attention kernel time ...
    matmul_with_flops_ns: int           # ... and the part of it whose op shapes gave FLOPs
    matmul_name_dtype_ns: dict[str, int]  # GEMM/attention kernel time by the dtype its name says ("": none)
    kernel_ns: int                      # all SM kernel time
    unknown_kernel_ns: dict[str, int]   # kernel names no row of kernels.toml names → their time
    rules: dict[str, Any] = msgspec.field(default_factory=dict)   # rule code → that rule's per-rank digest
    backward_pass: bool = True          # RankTimeline.backward_pass: this rank trains
    graph_kernel_ns: int = 0            # the part of kernel_ns a CUDA/HIP graph launch ran
    graph_launches: int = 0             # graph launch calls behind them
    # The data loader's CPU spans (own clock): the critical path calls idle time under them `host`.
    dataloader_spans: tuple[I64, I64] = msgspec.field(default_factory=lambda: (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    mix: Mix | None = None              # kernel time by family signal, and features in use (workload_mix.py)
    # The FLOPs coverage of GEMM/attention kernels (issue 36): the FLOPs the shaped ones executed,
    # the unshaped ones' time per step (index into steps) and by why they have no FLOPs (unshaped_why).
    matmul_flops: float = 0.0
    unshaped_ns_by_step: list[int] = msgspec.field(default_factory=list)
    unshaped_ns_by_why: dict[str, int] = msgspec.field(default_factory=dict)
    isa: str | None = None              # the AMD gfx target kernel names carry (knowledge/isa.py), if any
    pipeline_actions: list[PipeAction] = msgspec.field(default_factory=list)   # `PP:` schedule actions


def digest_rank(con: duckdb.DuckDBPyConnection, tl: RankTimeline) -> tuple[RankDigest, StateRuns]:
    """One rank's digest, and its state runs (for the lanes table, written by the caller).

    Sets each communication kernel's collective from its CPU-side call first: the op names it
    better than the kernel (an NCCL send/recv kernel may be an all-to-all)."""
    calls = name_collectives(con, tl)
    states, runs, waitable = rank_states(tl)
    # GEMM/attention kernels, less an earlier iteration's that ran before the first window with no
    # launch record (RankTimeline.steps.carried): no step's FLOPs, so no part of their coverage.
    matmul = np.isin(tl.kclass, list(MATMUL_CLASSES)) & ~_before_first_window(tl)
    dur = tl.end_ns[matmul] - tl.ts_ns[matmul]
    kernel_dur = (tl.end_ns - tl.ts_ns)[tl.kernel]
    graph = numpy_of(tl.acts.column("graph").fill_null(False), bool)[tl.kernel]
    digest = RankDigest(
        tl.file_id, tl.rank, tl.capture_window, tl.world_size, tl.device_props, tl.gpus_per_node,
        tl.host_timeline, tl.steps, calls, states, waitable, exposed_comm_ns(tl), _gemm_dtype_flops(tl),
        int(dur.sum()), int(dur[tl.flops[matmul] > 0].sum()), _time_by_name(tl, matmul, _name_dtype),
        int(kernel_dur.sum()), _time_by_name(tl, tl.kernel, _unknown_name), backward_pass=tl.backward_pass,
        graph_kernel_ns=int(kernel_dur[graph].sum()),
        graph_launches=len(set(np.asarray(tl.correlation, dtype=object)[tl.kernel][graph].tolist())),
        dataloader_spans=tl.dataloader_spans,
        mix=mix_of(tl, attention_bmms(tl.op_name, tl.stream, tl.kernel.tolist())),
        matmul_flops=float(tl.flops[matmul].sum()),
        unshaped_ns_by_step=_unshaped_by_step(tl, matmul), unshaped_ns_by_why=_unshaped_by_why(tl, matmul),
        isa=isa.most_common_isa(pc.unique(tl.acts.column("name")).drop_null().to_pylist()),
        pipeline_actions=tl.pipeline_actions,
    )
    return digest, runs


def _before_first_window(tl: RankTimeline) -> npt.NDArray[np.bool_]:
    if not len(tl.steps.start_ns) or not len(tl):
        return np.zeros(len(tl), bool)
    unlaunched = np.array([t is None for t in tl.launch_ts_ns], bool)
    return unlaunched & (tl.end_ns <= tl.steps.start_ns[0])


NO_LAUNCH = "no launch record"
NO_OP = "no op around its launch"
# A CUDA/HIP graph replays its kernels from one launch call: no op with shapes runs per kernel
# (torch.compile(mode="reduce-overhead") on an H200: every GEMM of the step so).
GRAPH = "a CUDA graph replay (one launch, no op shapes per kernel)"


def unshaped_why(op: str | None, launched: bool, graph: bool = False) -> str:
    """Why a GEMM/attention kernel has no FLOPs: a graph replayed it, its launch is not in the trace
    (the kernel of an earlier iteration, or a capture that began mid-step), no op encloses its
    launch, or the op around it gives none (no recorded shapes, or an op flops.py does not count)."""
    if graph:
        return GRAPH
    if op:
        return op
    return NO_OP if launched else NO_LAUNCH


def _unshaped(tl: RankTimeline, matmul: npt.NDArray[np.bool_]) -> npt.NDArray[np.intp]:
    return np.nonzero(matmul & ~(tl.flops > 0))[0]


def _unshaped_by_step(tl: RankTimeline, matmul: npt.NDArray[np.bool_]) -> list[int]:
    """Per step, the time of its GEMM/attention kernels without FLOPs: those it launched, and those
    with no launch in it that run inside its window (an unlaunched kernel counts against coverage
    wherever it runs, so it widens mfu_range's upper bound there too, or the range would be no range)."""
    idx = _unshaped(tl, matmul)
    step = tl.step_of[idx].copy()
    starts, ends = tl.steps.start_ns, tl.steps.end_ns
    if len(starts) and (orphan := step < 0).any():
        at = np.searchsorted(starts, tl.ts_ns[idx], side="right") - 1
        inside = orphan & (at >= 0) & (tl.ts_ns[idx] < ends[np.clip(at, 0, None)])
        step[inside] = at[inside]
    keep = step >= 0
    dur = (tl.end_ns[idx] - tl.ts_ns[idx])[keep]
    return np.bincount(step[keep], weights=dur, minlength=len(tl.steps.step)).astype(np.int64).tolist()


def _unshaped_by_why(tl: RankTimeline, matmul: npt.NDArray[np.bool_]) -> dict[str, int]:
    out: Counter[str] = Counter()
    launch = tl.launch_ts_ns
    graph = tl.acts.column("graph").fill_null(False).to_pylist()
    for i in _unshaped(tl, matmul).tolist():
        out[unshaped_why(tl.op_name[i], launch[i] is not None, graph[i])] += int(tl.end_ns[i] - tl.ts_ns[i])
    return dict(out)


def name_collectives(con: duckdb.DuckDBPyConnection, tl: RankTimeline) -> list[Call]:
    """The rank's collective calls, each communication kernel's collective set from its call."""
    calls = calls_of(con, tl)
    for c in calls:
        tl.collective[c.act] = c.collective
    return calls


def _name_dtype(name: str) -> str | None:
    return kernels.gemm_dtype(name) or ""


def _unknown_name(name: str) -> str | None:
    return name if kernels.unknown(name) else None


def _time_by_name(tl: RankTimeline, which: npt.NDArray[np.bool_], key: Callable[[str], str | None]) -> dict[str, int]:
    """Kernel time of the activities `which`, summed by key(name); a None key is left out."""
    idx = np.nonzero(which)[0]
    names = tl.acts.column("name").take(idx).to_pylist()
    out: Counter[str] = Counter()
    for name, ns in zip(names, (tl.end_ns[idx] - tl.ts_ns[idx]).tolist(), strict=True):
        k = key(name or "")
        if k is not None:
            out[k] += int(ns)
    return dict(out)


def _gemm_dtype_flops(tl: RankTimeline) -> dict[str, float]:
    """FLOPs by the dtype they ran in: the op's tensors' dtype, refined by the kernel's name where
    the tensors cannot tell (fp32 tensors on TF32 tensor cores are tf32; fp8 held as uint8 has
    no tensor dtype)."""
    weight: dict[str, float] = defaultdict(float)
    idx = np.nonzero(tl.flops > 0)[0]
    names = [kernels.gemm_dtype(n or "") for n in tl.acts.column("name").take(idx).to_pylist()]
    # A split-K GEMM's reduction kernel (cublasSplitKParams) says no dtype: it takes its op's GEMM's.
    op_says: dict[int, str] = {}
    for i, by_name in zip(idx.tolist(), names, strict=True):
        ext = tl.op_external_id[i]
        if by_name and ext is not None:
            op_says.setdefault(ext, by_name)
    for i, f, by_name in zip(idx.tolist(), tl.flops[idx].tolist(), names, strict=True):
        d = tl.dtype[i]
        ext = tl.op_external_id[i]
        by_name = by_name or (op_says.get(ext) if ext is not None else None)
        if d in (None, "fp32") and (d is None or by_name == "tf32"):
            d = by_name
        if d:
            weight[d] += f
    return dict(weight)

