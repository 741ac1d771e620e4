"""The report: the `diag.report/1` document (DESIGN.md contract) and its text and Markdown renderings.

Computing is in engine.py; this module only shapes and renders.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from diag import __version__
from diag.attribution.critical_path import report_entry
from diag.attribution.ledger import BUCKETS, StepLedger, weighted_share
from diag.attribution.what_if import what_if_words
from diag.attribution.workload_mix import FEATURES
from diag.engine.run import Analysis
from diag.runtime.durations import duration, flop_count, number, percent, ranks_traced
from diag.runtime.sanitize import markdown, terminal

SCHEMA = "diag.report/1"
_BAR = 40


def build_report(a: Analysis) -> dict[str, Any]:
    run = a.run
    lgs = run.ledgers
    by_rank: dict[int, list[StepLedger]] = defaultdict(list)
    by_step: dict[int, list[StepLedger]] = defaultdict(list)
    rank_windows: dict[int, list[float]] = defaultdict(list)
    for lg in lgs:
        by_rank[lg.rank].append(lg)
        by_step[lg.step].append(lg)
        rank_windows[lg.rank].append(lg.window_s)
    windows = [lg.window_s for lg in lgs]
    rank_time = {r: statistics.fmean(w) for r, w in rank_windows.items()}
    rank_mean = {r: _mean(v) for r, v in by_rank.items()}   # once: 10,000 ranks took 0.5 s a pass
    worst = min(rank_mean, key=lambda r: (rank_mean[r]["model_compute"], -rank_time[r])) if rank_mean else None
    return {
        "schema": SCHEMA,
        "diag_version": __version__,
        "world_size": run.world_size,
        "ranks": sorted(by_rank),
        "steps": len(by_step),
        "timeline": "host" if any(r.host_timeline for r in run.ranks) else "gpu",
        "workload": run.workload,
        # What the run is and what it already uses, by its kernel and op names (workload_mix.py).
        "workload_family": {"family": run.family.family, "evidence": run.family.evidence,
                            "uses": sorted(f for f in FEATURES if run.uses(f))},
        "steps_excluded": [{"rank": rank, "step": step, "why": why} for rank, step, why in run.steps_excluded],
        "device": {"name": run.peak.part_name, "part": run.peak.part_key, "peak_tflops": run.peak.tflops,
                   "dtype": run.peak.dtype, "dtype_mix": dict(run.peak.dtype_mix), "peak_source": run.peak.source,
                   # share of summed kernel durations launched by CUDA/HIP graphs (additive)
                   "graph_kernel_fraction": _ratio(sum(r.graph_kernel_ns for r in run.ranks),
                                                   sum(r.kernel_ns for r in run.ranks))},
        "step_time_s": statistics.median(windows) if windows else None,
        # additive: `mean`, the rank-steps' mean window: the MFU is model FLOPs per rank-step ÷ (it × peak)
        "step_time_spread_s": {"min": min(windows), "median": statistics.median(windows), "max": max(windows),
                               "mean": statistics.fmean(windows)} if windows else None,
        "mfu": run.mfu,
        "mfu_bf16": run.peak.mfu_bf16(run.mfu),
        "hfu": run.hfu,
        # additive (issue 36): the share of GEMM/attention time whose FLOPs are known, and the MFU's
        # bounds where that is under 0.9 and `mfu` is null (docs/mfu.md)
        "flops_coverage": run.flops_coverage,
        "mfu_range": None if run.mfu_range is None else list(run.mfu_range),
        # additive (issue 36): matmul/conv/attention FLOPs from op shapes per step, mean over the
        # rank-steps the MFU is averaged over: `model` is what MFU counts (training: 3 × `forward`;
        # null where coverage is too low), `executed` every FLOP the shaped ops did (HFU's)
        "flops_per_step": _flops_per_step(run),
        "ledger": _mean(lgs),
        "ledger_by_rank": {str(r): m for r, m in sorted(rank_mean.items())},
        "ledger_by_step": {str(s): _mean(v) for s, v in sorted(by_step.items())},
        "ledger_median_over_steps": {b: statistics.median(_mean(v)[b] for v in by_step.values()) for b in BUCKETS}
        if by_step else {},
        "worst_rank": None if worst is None else {"rank": worst, "step_time_s": rank_time[worst],
                                                  "ledger": rank_mean[worst]},
        "findings": [_finding(f) for f in a.findings],
        "clock_offsets_us": {str(r): o.offset_ns / 1000 if o.linked else None for r, o in sorted(run.offsets.items())},
        "clock_offset_spread_us": {str(r): o.spread_ns / 1000 for r, o in sorted(run.offsets.items())},
        "clock_offset_residual_us": {str(r): o.residual_ns / 1000 for r, o in sorted(run.offsets.items())},
        "clock_offset_residual_max_us": {str(r): o.residual_max_ns / 1000 for r, o in sorted(run.offsets.items())},
        "model": None if a.model is None else {"name": a.model.name, "params": a.model.params,
                                               "tokens_per_step": a.model.tokens_per_step},
        "flops_source": a.flops_source,
        "notes": run.notes,
        "critical_path": [report_entry(p) for p in a.critical_path],
        "parallelism": None if run.mesh is None else run.mesh.as_report(),
    }


def _flops_per_step(run: Any) -> dict[str, float | None] | None:
    states = [st for st in run.states.values() if st.window_ns > 0]
    if not states:
        return None
    model = [st.model_flops for st in states]
    return {"model": None if any(f is None for f in model) else statistics.fmean(f or 0.0 for f in model),
            "forward": statistics.fmean(st.fwd_flops for st in states),
            "executed": statistics.fmean(st.exec_flops for st in states)}


MESH_HEADER = ["dimension", "description", "groups", "size", "hosts", "link", "exposed (MFU pts)"]


def mesh_rows(r: dict[str, Any]) -> list[list[str]]:
    """The report's process groups as a table (HTML, TUI): one row per dimension, description, size,
    hosts and link, with how many groups share it and MFU001's exposed points for that dimension."""
    p = r.get("parallelism") or {}
    by_dim = next((f["details"].get("by_dim") or {} for f in r["findings"] if f["code"] == "MFU001"), {})
    count: dict[tuple[str, str, str, str, str], int] = defaultdict(int)
    for g in p.get("groups") or []:
        count[(g["dim"], g["desc"] or "", _text(g["size"]), _text(g["hosts"]), g["link"] or "unknown")] += 1
    return [[dim, desc, str(n), size, hosts, link, f"{by_dim[dim] * 100:.1f}" if dim in by_dim else ""]
            for (dim, desc, size, hosts, link), n in count.items()]


