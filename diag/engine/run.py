"""Runs the analysis over a store: timelines (map), collectives (reduce), ledger and rules."""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Callable, Generator, Iterator
from contextlib import closing, contextmanager, nullcontext
from typing import Any

import duckdb
import msgspec
import numpy as np
import pyarrow as pa
from msgspec.structs import replace

from diag.attribution import dtype_mix, tables
from diag.attribution.analysis import Finding, Peak, RunContext, StepContext
from diag.attribution.critical_path import StepPath, critical_paths
from diag.attribution.critical_path import write as write_critical_path
from diag.attribution.digest import GRAPH, NO_LAUNCH, NO_OP, RankDigest
from diag.attribution.ledger import StepLedger
from diag.attribution.mesh import Mesh, infer
from diag.attribution.what_if import retimed
from diag.engine import rank_map
from diag.engine.map_step import gpu_part, map_ranks
from diag.ingest.discover import name_parts
from diag.ingest.ranks import check_one_run, rank_notes
from diag.knowledge import hardware, isa, kernels
from diag.knowledge import model as model_mod
from diag.runtime import store
from diag.runtime.durations import number, percent, times
from diag.runtime.errors import BadInput
from diag.runtime.executor import Executor, LocalExecutor
from diag.runtime.lifetime import run_dir
from diag.runtime.progress import Progress
from diag.timeline.clocks import clock_notes, clock_offsets
from diag.timeline.collectives import Matched, match, wait_intervals
from diag.timeline.rank import rank_files
from diag.timeline.states import I64, StepStates, covered_ns, with_waits
from diag.timeline.step_outliers import excluded_steps
from rules import RULES
from rules.base import Rule


class AnalyzeOptions(msgspec.Struct, frozen=True):
    model: str | None = None          # preset name or TOML path
    gpu: str | None = None            # hardware part key
    peak_tflops: float | None = None  # override (checked against "with sparsity" figures)
    tokens_per_step: float | None = None  # global tokens per optimizer step (overrides the model's)
    all_steps: bool = False           # keep warm-up and teardown steps in the means (diag/timeline/step_outliers.py)


class Analysis(msgspec.Struct):
    run: RunContext
    findings: list[Finding]
    model: model_mod.ModelSpec | None
    flops_source: str                 # how model FLOPs were obtained, one line
    critical_path: list[StepPath] = msgspec.field(default_factory=list)   # per step number (critical_path.py)


WRITE_FILES = 64


def analyze(con: duckdb.DuckDBPyConnection, opts: AnalyzeOptions = AnalyzeOptions(),
            cache: dict[int, RankDigest] | None = None, executor: Executor[Any] | None = None,
            spill_dir: str | None = None, progress: Progress | None = None, jobs: int | None = None) -> Analysis:
    """Map each trace file to its digest (writing its rows of rank_tables.sql), then reduce.

    `cache` (file_id → digest) carries the map step's work from one analysis of this store to the
    next with the same options: live mode re-maps only the files that are new. Empty or None: every
    file is mapped and the per-file tables are rebuilt. With an `executor`, the map runs there
    (diag/engine/rank_map.py: each file's rows go by Parquet under `spill_dir`); else in this process,
    or in a pool of `jobs` local workers (default: the cores) when the files are many and small
    (_map_pool). `progress` is called after each file mapped (diag/runtime/progress.py)."""
    files = rank_files(con)
    if not files:
        raise BadInput(store.name(con), "no Kineto traces in the store: ingest some first")
    check_one_run(con)
    spec = model_mod.load_model(opts.model) if opts.model else None
    if spec is not None and opts.tokens_per_step:
        spec = dataclasses.replace(spec, tokens_per_step=opts.tokens_per_step)   # a dataclass (diag/knowledge/model.py)
    gpu = gpu_part(opts.gpu)
    rules = [r() for r in RULES]
    cache = {} if cache is None else cache
    if not cache:
        with store.transaction(con):
            tables.reset_rank_tables(con)
    todo = [f for f in files if f not in cache]
    with _map_pool(con, todo, jobs, spill_dir) if executor is None else nullcontext((executor, spill_dir)) as (
            elsewhere, spill):
        mapped = rank_map.map_elsewhere(con, todo, opts.gpu, elsewhere, spill) if elsewhere is not None else \
            _one_by_one(map_ranks(con, todo, rules, gpu))
        _write_mapped(con, len(todo), mapped, cache, progress)
    # The run's tables change at once: a reader (the TUI) sees the old ones or the new.
    with store.transaction(con):
        return _reduce(con, [cache[f] for f in files], rules, spec, opts)


