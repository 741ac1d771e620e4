"""MFU010 host-bound."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

import msgspec
import numpy as np

from diag.attribution.analysis import Finding, RankContext, RunContext, severity
from diag.attribution.host_parts import LONG_GAP_NS, NO_SPAN, HostParts, host_parts
from diag.runtime.durations import duration
from diag.timeline.columns import numpy_of
from diag.timeline.nesting import overlapped, points_within
from rules.base import Rule

# Launch calls a rank's digest keeps for the median CPU time per launch: all of them up to this
# many, else this many spread evenly over the capture.
LAUNCH_SAMPLE = 5000


def _spread(values: np.ndarray, n: int) -> np.ndarray:
    """`values`, or `n` of them evenly spaced from first to last. The first `n` would describe only
    the start of the capture: param's resnet trace read 7.0 µs per launch that way, against the
    9 µs median of all its 10,113 launches."""
    if len(values) <= n:
        return values
    return values[np.linspace(0, len(values) - 1, n).round().astype(np.int64)]


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01
    # A kernel shorter than a launch call (~5-8 µs of cudaLaunchKernel) cannot be fed by eager
    # launches one after another: the 10 µs.
    tiny_kernel_us: float = 10.0
    top_syncs: int = 5
    top_names: int = 5


# Why the host had not launched yet, by what was on the host when the GPU ran dry.
CAUSES = {
    "sync": "the host waited in a synchronizing call, then relaunched into an empty GPU",
    "optimizer": "inside the optimizer step (host-side optimizer work)",
    "between_steps": "between steps (Python at the step boundary: logging, loss.item(), the loader handoff)",
    "launch": "launching: eager kernels shorter than their launch calls",
    "python": "in Python between launches: the host takes longer per op than the GPU",
}


# What the launching thread did during the host-bound part of each gap, by the innermost span
# there at each instant (a sync call is the cause only for the time the call itself lasted).
PARTS = {
    "sync_wait": "waiting in synchronizing calls",
    "python": "in Python between ops",
    "dispatch": "in framework dispatch (op time outside child ops and launches)",
    "launch": "in launch API calls",
    "dataloader": "in data-loading code on the launching thread",
    "other": "with nothing recorded on the launching thread",
}
# Dispatch per launch this long is not eager overhead but one-off work inside ops (allocation,
# autotuning, first calls): the shared traces' steady-state runs show 3.7-131 µs per launch, HTA's
# alexnet and simple_add captures (cuDNN autotuning in their one step) 376-410 ms.
ONE_OFF_US = 1000.0


class HostBoundDigest(msgspec.Struct):
    gap_ns: dict[str, int]                      # cause → host-bound gap time (shares of the bucket)
    syncs: Counter[tuple[str, str, str]] = msgspec.field(default_factory=Counter)   # (call, op, caller) → gaps after it
    sync_ns: Counter[tuple[str, str, str]] = msgspec.field(default_factory=Counter)
    launches: int = 0
    tiny: int = 0
    kernels: int = 0
    # CPU time per launch call (a sample, LAUNCH_SAMPLE): an array, 8 bytes a value where a list
    # of floats took 32, held for every rank until the findings
    launch_us: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0))
    between_steps_us: list[float] = msgspec.field(default_factory=list)
    steps: int = 0
    evidence: list[str] = msgspec.field(default_factory=list)
    parts: HostParts | None = None


class HostBound(Rule[Params]):
    """The GPU ran dry waiting for the host to launch.

    What it finds: the `host_bound` bucket — GPU idle time before the launch call of the next GPU
    activity returned — split by what the thread that made that call was doing, instant by instant
    (`details.parts`): waiting in a synchronizing call (cudaStreamSynchronize, cudaDeviceSynchronize,
    cudaEventSynchronize, blocking cudaMemcpy, `.item()`'s aten::_local_scalar_dense; the cause only
    for as long as the call lasted), running Python (named by its innermost frame with with_stack,
    else by the annotation around it), inside a framework op outside its children and launches
    (dispatch), in launch calls, in data-loading code, or nothing recorded. Each part has its share of
    the bucket, its time per launch and the names that held it; the shares add up to 1.
    `details.by_cause` keeps the older split by what was on the host when the GPU ran dry.

    Why it costs MFU: the GPU cannot run work that has not been launched; every microsecond the
    host spends behind it is a microsecond of idle tensor cores.

    What to do: by the largest part (docs/rules.md lists each condition). Python in gaps over 1 ms
    (preprocessing): move it off the GPU's path or overlap it; Python or dispatch per op: fewer,
    larger ops (`torch.compile`), CUDA graphs; launch calls: CUDA graphs
    (`torch.compile(mode="reduce-overhead")`); syncs: keep values on the GPU (no `.item()`,
    `.cpu()`, `print(tensor)` in the step); a slow optimizer: `fused=True`/`foreach=True`.
    """

    code = "MFU010"
    slug = "host-bound"
    bucket = "host_bound"
    Params = Params

    def digest(self, ctx: RankContext) -> HostBoundDigest | None:
        tl = ctx.tl
        if tl.host_timeline or len(tl) == 0:
            return None
        g = ctx.idle_gaps
        d = HostBoundDigest(dict.fromkeys(CAUSES, 0))
        marks = tl.host_marks
        sync = [i for i, k in enumerate(marks.kind) if k == "sync"] if marks else []
        opt = [i for i, k in enumerate(marks.kind) if k == "optimizer"] if marks else []
        sync_end = marks.end_ns[sync] if marks else np.zeros(0, np.int64)
        step_ends = np.asarray(tl.steps.cpu_end_ns, np.int64)
        # Each gap's cause, the first that holds in this order, in whole arrays (with NumPy calls
        # per gap, this digest took ~1 ms a rank of 20 kernels).
        j = np.flatnonzero(g.host_ns > 0)
        a, b, ns, before = g.start_ns[j], g.end_ns[j], g.host_ns[j], g.before_ns[j]
        synced, optimizer = np.zeros(len(j), dtype=bool), np.zeros(len(j), dtype=bool)
        if marks:
            # A sync call returns once the GPU has drained: its end lies inside the gap it opens.
            synced = points_within(sync_end, a, b)
            optimizer = ~synced & overlapped(marks.start_ns[opt], marks.end_ns[opt], a, b)
            for x in np.flatnonzero(synced).tolist():   # the call that opened the gap: the last in it
                m = sync[int(np.flatnonzero((sync_end >= a[x]) & (sync_end <= b[x]))[-1])]
                key = (marks.name[m], marks.op[m] or "?", marks.caller[m] or "?")
                d.syncs[key] += 1
                d.sync_ns[key] += int(ns[x])
        rest = ~(synced | optimizer)
        between = rest & points_within(step_ends, a, b)
        rest &= ~between
        launch = rest & (before >= 0) & (before < self.params.tiny_kernel_us * 1000)
        for cause, hit in (("sync", synced), ("optimizer", optimizer), ("between_steps", between),
                           ("launch", launch), ("python", rest & ~launch)):
            d.gap_ns[cause] += int(ns[hit].sum())
        in_step = tl.step_of >= 0
        d.launches = int((in_step & numpy_of(tl.acts.column("launch_ts").is_valid(), bool)).sum())
        kern = in_step & tl.kernel
        d.kernels = int(kern.sum())
        d.tiny = int((kern & ((tl.end_ns - tl.ts_ns) < self.params.tiny_kernel_us * 1000)).sum())
        le = numpy_of(tl.acts.column("launch_end").fill_null(-1), np.int64)
        lt = numpy_of(tl.acts.column("launch_ts").fill_null(-1), np.int64)
        ok = in_step & (le >= 0) & (lt >= 0)
        d.launch_us = _spread((le[ok] - lt[ok]) / 1000, LAUNCH_SAMPLE)
        step_starts = np.asarray(tl.steps.cpu_start_ns, np.int64)
        d.between_steps_us = ((step_starts[1:] - step_ends[:-1]) / 1000).tolist()
        d.steps = len(tl.steps.step)
        top = np.argsort(-g.host_ns)[:5]
        d.evidence = [f"step:{tl.rank}:{tl.steps.step[int(g.step[j])]}" for j in top if g.host_ns[j] > 0]
        d.parts = host_parts(tl, g)
        return d

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("host_bound")
        if frac < self.params.min_fraction:
            return []
        counted = [(r, d) for r in run.ranks if (d := r.rules.get(self.code))]
        digests: list[HostBoundDigest] = [d for _, d in counted]
        gap: dict[str, int] = defaultdict(int)
        syncs: Counter[tuple[str, str, str]] = Counter()
        sync_ns: Counter[tuple[str, str, str]] = Counter()
        for d in digests:
            for k, v in d.gap_ns.items():
                gap[k] += v
            syncs.update(d.syncs)
            sync_ns.update(d.sync_ns)
        total = sum(gap.values())
        share = {k: (gap[k] / total if total else 0.0) for k in CAUSES}
        steps_n = sum(d.steps for d in digests) or 1
        launches = sum(d.launches for d in digests) / steps_n
        kernels = sum(d.kernels for d in digests)
        tiny = sum(d.tiny for d in digests) / kernels if kernels else 0.0
        launch_us = np.concatenate([d.launch_us for d in digests]) if digests else np.zeros(0)
        per_launch = float(np.median(launch_us)) if len(launch_us) else None
        between = [x for d in digests for x in d.between_steps_us]
        between_ms = statistics.median(between) / 1000 if between else None
        worst_syncs = [k for k, _ in sync_ns.most_common(self.params.top_syncs)]
        parts = self._parts(run, counted, frac)
        top = max(parts, key=lambda k: (parts[k]["share"], k == "python")) if parts else None
        if top is not None and parts[top]["share"] > 0:
            summary = (f"GPU idle waiting for launches {frac:.1%} of the step, {parts[top]['share']:.0%} of it "
                       f"{PARTS[top]}")
            # The names that hold a twentieth of the part or more, up to three.
            names = [t for t in parts[top]["top"] if t["name"] != NO_SPAN and t["share"] >= 0.05][:3]
            if names:
                summary += ": " + ", ".join(f"{t['name'][:80]} {t['share'] * parts[top]['fraction']:.1%}" for t in names)
        else:
            old = max(CAUSES, key=lambda k: share[k]) if total else "launch"
            summary = f"GPU idle waiting for launches {frac:.1%} of the step, mostly {CAUSES[old]}"
        advice = self._advice(parts, launches, tiny, per_launch, run) if parts else []
        if share["optimizer"] >= 0.2:
            # A fused optimizer is the fix already where its kernels are in the trace (a compiled
            # GPT on an H200 with AdamW(fused=True) still spent a fifth of its host-bound time there).
            if run.uses("fused_optimizer"):
                fix = "it is fused already: torch.compile the optimizer step too, or run it in a CUDA graph"
            elif run.uses("foreach_optimizer"):
                fix = "it runs foreach ops already: use fused=True (one kernel per group), or torch.compile it"
            else:
                fix = "use fused=True or foreach=True optimizers"
            advice.append(f"the optimizer step holds {share['optimizer']:.0%} of it on the host: {fix}")
        if share["between_steps"] >= 0.2:
            advice.append("slow Python between steps" + (f" ({between_ms:.2f} ms median)" if between_ms else "")
                          + ": move logging, metrics and checkpointing off the step, prefetch the next batch")
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("host_bound"),
            *run.involved("host_bound", 0.0), [e for d in digests for e in d.evidence][:20],
            "; ".join(advice) or "see details: no single cause dominates", summary, run.what_if(frac),
            {"by_cause": {k: {"share": share[k], "fraction": share[k] * frac, "what": CAUSES[k]} for k in CAUSES},
             "parts": parts,
             "launches_per_step": launches, "kernels_under_tiny_share": tiny, "tiny_kernel_us": self.params.tiny_kernel_us,
             "cpu_us_per_launch": per_launch, "host_ms_between_steps": between_ms,
             "syncs": [{"call": c, "op": o, "caller": p, "gaps": syncs[(c, o, p)], "gap_ms": sync_ns[(c, o, p)] / 1e6}
                       for c, o, p in worst_syncs]},
            bucket="host_bound", recoverable_fraction=frac,   # graphs or a sync-free step launch ahead
        )]

    def _parts(self, run: RunContext, counted: list[tuple[Any, HostBoundDigest]], frac: float) -> dict[str, dict[str, Any]]:
        """details.parts: the bucket by what the launching thread did, over the steps the ledger
        counts; each part's share of the bucket, its fraction of the step, its time per launch call
        and the names that held it (frames, ops, calls), largest first. The shares add up to 1."""
        ns: dict[str, Counter[str]] = {k: Counter() for k in PARTS}
        long_ns = launches = 0
        frames = False
        for r, d in counted:
            if d.parts is None:
                continue
            frames |= d.parts.frames
            for i, by in enumerate(d.parts.ns):
                if (r.file_id, i) not in run.states:
                    continue
                for (part, name), v in by.items():
                    ns[part][name] += v
                long_ns += d.parts.python_long_ns[i]
                launches += d.parts.launches[i]
        total = sum(sum(c.values()) for c in ns.values())
        if not total:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for part, c in ns.items():
            held = sum(c.values())
            names = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[: self.params.top_names]
            out[part] = {"share": held / total, "fraction": held / total * frac, "what": PARTS[part],
                         "us_per_launch": held / launches / 1e3 if launches else None,
                         "top": [{"name": nm, "share": v / held} for nm, v in names]}
        held_py = sum(ns["python"].values())
        out["python"]["in_long_gaps_share"] = long_ns / held_py if held_py else 0.0
        out["python"]["frames_recorded"] = frames
        return out

    def _advice(self, parts: dict[str, dict[str, Any]], launches: float, tiny: float, per_launch: float | None,
                run: RunContext) -> list[str]:
        """One line per part that holds at least a fifth of the bucket (and always the largest),
        largest first, each from the figures details.parts shows."""
        graphs = run.uses("cuda_graphs")
        top = max(parts, key=lambda k: parts[k]["share"])
        lines = []
        for part in sorted(parts, key=lambda k: -parts[k]["share"]):
            p = parts[part]
            if part != top and p["share"] < 0.2:
                continue
            names = ", ".join(t["name"][:80] for t in p["top"][:3] if t["name"] != NO_SPAN)
            if part == "python" and p["in_long_gaps_share"] >= 0.5:
                lines.append("host work in Python holds the GPU idle in gaps over "
                             f"{LONG_GAP_NS / 1e6:g} ms" + (f" ({names})" if names else "") +
                             ": move it off the GPU's path (DataLoader workers, a preprocessing thread or process, "
                             "or ahead of time) or overlap it with the previous batch's GPU work")
            elif part == "python":
                us = p["us_per_launch"]
                lines.append("Python between ops" + (f", {duration(us / 1e6)} per launch" if us else "")
                             + (f" ({names})" if names and p["frames_recorded"] else "")
                             + f": fewer, larger ops ({run.compile_knob}), no per-op Python (hooks, logging) in the step"
                             + ("" if graphs else f", or {run.graphs_knob} to replay the step without Python"))
            elif part == "dispatch" and (p["us_per_launch"] or 0) >= ONE_OFF_US:
                lines.append(f"ops hold the host {duration(p['us_per_launch'] / 1e6)} per launch outside their "
                             f"launches ({names}): not per-op overhead but work inside them (allocator growth, "
                             "cuDNN autotuning with torch.backends.cudnn.benchmark, first calls); profile steps after "
                             "warm-up to see the steady state")
            elif part == "dispatch":
                us = p["us_per_launch"]
                lines.append("framework overhead per op" + (f": {duration(us / 1e6)} of op time outside launches per "
                                                            "launch" if us else "")
                             + (f" against {per_launch:.1f} µs per launch call" if per_launch else "")
                             + (f" ({names})" if names else "")
                             + f": fewer, larger ops ({run.compile_knob})"
                             + ("" if graphs else f"; {run.graphs_knob} replay the step without it"))
            elif part == "launch":
                lines.append(f"{launches:.0f} launches per step, {tiny:.0%} of kernels under "
                             f"{self.params.tiny_kernel_us:g} µs" + (f", {per_launch:.1f} µs CPU per launch" if per_launch else "")
                             + (f": fuse kernels ({run.compile_knob})" if graphs else
                                f": capture the step in {run.graphs_knob} or fuse kernels ({run.compile_knob})"))
            elif part == "sync_wait":
                lines.append("remove host syncs from the step" + (f" ({names})" if names else "")
                             + ": keep values on the GPU, no .item()/.cpu()/print(tensor) per layer, log every N steps")
            elif part == "dataloader":
                lines.append("data loading runs on the launching thread" + (f" ({names})" if names else "")
                             + ": DataLoader(num_workers>0, pin_memory=True)")
            else:
                lines.append("nothing is recorded on the launching thread for this time: open the largest gaps in "
                             "the timeline (diag tui, diag export --perfetto)")
        return lines