def mesh_line(r: Mapping[str, Any]) -> str | None:
    """The parallel layout in one line, 'mesh: dp 4 × tp 2 × pp 2 (fsdp), TP group spans 2 hosts', from
    the report's `parallelism` block; None where the mesh is not known: no process group in the
    trace, or no dimension wider than one. Degrees the trace does not settle (not in `certain`) are
    said to be inferred."""
    p = r.get("parallelism")   # absent from reports of earlier versions (gate baselines)
    if not p or not p.get("groups"):
        return None
    wide = [d for d, n in p["dims"].items() if n and n > 1]
    degrees = [f"{d} {p['dims'][d]}" for d in wide]
    guessed = [d for d in wide if d not in (p.get("certain") or [])]
    sharding = p.get("sharding")
    if not degrees and sharding in (None, "none"):
        return None
    line = "mesh: " + (" × ".join(degrees) or "one rank per group") + (
        f" ({sharding})" if sharding not in (None, "none") else "")
    spans: dict[str, int] = {}
    for g in p.get("groups") or []:   # the dimensions that should stay on one host (MFU014), widest first
        if g["dim"] in ("tp", "cp", "ep") and g["hosts"] and g["hosts"] > 1:
            spans[g["dim"]] = max(spans.get(g["dim"], 0), g["hosts"])
    line += "".join(f", {d.upper()} group spans {n} hosts" for d, n in spans.items())
    return line + (f" ({', '.join(guessed)} inferred from traffic)" if guessed else "")