# Many small files are mapped by a pool of local workers: a file's map costs a few ms whatever its
# size (10,000 ranks of 20 kernels: 61 s in one process, issue 16), which more cores divide, while
# the export to the workers goes by batches of files (rank_map.py). Bigger files stay in this
# process: the export and the results' pickling cost per byte, and a worker holds its batch in a
# store of its own. 512 generated ranks of ~2,500 events took 20% more CPU with the pools than
# without and 705 MB against 402 MB (issue 41); a file of 20 kernels holds ~85 events.
POOL_FILES = 512
POOL_MEAN_EVENTS = 500


@contextmanager
def _map_pool(con: duckdb.DuckDBPyConnection, todo: list[int], jobs: int | None,
              spill_dir: str | None) -> Iterator[tuple[Executor[Any] | None, str | None]]:
    """The pool and where its exports go (a run directory: a killed run's are swept, diag/runtime/lifetime.py),
    or (None, None): map here."""
    workers = jobs or os.cpu_count() or 1
    if workers < 2 or len(todo) < POOL_FILES or \
            con.execute("SELECT avg(coalesce(n_events, 0)) FROM trace_files WHERE kind = 'kineto'").fetchall()[0][0] \
            > POOL_MEAN_EVENTS:
        yield None, None
        return
    with run_dir(spill_dir) as scratch, LocalExecutor(workers) as pool:
        yield pool, scratch


# What the map hands over: some files' digests, in order, and their rows (a dict of tables per
# file from this process; one for a whole batch from a worker: rank_map.py).
Mapped = Generator[tuple[list[RankDigest], list[dict[str, pa.Table]]], None, None]


def _one_by_one(mapped: Generator[tuple[RankDigest, dict[str, pa.Table]], None, None]) -> Mapped:
    with closing(mapped):
        for digest, rows in mapped:
            yield [digest], [rows]


def _write_mapped(con: duckdb.DuckDBPyConnection, n_files: int, mapped: Mapped, cache: dict[int, RankDigest],
                  progress: Progress | None) -> None:
    """The map's rows into the store, its digests into `cache`."""
    # A transaction per store.FLUSH_BYTES of rows: DuckDB holds a transaction's new rows in
    # memory, and the activities of 128 ranks × 128 MB in one would take ~5 GB (docs/scale.md);
    # a big file's rows go alone, while small files' go together, WRITE_FILES at most, since each
    # INSERT costs ~2 ms and each transaction more, whatever its size (2,000 files of 20 kernels:
    # issue 16). Many small tables take several times their nbytes: 500 files at once peaked at
    # 205 MB against 115 MB one at a time.
    # closing: a failure ends the map's reading thread and connection (or its calls elsewhere and
    # their exports) at once, not when the traceback is dropped.
    with closing(mapped):
        digests: list[RankDigest] = []
        rows: list[dict[str, pa.Table]] = []
        done = nbytes = 0
        for ds, rs in mapped:
            digests += ds
            rows += rs
            nbytes += sum(store.arrow_bytes(t) for r in rs for t in r.values())
            done += len(ds)
            if done == n_files or nbytes >= store.FLUSH_BYTES or len(digests) >= WRITE_FILES:
                with store.transaction(con):
                    tables.insert_rank_rows(con, rows)
                cache.update((d.file_id, d) for d in digests)   # only what is in the store
                digests, rows, nbytes = [], [], 0
            if progress:
                progress(done, n_files, f"rank {ds[-1].rank}")


