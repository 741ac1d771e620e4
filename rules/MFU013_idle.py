"""MFU013 idle."""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np

from diag.analysis import Finding, RankContext, RunContext, severity
from diag.durations import duration
from diag.nesting import overlapped
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01
    top_gaps: int = 10


CAUSES = {
    "step_tail": "after the step's last kernel: the host finishes the step (logging, checkpointing, "
                 "the next batch) with the GPU empty",
    "sync_wait": "GPU work launched but waiting on an event or stream the host synchronizes on",
    "profiler": "the profiler's own overhead (buffer flushes)",
    "unexplained": "no host event explains it",
}


class IdleDigest(msgspec.Struct):
    gap_ns: dict[str, int]
    largest: list[tuple[int, int, int, int]] = msgspec.field(default_factory=list)   # (ns, rank, step, start_ns)


class Idle(Rule[Params]):
    """GPU idle time neither the data loader nor the host's launches explain.

    What it finds: the `idle_other` bucket — idle time after the next activity's launch call had
    already returned — split by what the trace shows around each gap: the tail of a step after its
    last kernel, work held back by an event or a stream the host synchronizes on, the profiler's
    own overhead events; the rest is listed as unexplained, largest gaps first (rank, step, start).
    Each cause's share of the gap time divides the bucket.

    Why it costs MFU: an idle GPU does no model FLOPs; idle time no one launched into is often a
    dependency between streams or ranks, or host work at the end of the step.

    What to do: step tail: move logging and checkpointing off the critical path, prefetch the next
    batch; event waits: check cross-stream dependencies (`wait_stream`, `record_stream`) and
    collectives waiting on peers; profiler: trace fewer steps or without `with_stack`/`profile_memory`;
    unexplained: open the largest gaps in the timeline (`diag tui`, `diag export --perfetto`).
    """

    code = "MFU013"
    slug = "idle"
    bucket = "idle_other"
    Params = Params

    def digest(self, ctx: RankContext) -> IdleDigest | None:
        tl = ctx.tl
        if tl.host_timeline or len(tl) == 0:
            return None
        g = ctx.idle_gaps
        d = IdleDigest(dict.fromkeys(CAUSES, 0))
        marks = tl.host_marks
        kinds = np.array(marks.kind if marks else [], dtype=object)
        ms = marks.start_ns if marks else np.zeros(0, np.int64)
        me = marks.end_ns if marks else np.zeros(0, np.int64)
        sync, prof = kinds == "sync", kinds == "profiler"
        j = np.flatnonzero(g.other_ns > 0)
        a, b, ns = g.start_ns[j], g.end_ns[j], g.other_ns[j]
        # The first cause that holds, in this order, names the gap.
        tail = np.asarray(g.at_window_end, dtype=bool)[j]
        profiler = ~tail & overlapped(ms[prof], me[prof], a, b)
        sync_wait = ~tail & ~profiler & overlapped(ms[sync], me[sync], a, b)
        rest = ~(tail | profiler | sync_wait)
        for cause, hit in (("step_tail", tail), ("profiler", profiler), ("sync_wait", sync_wait), ("unexplained", rest)):
            d.gap_ns[cause] += int(ns[hit].sum())
        # The largest unexplained gaps, as sorted((ns, rank, step, start), reverse=True) would
        # give them, without a tuple per gap (thousands on a trace of short kernels).
        u_ns, u_step, u_start = ns[rest], np.asarray(tl.steps.step, np.int64)[g.step[j][rest]], a[rest]
        top = np.lexsort((-u_start, -u_step, -u_ns))[: self.params.top_gaps]
        d.largest = [(int(u_ns[t]), tl.rank, int(u_step[t]), int(u_start[t])) for t in top.tolist()]
        return d

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("idle_other")
        if frac < self.params.min_fraction:
            return []
        gap: dict[str, int] = defaultdict(int)
        largest: list[tuple[int, int, int, int]] = []
        for r in run.ranks:
            d: IdleDigest | None = r.rules.get(self.code)
            if d is None:
                continue
            for k, v in d.gap_ns.items():
                gap[k] += v
            largest += d.largest
        total = sum(gap.values())
        share = {k: (gap[k] / total if total else 0.0) for k in CAUSES}
        largest = sorted(largest, reverse=True)[: self.params.top_gaps]
        top = max(CAUSES, key=lambda k: share[k]) if total else "unexplained"
        if any(r.host_timeline for r in run.ranks):
            return [Finding(
                self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("idle_other"),
                *run.involved("idle_other", 0.0), [], "profile with with_stack=True to see the Python between ops",
                f"the host is outside aten ops and collectives {frac:.1%} of the step (CPU-only run: Python, "
                "data handling, the profiler)", run.what_if(frac), {},
                # Host time between ops is the program itself: nothing here says what a fix would win.
                bucket="idle_other", recoverable_fraction=0.0,
            )]
        summary = f"GPU idle with no launch pending {frac:.1%} of the step, mostly {CAUSES[top]}"
        if top == "unexplained" and largest:
            summary += "; largest gaps: " + ", ".join(
                f"{duration(ns / 1e9)} on rank {r} step {s}" for ns, r, s, _ in largest[:3])
        advice = {
            "step_tail": "move logging, metrics and checkpointing off the step's end; prefetch the next batch",
            "sync_wait": "check cross-stream and cross-rank dependencies (wait_stream, events, collectives on peers)",
            "profiler": "profile fewer steps, without with_stack/profile_memory, to see the run's own idle time",
            "unexplained": "open the largest gaps in the timeline (diag tui, diag export --perfetto)",
        }[top]
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("idle_other"),
            *run.involved("idle_other", 0.0), [f"step:{r}:{s}" for _, r, s, _ in largest], advice, summary,
            run.what_if(frac),
            {"by_cause": {k: {"share": share[k], "fraction": share[k] * frac, "what": CAUSES[k]} for k in CAUSES},
             "largest_gaps": [{"rank": r, "step": s, "start_ns": a, "ms": ns / 1e6} for ns, r, s, a in largest]},
            # Profiler overhead is not the run's: no fix in the training code wins it back.
            bucket="idle_other", recoverable_fraction=frac * (1 - share["profiler"]),
        )]