def _text(x: object) -> str:
    return "?" if x is None else str(x)


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _mean(lgs: list[StepLedger]) -> dict[str, float]:
    """Each bucket's share of the rank-steps' summed windows: a time-weighted mean, so that
    `model_compute` is Σ model FLOPs ÷ (Σ windows × peak), the MFU."""
    return {b: weighted_share(lgs, b) for b in BUCKETS}


def _finding(f: Any) -> dict[str, Any]:
    return {
        "code": f.code, "slug": f.slug, "severity": f.severity, "bucket": f.bucket, "lost_fraction": f.lost_fraction,
        "recoverable_fraction": f.recoverable_fraction, "lost_s": f.lost_s, "mfu_points": f.mfu_points, "what_if_mfu": f.what_if_mfu, "what_if_mfu_naive": f.what_if_mfu_naive, "ranks": f.ranks,
        "steps": f.steps, "evidence": f.evidence, "advice": f.advice, "summary": f.summary, "details": f.details,
    }


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=_jsonable)


def _jsonable(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON: {type(o).__name__}")


def peak_label(d: Mapping[str, Any]) -> str:
    """The report's `device` in words: 'dense bf16 peak 989 TFLOP/s', or with a dtype mix
    'effective peak 1484 TFLOP/s (matmul FLOPs fp8 67%, bf16 33%)'."""
    mix = d.get("dtype_mix") or {}
    if d["peak_tflops"] is None:
        return "unknown peak"
    if len(mix) > 1:
        shares = ", ".join(f"{dt} {s:.0%}" for dt, s in mix.items())
        return f"effective peak {d['peak_tflops']:.4g} TFLOP/s (matmul FLOPs {shares})"
    return f"dense {d['dtype']} peak {number(d['peak_tflops'])} TFLOP/s"


def _header(r: dict[str, Any], name: Any = str) -> list[str]:
    """The report's first lines; `name` escapes the device's name for the sink (sanitize.py)."""
    d = r["device"]
    peak, gpu = peak_label(d), "unknown GPU"
    if r.get("timeline") == "host":   # a trace with no GPU activity names the GPU it lists, if any
        peak = ("no GPU activity recorded" if d["name"] else "CPU-only run") + ": host timeline in place of the GPU's, " + \
            (f"MFU against --peak-tflops {number(d['peak_tflops'])}" if d["peak_tflops"] is not None else "no MFU")
        gpu = "no GPU"
    st = r["step_time_s"]
    ranks = ranks_traced(len(r["ranks"]), r["world_size"])
    spread = r.get("step_time_spread_s")   # absent from reports of earlier versions (gate baselines)
    over = "median"
    if spread and spread["min"] < spread["max"]:
        mean = f"mean {duration(spread['mean'])}, " if spread.get("mean") is not None else ""
        over = f"median; {mean}min {duration(spread['min'])}, max {duration(spread['max'])}"
    lines = [
        f"{ranks} × {r['steps']} steps · {r.get('workload', 'training')} · {name(d['name'] or gpu)} · {peak}",
        f"step time {duration(st)} ({over})   MFU {mfu_words(r)}   HFU {percent(r['hfu'])}{_bf16(r)}{_flops(r)}"
        if st is not None else "no steps",
    ]
    excluded = r.get("steps_excluded") or []
    if excluded:
        lines.append(f"{len(excluded)} step(s) left out of the means as warm-up or teardown (see notes)")
    return lines


def mfu_words(r: Mapping[str, Any]) -> str:
    """The MFU, or where only part of GEMM time has FLOPs its range: '12.1–17.3% (FLOPs of 70% of GEMM time)'."""
    bounds = r.get("mfu_range")   # absent from reports of earlier versions (gate baselines)
    if r["mfu"] is not None or not bounds:
        return percent(r["mfu"])
    return (f"{percent(bounds[0]).removesuffix('%')}–{percent(bounds[1])} (FLOPs of {percent(r['flops_coverage'])} "
            "of GEMM time)")


def _flops(r: Mapping[str, Any]) -> str:
    """On a host timeline, the FLOPs per step the MFU is made of (or would be, given a peak): no GPU
    peak puts them in context there, and MFU = model ÷ (step time × peak) is checkable by hand."""
    f = r.get("flops_per_step")   # absent from reports of earlier versions
    if r.get("timeline") != "host" or not f or not f["executed"]:
        return ""
    model = "unknown" if f["model"] is None else flop_count(f["model"]) + (
        f" (3 × forward {flop_count(f['forward'])})" if r.get("workload") == "training" else "")
    return f"   FLOPs/step: model {model}, executed {flop_count(f['executed'])}"


def _bf16(r: dict[str, Any]) -> str:
    return "" if r.get("mfu_bf16") is None else f"   (MFU {percent(r['mfu_bf16'])} against the bf16 peak)"


# The waterfall's row for GEMM/attention time when model FLOPs are unknown: not a loss (issue 36).
UNSPLIT = "matmul, FLOPs unknown"


def _waterfall(r: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(label, MFU points) from the peak down to the achieved MFU: losses largest first. With the
    MFU unknown, gemm_inefficiency holds all GEMM/attention time, model compute included: it is
    no loss, and `unsplit_points` gives it instead."""
    led = r["ledger"]
    shown = [b for b in BUCKETS if b != "model_compute" and not (b == "gemm_inefficiency" and r["mfu"] is None)]
    losses = sorted(((b, led[b] * 100) for b in shown), key=lambda x: -x[1])
    return [(b, p) for b, p in losses if p >= 0.05]


def unsplit_points(r: Mapping[str, Any]) -> float | None:
    """Points of GEMM/attention time not split into model compute and loss (the MFU unknown)."""
    points = r["ledger"]["gemm_inefficiency"] * 100
    return points if r["mfu"] is None and points >= 0.05 else None


def _worst(r: dict[str, Any]) -> str:
    w = r["worst_rank"]
    top = max((b for b in BUCKETS if b != "model_compute"), key=lambda b: w["ledger"][b])
    return (f"  worst rank: {w['rank']} (model_compute {w['ledger']['model_compute'] * 100:.1f}, "
            f"step {duration(w['step_time_s'])}, most lost to {top} {w['ledger'][top] * 100:.1f})")


def _mfu_points(r: dict[str, Any]) -> str:
    if r["mfu"] is not None:
        return f"{r['ledger']['model_compute'] * 100:.1f}"
    bounds = r.get("mfu_range")
    return f"{bounds[0] * 100:.1f}–{bounds[1] * 100:.1f}" if bounds else "unknown"


def _of(f: dict[str, Any]) -> str:
    """Which bucket a finding explains and how much of it a fix can win (where that is less)."""
    if f["bucket"] is None:
        return ""
    win = f["recoverable_fraction"] * 100
    gain = f", {win:.1f} recoverable" if abs(win - f["mfu_points"]) >= 0.05 else ""
    return f" of {f['bucket']}{gain}"


def path_line(r: Mapping[str, Any]) -> str:
    """Which rank and which kind of time hold the most of the critical path, mean over the steps
    the means keep (a step every rank left out as warm-up or teardown is not among them)."""
    left_out: dict[int, set[int]] = defaultdict(set)   # step → the ranks that left it out
    for e in r["steps_excluded"]:
        left_out[e["step"]].add(e["rank"])
    paths = [p for p in r["critical_path"] if len(left_out[p["step"]]) < len(r["ranks"])] or r["critical_path"]
    share: dict[str, dict[str, float]] = {}
    for key in ("by_rank", "by_kind"):
        total: dict[str, float] = defaultdict(float)
        for p in paths:
            for k, v in p["summary"][key].items():
                total[k] += v / len(paths)
        share[key] = total
    if not share["by_rank"] or not share["by_kind"]:
        return ""   # steps whose paths hold no segment (the bench trace's repeated steps): nothing to say
    rank, kind = (max(share[k], key=lambda x: share[k][x]) for k in ("by_rank", "by_kind"))
    return (f"critical path: rank {rank} holds {share['by_rank'][rank]:.0%} of it, {kind} {share['by_kind'][kind]:.0%} "
            f"(mean over {len(paths)} step{'' if len(paths) == 1 else 's'}; docs/critical_path.md)")


def render_text(r: dict[str, Any]) -> str:
    lines = ["diag — where the step went", *_header(r)]
    if mesh := mesh_line(r):
        lines.append(mesh)
    lines.append("")
    lines.append("waterfall (MFU points, mean over ranks and steps)")
    lines.append(f"  {'peak':<22}{100.0:>7.1f}")
    for b, p in _waterfall(r):
        lines.append(f"  − {b:<20}{p:>7.1f}  {'█' * max(1, round(p / 100 * _BAR))}")
    if (unsplit := unsplit_points(r)) is not None:
        lines.append(f"  ? {UNSPLIT:<20}{unsplit:>{27 - max(20, len(UNSPLIT))}.1f}  "
                     f"{'░' * max(1, round(unsplit / 100 * _BAR))}")
    lines.append(f"  = {'model_compute (MFU)':<20}{_mfu_points(r):>7}")
    if r["worst_rank"] is not None and len(r["ranks"]) > 1:
        lines.append(_worst(r))
    if r["critical_path"] and (line := path_line(r)):
        lines.append(line)
    lines.append("")
    if r["findings"]:
        lines.append("findings, by what a fix can win")
        for i, f in enumerate(r["findings"], 1):
            wi = (f" → MFU {percent(f['what_if_mfu'])} {what_if_words(f['code'])}"
                  if f["what_if_mfu"] is not None and f["lost_fraction"] else "")
            lines.append(f" {i}. {f['code']} {f['slug']} [{f['severity']}] {f['mfu_points']:.1f} pts{_of(f)}{wi}")
            lines.append(f"    {f['summary']}")
            lines.append(f"    do: {f['advice']}")
    else:
        lines.append("no findings above their thresholds")
    if r["notes"]:
        lines.append("")
        lines.extend(f"note: {n}" for n in r["notes"])
    # Names (kernels, ops, groups, files) are in the findings' lines and the notes: each line is
    # made inert for a terminal and a CI log as a whole (our own text has nothing to escape).
    return "\n".join(map(terminal, lines)) + "\n"


def render_markdown(r: dict[str, Any]) -> str:
    h = _header(r, markdown)
    mesh = mesh_line(r)
    out = ["# diag report", "", f"**{h[0]}**  ", h[1] + ("  " if mesh else ""), *([markdown(mesh)] if mesh else []),
           "", "## Where the step went", "",
           "| | MFU points |", "|---|---:|", f"| peak | {100.0:.1f} |"]
    out += [f"| − {b} | {p:.1f} |" for b, p in _waterfall(r)]
    if (unsplit := unsplit_points(r)) is not None:
        out.append(f"| ? {UNSPLIT} | {unsplit:.1f} |")
    out += [f"| **= MFU** | **{_mfu_points(r).strip()}** |", ""]
    if r["worst_rank"] is not None and len(r["ranks"]) > 1:
        out += [_worst(r).strip().capitalize(), ""]
    out += ["## Findings", ""]
    if not r["findings"]:
        out.append("No findings above their thresholds.")
    for f in r["findings"]:
        out += [f"### {f['code']} {f['slug']} — {f['severity']}, {f['mfu_points']:.1f} points{_of(f)}", "",
                markdown(f["summary"]), "", f"**What to do:** {markdown(f['advice'])}", ""]
        if f["ranks"]:
            out.append(f"Ranks: {', '.join(map(str, f['ranks'][:32]))}{' …' if len(f['ranks']) > 32 else ''}  ")
        if f["what_if_mfu"] is not None and f["lost_fraction"]:
            out.append(f"{what_if_words(f['code']).capitalize()}: MFU {percent(f['what_if_mfu'])}")
        out.append("")
    if r["notes"]:
        out += ["## Notes", ""] + [f"- {markdown(n)}" for n in r["notes"]]
    return "\n".join(out) + "\n"


def render(report: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return to_json(report) + "\n"
    if fmt == "markdown":
        return render_markdown(report)
    return render_text(report)