def _reduce(con: duckdb.DuckDBPyConnection, ranks: list[RankDigest], rules: list[Rule[Any]],
            spec: model_mod.ModelSpec | None, opts: AnalyzeOptions) -> Analysis:
    """Collectives across ranks, then each rank's waits and clock offset; the ledger and the rules."""
    matched = match(c for r in ranks for c in r.calls)
    offsets = clock_offsets(matched, [r.rank for r in ranks])
    host = any(r.host_timeline for r in ranks)
    peak = _host_peak(ranks, opts) if host else resolve_peak(ranks, opts, lambda: _hip_runtime(con, ranks))
    world = max([r.world_size or 0 for r in ranks] + [len({r.rank for r in ranks})])
    mesh = _mesh(con, ranks, matched, world, host)

    waits = wait_intervals(matched)
    none: tuple[I64, I64] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    states: dict[tuple[int, int], StepStates] = {}
    exposed: dict[tuple[int, int], int] = {}
    for r in ranks:
        per_step = with_waits(r.states, r.steps.start_ns, r.steps.end_ns, r.waitable,
                              waits.get((r.rank, r.capture_window), none))
        states.update({(r.file_id, i): st for i, st in enumerate(per_step)})
        exposed.update({(r.file_id, i): v for i, v in r.exposed_ns.items()})
    _take_out_waits(exposed, ranks, matched)

    workload = "training" if any(r.backward_pass for r in ranks) else "inference"
    flops_source = _model_flops(ranks, states, spec, world, workload)
    outliers = {(r.file_id, i): (r.rank, r.steps.step[i], why) for r in ranks
                for i, why in excluded_steps(r.steps).items()}
    if not opts.all_steps:
        states = {k: st for k, st in states.items() if k not in outliers}
    ledgers = [_ledger(r, i, states[(r.file_id, i)], peak, rules) for r in ranks for i in range(len(r.steps.step))
               if (r.file_id, i) in states]
    mfu, hfu = _utilization(states, peak)
    coverage = _shape_coverage(ranks) if any(r.matmul_ns for r in ranks) else None
    bounds = mfu_range(ranks, states, peak, workload) if mfu is None and coverage \
        and coverage < MIN_SHAPE_COVERAGE and not (spec is not None and spec.tokens_per_step) else None
    if mfu is not None and mfu > IMPOSSIBLE_MFU and spec is not None:
        raise BadInput(
            opts.model or spec.name,
            f"the model description gives {times(mfu)} the FLOPs the GPUs can do at their dense peak in the "
            "measured steps: it does not describe this run (check params, tokens_per_step and --gpu)",
        )
    run = RunContext(ranks, ledgers, states, matched, offsets, peak, mfu, hfu, world, exposed, workload=workload,
                     steps_excluded=[] if opts.all_steps else sorted(outliers.values()),
                     flops_coverage=coverage, mfu_range=bounds, mesh=mesh)
    if workload == "inference":
        run.notes.append(INFERENCE_NOTE)
    if host:
        run.notes.append(UNRECORDED_GPU_NOTE.format(gpu=peak.part_name) if peak.part_name
                         else HOST_NOTE + HOST_MFU[peak.tflops is not None])
    run.notes.extend(clock_notes(offsets, matched))
    if mfu is None:
        run.notes.append("without model FLOPs at a known peak the compute time is not split: "
                         "gemm_inefficiency holds all GEMM/attention time, non_matmul the rest")
    run.notes.append(flops_source)
    if bounds is not None:
        run.notes.append(
            f"MFU between {percent(bounds[0])} and {percent(bounds[1])} (mfu_range): the lower bound counts the FLOPs op "
            "shapes give, the upper adds the rest of GEMM/attention kernel time at the rate the shaped kernels "
            "achieved")
    run.notes.append(f"peak: {peak.source}")
    if (masks := _conv_mask_note(con, ranks)) is not None:
        run.notes.append(masks)
    run.notes.extend(rank_notes(con))
    # On a host timeline the activities are aten ops, not kernels: no kernel table applies.
    unknown = None if host else _unknown_kernels_note(ranks)
    if unknown:
        run.notes.append(unknown)
    graph_ns = sum(r.graph_kernel_ns for r in ranks)
    if graph_ns:
        run.notes.append(
            f"{graph_ns / sum(r.kernel_ns for r in ranks):.1%} of GPU kernel time (summed kernel durations) ran "
            f"inside CUDA/HIP graphs ({sum(r.graph_launches for r in ranks)} graph launches); each graph's kernels "
            "belong to the op and step of the call that launched it")
    if outliers:
        kept = "kept in the means (--all-steps)" if opts.all_steps else "left out of the means (--all-steps keeps them)"
        run.notes.append(f"{len(outliers)} warm-up/teardown step(s) {kept}: " + "; ".join(
            f"rank {rank} step {step}: {why}" for rank, step, why in sorted(outliers.values())[:4]))
    for r in ranks:
        if not r.steps.from_profiler_step:
            run.notes.append(f"rank {r.rank}: no ProfilerStep spans; one window for the whole capture")
    carried = [r for r in ranks if r.steps.carried]
    if carried:
        run.notes.append(
            f"{sum(r.steps.carried for r in carried)} GPU activities ({sum(r.steps.carried_ns for r in carried) * 1e-6:.3g} "
            f"ms) with no launch record ran before the first step's own on rank(s) "
            f"{', '.join(str(r) for r in sorted({r.rank for r in carried}))}: an earlier iteration's work, left out; "
            "the first step begins where it ends")
    if mfu is not None and mfu > 1:
        run.notes.append(f"MFU above 100% ({mfu:.1%}): the peak is below what the part did, or the model "
                         "FLOPs are overstated")
    refused = sum(lg.refused_s.get("model_compute", 0.0) for lg in ledgers)
    if refused > 0:
        run.notes.append(
            f"model FLOPs at the peak exceed the compute time by {refused:.3g} s in total: the model "
            "description is larger than what ran, or the peak is below what the part did"
        )
    # Ranked by what a fix can win, so a run whose GEMMs sit at a normal 70% of peak still leads with
    # its real, fixable cause; then by what it costs.
    findings = sorted((f for r in rules for f in r.findings(run)),
                      key=lambda f: (-f.recoverable_fraction, -f.lost_fraction, f.code))
    tables.write_run(con, run)
    paths = critical_paths(con, run)
    write_critical_path(con, paths)
    findings = retimed(con, run, findings)
    return Analysis(run, findings, spec, flops_source, paths)


