"""Runs the analysis over a store: timelines (map), collectives (reduce), ledger and rules."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace

import duckdb

from diag import hardware, store
from diag import model as model_mod
from diag.analysis import Finding, Peak, RunContext, StepContext
from diag.collectives import calls_of, clock_offsets, collective_rows, match, wait_intervals
from diag.errors import BadInput
from diag.ledger import StepLedger
from diag.states import STATES, StateRuns, StepStates, exposed_comm_ns, rank_states
from diag.timeline import RankTimeline, load_rank, rank_files
from rules import RULES
from rules.base import Rule


@dataclass(frozen=True)
class AnalyzeOptions:
    model: str | None = None          # preset name or TOML path
    gpu: str | None = None            # hardware part key
    peak_tflops: float | None = None  # override (checked against "with sparsity" figures)
    tokens_per_step: float | None = None  # global tokens per optimizer step (overrides the model's)


@dataclass
class Analysis:
    run: RunContext
    findings: list[Finding]
    model: model_mod.ModelSpec | None
    flops_source: str                 # how model FLOPs were obtained, one line
    runs: dict[int, StateRuns] = field(default_factory=dict)   # file_id → state runs (for lanes)


def analyze(con: duckdb.DuckDBPyConnection, opts: AnalyzeOptions = AnalyzeOptions()) -> Analysis:
    files = rank_files(con)
    if not files:
        raise BadInput(str(con), "no Kineto traces in the store: ingest some first")
    spec = model_mod.load_model(opts.model) if opts.model else None
    if spec is not None and opts.tokens_per_step:
        spec = replace(spec, tokens_per_step=opts.tokens_per_step)
    timelines = [load_rank(con, f) for f in files]

    # Reduce: collectives across ranks, then each rank's waits and clock offset.
    calls = [c for tl in timelines for c in calls_of(con, tl)]
    by_file = {tl.file_id: tl for tl in timelines}
    for c in calls:
        by_file[c.file_id].collective[c.act] = c.collective   # the CPU side names it better than the kernel
    matched = match(calls)
    offsets = clock_offsets(matched, [tl.rank for tl in timelines])
    host = any(tl.host_timeline for tl in timelines)
    peak = _host_peak(timelines, opts) if host else resolve_peak(timelines, opts)
    world = max([tl.world_size or 0 for tl in timelines] + [len({tl.rank for tl in timelines})])

    states: dict[tuple[int, int], StepStates] = {}
    runs: dict[int, StateRuns] = {}
    exposed: dict[tuple[int, int], int] = {}
    for tl in timelines:
        per_step, runs[tl.file_id] = rank_states(tl, wait_intervals(matched, tl.rank, tl.capture_window))
        for i, st in enumerate(per_step):
            states[(tl.file_id, i)] = st
        exposed.update({(tl.file_id, i): v for i, v in exposed_comm_ns(tl).items()})

    flops_source = _model_flops(timelines, states, spec, world)
    rules = [r() for r in RULES]
    ledgers = [_ledger(tl, i, states[(tl.file_id, i)], peak, rules)
               for tl in timelines for i in range(len(tl.steps.step))]
    mfu, hfu = _utilization(states, peak)
    if mfu is not None and mfu > IMPOSSIBLE_MFU and spec is not None:
        raise BadInput(
            opts.model or spec.name,
            f"the model description gives {mfu:.1f}× the FLOPs the GPUs can do at their dense peak in the "
            "measured steps: it does not describe this run (check params, tokens_per_step and --gpu)",
        )
    run = RunContext(timelines, ledgers, states, matched, offsets, peak, mfu, hfu, world, exposed)
    if host:
        run.notes.append(HOST_NOTE)
    if mfu is None:
        run.notes.append("without model FLOPs at a known peak the compute time is not split: "
                         "gemm_inefficiency holds all GEMM/attention time, non_matmul the rest")
    run.notes.append(flops_source)
    run.notes.append(f"peak: {peak.source}")
    for tl in timelines:
        if not tl.steps.from_profiler_step:
            run.notes.append(f"rank {tl.rank}: no ProfilerStep spans; one window for the whole capture")
    if mfu is not None and mfu > 1:
        run.notes.append(f"MFU above 100% ({mfu:.1%}): the peak is below what the part did, or the model "
                         "FLOPs are overstated")
    refused = sum(lg.refused_s.get("model_compute", 0.0) for lg in ledgers)
    if refused > 0:
        run.notes.append(
            f"model FLOPs at the peak exceed the compute time by {refused:.3g} s in total: the model "
            "description is larger than what ran, or the peak is below what the part did"
        )
    findings = sorted((f for r in rules for f in r.findings(run)), key=lambda f: (-f.lost_fraction, f.code))
    analysis = Analysis(run, findings, spec, flops_source, runs)
    write_tables(con, analysis)
    return analysis


HOST_NOTE = (
    "CPU-only trace (no GPU activity): the host timeline stands in for the GPU's — compute = inside "
    "aten ops, communication = inside gloo collectives, idle = neither; MFU is not reported against a GPU peak"
)


def _host_peak(timelines: list[RankTimeline], opts: AnalyzeOptions) -> Peak:
    """No GPU ran: there is no peak to measure against, whatever --gpu says."""
    return Peak(None, None, None, _gemm_dtype(timelines) or "fp32", "no GPU in the trace: MFU not applicable",
                opts.peak_tflops, None, None)


def resolve_peak(timelines: list[RankTimeline], opts: AnalyzeOptions) -> Peak:
    dtype = _gemm_dtype(timelines)
    dtype_note = "" if dtype else " (GEMM dtype unknown: no shapes recorded; assumed bf16)"
    dtype = dtype or "bf16"
    user = opts.peak_tflops
    part: hardware.Part | None = None
    how = ""
    if opts.gpu:
        try:
            part = hardware.part_by_key(opts.gpu)
        except ValueError as e:
            raise BadInput("--gpu", str(e)) from None
        how = f"--gpu {opts.gpu}"
    else:
        for tl in timelines:
            if tl.device_props:
                ident = hardware.identify(tl.device_props)
                if ident:
                    part, how = ident.part, ident.reason
                    break
    if part is not None and dtype_note and dtype not in part.dense_tflops:
        dtype = "fp16"   # parts without bf16 (V100) train in fp16
        dtype_note = " (GEMM dtype unknown: no shapes recorded; assumed fp16, this part has no bf16)"
    if part is not None and dtype in part.dense_tflops:
        dense = hardware.dense_peak_tflops(part, dtype)
        src = f"{part.name} dense {dtype} {dense:g} TFLOP/s ({how}){dtype_note}"
        if user is not None and not hardware.sparse_peak_matches(user, dtype=dtype) and abs(user - dense) > 1e-9:
            dense, src = user, f"--peak-tflops {user:g} (the part's dense {dtype} figure is {src})"
        return Peak(dense, part.key, part.name, dtype, src, user, part.hbm_gbps, part.nvlink_gbps)
    if user is not None:
        sparse = hardware.sparse_peak_matches(user, dtype=dtype)
        tflops = user / 2 if sparse else user
        src = f"--peak-tflops {user:g}" + (" (a 'with sparsity' figure: halved to the dense peak)" if sparse else "")
        p = sparse[0][0] if sparse else None
        return Peak(tflops, p.key if p else None, p.name if p else None, dtype, src + dtype_note, user,
                    p.hbm_gbps if p else None, p.nvlink_gbps if p else None)
    name = next((tl.device_props.get("name") for tl in timelines if tl.device_props), None)
    return Peak(None, None, name, dtype,
                f"unknown part {name!r}: MFU unknown; pass --gpu or --peak-tflops" if name else
                "no device properties in the trace: MFU unknown; pass --gpu or --peak-tflops", None, None, None)


# cuBLAS/CUTLASS name the TF32 tensor-core path in the kernel: fp32 tensors, TF32 math.
_TF32_KERNEL = re.compile(r"tf32|tensorop_s1688|tensorop_s16816|s1688gemm", re.IGNORECASE)


def _gemm_dtype(timelines: list[RankTimeline]) -> str | None:
    """The dtype most GEMM FLOPs ran in: fp32 tensors on TF32 tensor-core kernels count as tf32."""
    weight: dict[str, float] = defaultdict(float)  # dtype → FLOPs
    for tl in timelines:
        for i, (f, d) in enumerate(zip(tl.flops, tl.dtype, strict=True)):
            if d and f > 0:
                key = "tf32" if d == "fp32" and _TF32_KERNEL.search(tl.name[i] or "") else d
                weight[key] += float(f)
    return max(weight, key=lambda d: weight[d]) if weight else None


def _model_flops(
    timelines: list[RankTimeline], states: dict[tuple[int, int], StepStates],
    spec: model_mod.ModelSpec | None, world: int,
) -> str:
    """Fill each rank-step's model FLOPs; returns how they were obtained."""
    if spec is not None and spec.tokens_per_step:
        per_rank = spec.tokens_per_step * model_mod.flops_per_token(spec) / max(world, 1)
        for k, st in states.items():
            states[k] = _with_model(st, per_rank)
        return (f"model FLOPs from {spec.name}: (6N + 12·L·H·Q·T) = {model_mod.flops_per_token(spec):.4g} "
                f"FLOPs/token × {spec.tokens_per_step:g} tokens/step ÷ {world} GPUs")
    note = "model FLOPs inferred from the trace: 3 × the forward matmul and attention FLOPs from op shapes"
    if spec is not None:
        note += f" ({spec.name} gives no tokens_per_step: pass --tokens-per-step)"
    covered = _shape_coverage(timelines)
    if covered < MIN_SHAPE_COVERAGE:
        # Kernels without shapes (torch.compile regions, record_shapes off) would make the inferred
        # FLOPs, and so the MFU, a silent underestimate: leave them unknown instead.
        for k, st in states.items():
            states[k] = _with_model(st, None)
        return (f"{note}: only {covered:.0%} of GEMM/attention kernel time has op shapes (record_shapes off, "
                "or torch.compile regions), so model FLOPs and MFU are unknown; pass --model with tokens_per_step")
    for k, st in states.items():
        states[k] = _with_model(st, 3.0 * st.fwd_flops)
    return note


