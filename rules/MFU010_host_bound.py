"""MFU010 host-bound."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

import msgspec
import numpy as np

from diag.attribution.analysis import Finding, RankContext, RunContext, severity
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


# Why the host had not launched yet, by what was on the host when the GPU ran dry.
CAUSES = {
    "sync": "the host waited in a synchronizing call, then relaunched into an empty GPU",
    "optimizer": "inside the optimizer step (host-side optimizer work)",
    "between_steps": "between steps (Python at the step boundary: logging, loss.item(), the loader handoff)",
    "launch": "launching: eager kernels shorter than their launch calls",
    "python": "in Python between launches: the host takes longer per op than the GPU",
}


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


class HostBound(Rule[Params]):
    """The GPU ran dry waiting for the host to launch.

    What it finds: the `host_bound` bucket — GPU idle time before the launch call of the next GPU
    activity returned — split by what the host was doing when the GPU ran dry: waiting in a
    synchronizing call (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, blocking
    cudaMemcpy, `.item()`'s aten::_local_scalar_dense; named with the op and Python caller the trace
    records), inside the optimizer step, between steps, or launching (many kernels under 10 µs, with
    the launches per step and the CPU time per launch). Each cause's share of the gap time divides
    the bucket. Launching is split by the kernel before the gap: under 10 µs, launch overhead of tiny
    kernels; longer, Python slower per op than the GPU.

    Why it costs MFU: the GPU cannot run work that has not been launched; every microsecond the
    host spends behind it is a microsecond of idle tensor cores.

    What to do: launch-bound: CUDA graphs (`torch.compile(mode="reduce-overhead")`,
    `torch.cuda.graphs`) or fewer, larger kernels (`torch.compile`); syncs: keep values on the GPU
    (no `.item()`, `.cpu()`, `print(tensor)` in the step; log every N steps); a slow optimizer:
    `fused=True`/`foreach=True`; a slow step boundary: move logging and checkpointing off the step.
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
        return d

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("host_bound")
        if frac < self.params.min_fraction:
            return []
        digests: list[HostBoundDigest] = [r.rules[self.code] for r in run.ranks if r.rules.get(self.code)]
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
        top = max(CAUSES, key=lambda k: share[k]) if total else "launch"
        summary = f"GPU idle waiting for launches {frac:.1%} of the step, mostly {CAUSES[top]}"
        advice = []
        if share["python"] >= 0.2:
            advice.append("the host is slower per op than the GPU: torch.compile the model (fewer, larger kernels, "
                          "less Python per step), no per-op Python work (hooks, logging) in the forward")
        if share["launch"] >= 0.2 or not total:
            advice.append(f"{launches:.0f} launches per step, {tiny:.0%} of kernels under "
                          f"{self.params.tiny_kernel_us:g} µs" + (f", {per_launch:.1f} µs CPU per launch" if per_launch else "")
                          + ": capture the step in CUDA graphs (torch.compile(mode=\"reduce-overhead\")) or fuse "
                          "kernels (torch.compile)")
        worst_syncs = [k for k, _ in sync_ns.most_common(self.params.top_syncs)]
        if share["sync"] >= 0.2 and worst_syncs:
            call, op, caller = worst_syncs[0]
            where = f"{call}" + (f" in {op}" if op != "?" else "") + (f" from {caller}" if caller != "?" else "")
            advice.append(f"remove host syncs from the step ({where}, {syncs[worst_syncs[0]]} times): keep values "
                          "on the GPU, no .item()/.cpu()/print(tensor) per layer, log every N steps")
        if share["optimizer"] >= 0.2:
            advice.append("the optimizer step runs on the host: use fused=True or foreach=True optimizers")
        if share["between_steps"] >= 0.2:
            advice.append("slow Python between steps" + (f" ({between_ms:.2f} ms median)" if between_ms else "")
                          + ": move logging, metrics and checkpointing off the step, prefetch the next batch")
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("host_bound"),
            *run.involved("host_bound", 0.0), [e for d in digests for e in d.evidence][:20],
            "; ".join(advice) or "see details: no single cause dominates", summary, run.what_if(frac),
            {"by_cause": {k: {"share": share[k], "fraction": share[k] * frac, "what": CAUSES[k]} for k in CAUSES},
             "launches_per_step": launches, "kernels_under_tiny_share": tiny, "tiny_kernel_us": self.params.tiny_kernel_us,
             "cpu_us_per_launch": per_launch, "host_ms_between_steps": between_ms,
             "syncs": [{"call": c, "op": o, "caller": p, "gaps": syncs[(c, o, p)], "gap_ms": sync_ns[(c, o, p)] / 1e6}
                       for c, o, p in worst_syncs]},
            bucket="host_bound", recoverable_fraction=frac,   # graphs or a sync-free step launch ahead
        )]