_MESH_BATCH = 256


def _mesh(con: duckdb.DuckDBPyConnection, ranks: list[RankDigest], matched: list[Matched], world: int,
          host: bool) -> Mesh:
    """The parallel layout (attribution/mesh.py) from each traced file's pg_config, the collectives and
    the process groups Flight Recorder dumps name. Every rank lists the default group with all its
    ranks: the entries are made distinct in DuckDB, so 10,000 ranks' lists are not parsed in Python.
    A few hundred files a query: 4,096 ranks' lists (24 kB each) read at once ran DuckDB past its
    512 MiB limit; each batch's entries are made distinct there and merged here."""
    ids = sorted({r.file_id for r in ranks})
    distinct: set[str] = set()
    listing, mappings = 0, list[str]()
    for at in range(0, len(ids), _MESH_BATCH):
        part = f"file_id IN ({store.id_set(ids[at:at + _MESH_BATCH])}) AND distributed_info IS NOT NULL"
        distinct.update(e for (e,) in con.execute(
            f"SELECT DISTINCT CAST(unnest(json_extract(distributed_info, '$.pg_config[*]')) AS VARCHAR) "
            f"FROM trace_files WHERE {part} AND json_type(distributed_info, '$.pg_config') = 'ARRAY'").fetchall())
        n, maps = con.execute(
            "SELECT count(*) FILTER (WHERE json_type(distributed_info, '$.pg_config') = 'ARRAY'), "
            "list(json_extract(distributed_info, '$.pg_config')) FILTER (WHERE json_type(distributed_info, "
            f"'$.pg_config') = 'OBJECT') FROM trace_files WHERE {part}").fetchall()[0]
        listing, mappings = listing + n, mappings + (maps or [])
    entries = sorted(distinct)
    fr = con.execute("SELECT DISTINCT pg_name, pg_desc, n_ranks FROM nccl_ops WHERE source = 'flight_recorder' "
                     "AND pg_name IS NOT NULL ORDER BY ALL").fetchall()
    configs = [f"[{','.join(entries)}]", *mappings]
    return infer(configs, matched, world, (r.gpus_per_node for r in ranks), host, fr,
                 config_ranks=listing + len(mappings), host_of=_host_names(con, ranks))


def _host_names(con: duckdb.DuckDBPyConnection, ranks: list[RankDigest]) -> dict[int, str]:
    """Global rank → the host its trace file's name gives (tensorboard_trace_handler's default
    `{hostname}_{pid}.{time_ns}.pt.trace.json`), for the ranks whose names give one."""
    ids = store.id_set(sorted({r.file_id for r in ranks}))
    out = {}
    for rank, path in con.execute(f"SELECT rank, path FROM trace_files WHERE file_id IN ({ids}) AND rank IS NOT NULL "
                                  "ORDER BY file_id").fetchall():
        if (name := name_parts(path).host) is not None:
            out[int(rank)] = name
    return out