# Above this, model FLOPs cannot have run in the measured time even at the dense peak (allowing for
# boost clocks over the datasheet): the model description is not this run's.
IMPOSSIBLE_MFU = 1.5

# Below this share of GEMM/attention kernel time with FLOPs from shapes, inferred FLOPs are not trusted.
MIN_SHAPE_COVERAGE = 0.9


def _shape_coverage(timelines: list[RankTimeline]) -> float:
    total = with_flops = 0
    for tl in timelines:
        for i, k in enumerate(tl.kclass):
            if k in ("gemm", "attention"):
                d = int(tl.end_ns[i] - tl.ts_ns[i])
                total += d
                with_flops += d if tl.flops[i] > 0 else 0
    return with_flops / total if total else 0.0


def _with_model(st: StepStates, flops: float | None) -> StepStates:
    return replace(st, model_flops=flops)


def _ledger(tl: RankTimeline, i: int, st: StepStates, peak: Peak, rules: list[Rule]) -> StepLedger:
    lg = StepLedger.open(tl.rank, st)
    # Claims that belong to no rule: model FLOPs at the peak (this bucket over the step is the
    # MFU) and the GPU starved by the host. host_bound and dataloader time are disjoint by
    # construction (states.py), so their order does not matter.
    if peak.flops_per_s is not None and st.model_flops is not None:
        lg.claim("model_compute", st.model_flops / peak.flops_per_s, ("matmul", "non_matmul"))
    lg.claim("host_bound", st.host_bound_ns * 1e-9, ("idle",))
    ctx = StepContext(tl, i, st, peak)
    for rule in sorted(rules, key=lambda r: r.claim_order):
        rule.claim(ctx, lg)
    lg.close()
    return lg