def _take_out_waits(exposed: dict[tuple[int, int], int], ranks: list[RankDigest], matched: list[Matched]) -> None:
    """Each collective's exposed time less its exposed wait for the last rank: the transfer part
    MFU001 speaks of (the wait is MFU005's straggler time, measured on the same waitable runs)."""
    waiting: dict[int, list[Matched]] = defaultdict(list)
    for m in matched:
        if m.wait_ns > 0:
            waiting[m.call.file_id].append(m)
    for r in ranks:
        ms = waiting.get(r.file_id)
        if not ms:
            continue
        start = np.asarray([m.call.ts_ns for m in ms], np.int64)
        waited = covered_ns(start, start + np.asarray([m.wait_ns for m in ms], np.int64),
                            r.waitable.start_ns, r.waitable.end_ns)
        for m, w in zip(ms, waited.tolist(), strict=True):
            key = (r.file_id, m.call.act)
            if key in exposed:
                exposed[key] = max(exposed[key] - w, 0)


def _conv_mask_note(con: duckdb.DuckDBPyConnection, ranks: list[RankDigest]) -> str | None:
    """How many convolution backward ops with shapes record no output_mask (no Concrete Inputs, or
    them turned off), whose FLOPs are then counted for both gradients (knowledge/flops.py): the
    executed FLOPs a user re-derives depend on it. Asked of the store: one query over the run."""
    ids = store.id_set(r.file_id for r in ranks)
    n = con.execute(f"SELECT count(*) FROM cpu_ops WHERE file_id IN ({ids}) AND name = 'aten::convolution_backward' "
                    "AND input_dims IS NOT NULL AND coalesce(args->'Concrete Inputs'->>10, '') = ''").fetchall()[0][0]
    if not n:
        return None
    return (f"{n} aten::convolution_backward op{'s' if n > 1 else ''} record no output_mask (no Concrete Inputs): "
            "counted as computing both the input and the weight gradient, each its forward's FLOPs; a first layer "
            "computes only the weight's, so executed FLOPs (HFU) count one forward more for it, model FLOPs (3 × "
            "forward) none")


def _unknown_kernels_note(ranks: list[RankDigest], top: int = 5) -> str | None:
    """How much kernel time no row of data/kernels.toml names (counted as `other`), and the top names."""
    unknown = dtype_mix.summed(r.unknown_kernel_ns for r in ranks)
    total = sum(r.kernel_ns for r in ranks)
    if not unknown or not total:
        return None
    ranked = sorted(unknown.items(), key=lambda x: -x[1])
    names = "; ".join(f"{kernels.head(n)[:80]} {ns / total:.1%}" for n, ns in ranked[:top])
    return (f"{len(unknown)} kernel names ({sum(unknown.values()) / total:.1%} of kernel time) match no pattern in "
            f"diag/knowledge/data/kernels.toml and count as non-matmul ('other'); top: {names}")


HOST_NOTE = (
    "CPU-only trace (no GPU activity): the host timeline stands in for the GPU's — compute = inside "
    "aten ops, communication = inside gloo collectives, idle = neither; matmul = inside the innermost op "
    "of each GEMM, convolution or attention op tree, whose FLOPs come from its shapes; "
)
HOST_MFU = {
    False: "MFU needs a peak, and there is no GPU to take one from: pass --peak-tflops with the CPU's",
    True: "MFU = Σ model FLOPs ÷ (Σ step windows × the --peak-tflops given), over the analyzed steps",
}
# A trace that lists GPUs (deviceProperties) yet holds no GPU activity: a capture of CPU activities
# only on a GPU machine, or of CUPTI's range profiler (counters per range, no kernel timeline). The
# GPUs ran; the trace did not record them.
UNRECORDED_GPU_NOTE = (
    "no GPU activity recorded, though the trace lists {gpu}: captured without CUDA activities, or as CUPTI "
    "profiler ranges; the host timeline stands in for the GPU's — compute = inside aten ops, communication = "
    "inside collectives, idle = neither — and MFU is not reported: capture with "
    "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] for the GPU's timeline"
)


def _listed_gpu(ranks: list[RankDigest]) -> str | None:
    """The GPU a host-timeline trace's deviceProperties name (the part, where the table knows it)."""
    for r in ranks:
        if r.device_props and isinstance(name := r.device_props.get("name"), str):
            ident = hardware.identify(r.device_props)
            return ident.part.name if ident else name
    return None


def _host_peak(ranks: list[RankDigest], opts: AnalyzeOptions) -> Peak:
    """No GPU activity: there is no part's peak to measure against, whatever --gpu says. A GPU the
    trace lists is named, but no part is taken from it (nothing is measured against it). On a
    CPU-only run, --peak-tflops is the host's peak: MFU is the FLOPs its matmul ops did over the step
    against it (issue 36), a figure anyone can check from the FLOPs per step and the step time."""
    gpu = _listed_gpu(ranks)
    dtype = _gemm_dtype(ranks) or "fp32"
    if gpu is None and opts.peak_tflops is not None:
        return Peak(opts.peak_tflops, None, None, dtype,
                    f"--peak-tflops {number(opts.peak_tflops)}, the host's peak as given (no GPU in the trace)",
                    opts.peak_tflops, None, None)
    source = "no GPU activity in the trace: MFU not applicable" if gpu else \
        "no GPU in the trace and no --peak-tflops: MFU unknown"
    return Peak(None, None, gpu, dtype, source, opts.peak_tflops, None, None)


def _hip_runtime(con: duckdb.DuckDBPyConnection, ranks: list[RankDigest]) -> bool:
    """Whether the trace's runtime calls are HIP's (hipLaunchKernel, hipExtModuleLaunchKernel...):
    an AMD GPU, where nothing else names the part. Asked only then: one query over the run."""
    ids = store.id_set(r.file_id for r in ranks)
    return bool(con.execute(f"SELECT count(*) FROM (SELECT 1 FROM runtime_calls WHERE file_id IN ({ids}) "
                            "AND name LIKE 'hip%' LIMIT 1)").fetchall()[0][0])


def resolve_peak(ranks: list[RankDigest], opts: AnalyzeOptions, hip: Callable[[], bool] = lambda: False) -> Peak:
    part, how = _part(ranks, opts)
    mix = dtype_mix.run_mix(ranks, part, _shape_coverage(ranks) >= MIN_SHAPE_COVERAGE)
    dtype = mix.dominant
    user = opts.peak_tflops
    if part is not None:
        shares, left_out = mix.priced(part)
        why = "; ".join(filter(None, (how, mix.basis)))
        if shares:
            dense = hardware.effective_peak_tflops(part, shares)
            src = f"{part.name} {dtype_mix.describe(part, shares)} ({why})"
            if left_out:
                src += f"; {', '.join(left_out)} left out: under {dtype_mix.NEGLIGIBLE_SHARE:.0%} of FLOPs, no peak on this part"
            if user is not None and not hardware.sparse_peak_matches(user, dtype=dtype) and abs(user - dense) > 1e-9:
                dense, src = user, f"--peak-tflops {number(user)} (the part's figure is {src})"
            return Peak(dense, part.key, part.name, dtype, src, user, part.hbm_gbps, part.nvlink_gbps,
                        shares, part.dense_tflops.get("bf16"))
        if user is None:
            missing = ", ".join(f"{d} ({mix.shares[d]:.0%})" for d in left_out)
            return Peak(None, part.key, part.name, dtype,
                        f"{part.name} has no dense peak in its datasheet for {missing} of the matmul FLOPs "
                        f"({why}): MFU unknown; pass --peak-tflops", None, part.hbm_gbps, part.nvlink_gbps,
                        dict(mix.shares))
    if user is not None:
        sparse = hardware.sparse_peak_matches(user, dtype=dtype)
        tflops = user / 2 if sparse else user
        src = f"--peak-tflops {number(user)}" + (" (a 'with sparsity' figure: halved to the dense peak)" if sparse else "")
        p = sparse[0][0] if sparse else None
        return Peak(tflops, p.key if p else None, p.name if p else None, dtype,
                    f"{src} ({mix.basis})" if mix.basis else src, user,
                    p.hbm_gbps if p else None, p.nvlink_gbps if p else None, dict(mix.shares))
    # A name as text only: a number there (a damaged trace) made the report's device.name a float.
    name = next((n for r in ranks if r.device_props and isinstance(n := r.device_props.get("name"), str)), None)
    gfx = next((r.isa for r in ranks if r.isa), None) if name is None else None
    if gfx is not None and (said := isa.describe(gfx, dtype)) is not None:
        # No deviceProperties (older ROCm captures): the ISA in kernel names gives the family and
        # its range of peaks, not the part: MFU stays unknown until --gpu pins it.
        return Peak(None, None, f"AMD {isa.families()[gfx].family}, {gfx}", dtype,
                    f"no device properties in the trace; {said}: MFU unknown", None, None, None, dict(mix.shares))
    if name is None and hip():
        amd = ", ".join(k for k, p in sorted(hardware.PARTS.items()) if p.vendor == "amd")
        return Peak(None, None, "AMD GPU (HIP runtime)", dtype,
                    "no device properties in the trace, and no ISA in its kernel names; the runtime calls are HIP's: "
                    f"an AMD GPU of unknown family: MFU unknown; pass --gpu ({amd}) or --peak-tflops", None, None, None,
                    dict(mix.shares))
    return Peak(None, None, name, dtype,
                f"unknown part {name!r}: MFU unknown; pass --gpu or --peak-tflops" if name else
                "no device properties in the trace: MFU unknown; pass --gpu or --peak-tflops", None, None, None,
                dict(mix.shares))