def _utilization(states: dict[tuple[int, int], StepStates], peak: Peak) -> tuple[float | None, float | None]:
    if peak.flops_per_s is None or not states:
        return None, None
    vals = [st for st in states.values() if st.window_ns > 0]
    flops = [st.model_flops for st in vals]
    if not vals or any(f is None for f in flops) or not any(flops):
        return None, None
    per_s = peak.flops_per_s
    mfu = statistics.fmean((st.model_flops or 0.0) / (st.window_ns * 1e-9 * per_s) for st in vals)
    hfu = statistics.fmean(((st.model_flops or 0.0) + st.recompute_flops) / (st.window_ns * 1e-9 * per_s)
                           for st in vals)
    return mfu, hfu


def write_tables(con: duckdb.DuckDBPyConnection, a: Analysis) -> None:
    """Persist the timelines, collectives, states and ledger (diag/sql/analysis.sql) for the TUI."""
    import pyarrow as pa

    run = a.run
    con.execute(store.sql_text("analysis.sql"))
    for tl in run.timelines:
        s = tl.steps
        store.insert_rows(
            con, "steps",
            [(tl.file_id, tl.rank, tl.capture_window, s.step[i], s.cpu_start_ns[i], s.cpu_end_ns[i],
              int(s.start_ns[i]), int(s.end_ns[i]), s.n_kernels[i], s.from_profiler_step) for i in range(len(s.step))],
        )
        steps = [s.step[i] if i >= 0 else None for i in tl.step_of.tolist()]
        mnk = tl.gemm_mnk
        acts = pa.table({
            "file_id": [tl.file_id] * len(tl), "idx": list(range(len(tl))), "rank": [tl.rank] * len(tl),
            "step": steps, "source": tl.source,
            "name": tl.name, "kclass": tl.kclass, "collective": tl.collective, "stream": tl.stream,
            "ts_ns": tl.ts_ns, "end_ns": tl.end_ns, "correlation": tl.correlation,
            "launch_ts_ns": tl.launch_ts_ns, "launch_end_ns": tl.launch_end_ns, "op_name": tl.op_name,
            "phase": tl.phase, "flops": tl.flops, "gemm_m": [m[0] if m else None for m in mnk],
            "gemm_n": [m[1] if m else None for m in mnk], "gemm_k": [m[2] if m else None for m in mnk],
            "dtype": tl.dtype, "bytes_moved": tl.bytes_moved, "trace_flops": tl.trace_flops,
        })
        con.register("_acts", acts)
        con.execute("INSERT INTO activities SELECT * FROM _acts")
        con.unregister("_acts")
        r = a.runs.get(tl.file_id)
        if r is not None and len(r.start_ns):
            seg = pa.table({
                "rank": [tl.rank] * len(r.start_ns), "step": [s.step[int(i)] for i in r.step],
                "start_ns": r.start_ns, "end_ns": r.end_ns, "state": [STATES[int(x)] for x in r.state],
            })
            con.register("_seg", seg)
            con.execute("INSERT INTO gpu_segments SELECT * FROM _seg")
            con.unregister("_seg")
    store.insert_rows(con, "collectives", collective_rows(run.matched, run.offsets))
    store.insert_rows(
        con, "clock_offsets",
        [(o.rank, o.offset_ns, o.n_matches, o.spread_ns) for o in run.offsets.values()],
    )
    step_no = {(tl.file_id, i): tl.steps.step[i] for tl in run.timelines for i in range(len(tl.steps.step))}
    rank_of = {tl.file_id: tl.rank for tl in run.timelines}
    store.insert_rows(
        con, "gpu_states",
        [(fid, rank_of[fid], step_no[(fid, i)], st.window_ns, st.compute_ns, st.comm_ns, st.copy_ns, st.idle_ns,
          st.matmul_ns, st.non_matmul_ns, st.p2p_only_ns, st.wait_ns, st.dataloader_ns, st.host_bound_ns,
          st.recompute_ns, st.model_flops, st.exec_flops, st.recompute_flops, st.fwd_flops) for (fid, i), st in run.states.items()],
    )
    store.insert_rows(
        con, "ledger",
        [(lg.rank, lg.step, b, s, lg.fractions()[b]) for lg in run.ledgers for b, s in lg.buckets.items()],
    )