def _part(ranks: list[RankDigest], opts: AnalyzeOptions) -> tuple[hardware.Part | None, str]:
    """The part (from --gpu, else the first rank whose device properties identify one) and how."""
    if opts.gpu:
        return gpu_part(opts.gpu), f"--gpu {opts.gpu}"
    for r in ranks:
        if r.device_props and (ident := hardware.identify(r.device_props)):
            return ident.part, ident.reason
    return None, ""


def _gemm_dtype(ranks: list[RankDigest]) -> str | None:
    """The dtype most GEMM FLOPs ran in (fp32 tensors on TF32 tensor-core kernels count as tf32)."""
    weight: dict[str, float] = defaultdict(float)  # dtype → FLOPs
    for r in ranks:
        for d, f in r.gemm_dtype_flops.items():
            weight[d] += f
    return max(weight, key=lambda d: weight[d]) if weight else None


INFERENCE_NOTE = (
    "inference: no backward pass in the trace (no autograd or optimizer op, no backward kernel), so model "
    "FLOPs are one forward pass and training advice (gradient buckets, recomputation) does not apply"
)


def _model_flops(
    ranks: list[RankDigest], states: dict[tuple[int, int], StepStates],
    spec: model_mod.ModelSpec | None, world: int, workload: str,
) -> str:
    """Fill each rank-step's model FLOPs; returns how they were obtained. Training runs the forward
    pass and a backward of twice its FLOPs (PaLM App. B: 6N = 3 × 2N); inference the forward only."""
    inference = workload == "inference"
    if spec is not None and spec.tokens_per_step:
        per_token = model_mod.flops_per_token(spec) / (3 if inference else 1)
        per_rank = spec.tokens_per_step * per_token / max(world, 1)
        for k, st in states.items():
            states[k] = _with_model(st, per_rank)
        formula = "(6N + 12·L·H·Q·T) ÷ 3, one forward pass" if inference else "(6N + 12·L·H·Q·T)"
        return (f"model FLOPs from {spec.name}: {formula} = {per_token:.4g} "
                f"FLOPs/token × {spec.tokens_per_step:g} tokens/step ÷ {world} GPUs")
    note = ("model FLOPs inferred from the trace: the matmul and attention FLOPs from op shapes (inference: "
            "one forward pass)" if inference else
            "model FLOPs inferred from the trace: 3 × the forward matmul and attention FLOPs from op shapes")
    if spec is not None:
        note += f" ({spec.name} gives no tokens_per_step: pass --tokens-per-step)"
    covered = _shape_coverage(ranks)
    if covered < MIN_SHAPE_COVERAGE:
        # Kernels without FLOPs would make the inferred FLOPs, and so the MFU, a silent
        # underestimate: the point is left unknown (mfu_range bounds it where some are known).
        for k, st in states.items():
            states[k] = _with_model(st, None)
        why = f"only {_coverage_why(ranks)}" if any(r.matmul_ns for r in ranks) else "no GEMM or attention kernel ran"
        return f"{note}: {why}, so model FLOPs and MFU are unknown; pass --model with tokens_per_step"
    for k, st in states.items():
        # Inference has no backward to tell forward ops from: every matmul FLOP executed in the step
        # is the model's (ops outside any ProfilerStep span are phase `other`, not `forward`).
        states[k] = _with_model(st, st.exec_flops if inference else 3.0 * st.fwd_flops)
    return note


# Above this, model FLOPs cannot have run in the measured time even at the dense peak (allowing for
# boost clocks over the datasheet): the model description is not this run's.
IMPOSSIBLE_MFU = 1.5

# Below this share of GEMM/attention kernel time with FLOPs from shapes, inferred FLOPs are not trusted.
MIN_SHAPE_COVERAGE = 0.9


def _shape_coverage(ranks: list[RankDigest]) -> float:
    total = sum(r.matmul_ns for r in ranks)
    return sum(r.matmul_with_flops_ns for r in ranks) / total if total else 0.0


def _coverage_why(ranks: list[RankDigest], top: int = 4) -> str:
    """'70% of GEMM/attention kernel time has FLOPs from op shapes; the rest: ...', each reason
    (digest.unshaped_why) with its share of GEMM/attention kernel time, largest first."""
    total = sum(r.matmul_ns for r in ranks)
    why = sorted(dtype_mix.summed(r.unshaped_ns_by_why for r in ranks).items(), key=lambda x: -x[1])
    named = "; ".join(f"{w if w in (NO_LAUNCH, NO_OP, GRAPH) else f'under {w}'} {ns / total:.0%}"
                      for w, ns in why[:top])
    more = f"; {len(why) - top} more" if len(why) > top else ""
    return (f"{_shape_coverage(ranks):.0%} of GEMM/attention kernel time has FLOPs from op shapes; the rest: "
            f"{named}{more}")


def mfu_range(ranks: list[RankDigest], states: dict[tuple[int, int], StepStates], peak: Peak,
              workload: str) -> tuple[float, float] | None:
    """MFU bounds when only part of GEMM/attention time has FLOPs from shapes (issue 36): lower, the
    shaped FLOPs alone; upper, adding each step's unshaped GEMM/attention time at the rate the
    shaped kernels achieved (Σ their FLOPs ÷ Σ their time). None when nothing is shaped or no peak."""
    shaped_ns = sum(r.matmul_with_flops_ns for r in ranks)
    if peak.flops_per_s is None or not shaped_ns:
        return None
    rate = sum(r.matmul_flops for r in ranks) / shaped_ns   # FLOPs per ns
    by_file = {r.file_id: r for r in ranks}
    lower, upper = {}, {}
    for (f, i), st in states.items():
        flops = st.exec_flops if workload == "inference" else 3.0 * st.fwd_flops
        unshaped = by_file[f].unshaped_ns_by_step
        lower[(f, i)] = _with_model(st, flops)
        upper[(f, i)] = _with_model(st, flops + rate * (unshaped[i] if i < len(unshaped) else 0))
    lo, hi = _utilization(lower, peak)[0], _utilization(upper, peak)[0]
    return None if lo is None or hi is None else (lo, hi)


def _with_model(st: StepStates, flops: float | None) -> StepStates:
    return replace(st, model_flops=flops)


def _ledger(r: RankDigest, i: int, st: StepStates, peak: Peak, rules: list[Rule[Any]]) -> StepLedger:
    lg = StepLedger.open(r.rank, st)
    # Claims that belong to no rule: model FLOPs at the peak (this bucket over the step is the
    # MFU) and the GPU starved by the host. host_bound and dataloader time are disjoint by
    # construction (states.py), so their order does not matter.
    if peak.flops_per_s is not None and st.model_flops is not None:
        lg.claim("model_compute", st.model_flops / peak.flops_per_s, ("matmul", "non_matmul"))
    lg.claim("host_bound", st.host_bound_ns * 1e-9, ("idle",))
    ctx = StepContext(r, i, st, peak)
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
    # Σ FLOPs ÷ (Σ windows × peak): the model FLOPs/s of the analyzed time (DESIGN.md), which is the
    # ledger's model_compute share (time-weighted), not a mean of per-step ratios that a slow step
    # would count as much as a fast one.
    at_peak = sum(st.window_ns for st in vals) * 1e-9 * peak.flops_per_s
    model = sum(st.model_flops or 0.0 for st in vals)
    return model / at_peak, (model + sum(st.recompute_flops for st in vals)) / at_peak
