"""MFU013 idle."""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np

from diag.attribution.analysis import Finding, RankContext, RunContext, severity
from diag.attribution.digest import RankDigest
from diag.runtime.durations import duration
from diag.timeline.columns import I64
from diag.timeline.host_spans import frame_label
from diag.timeline.nesting import innermost_pieces, overlapped
from diag.timeline.rank import RankTimeline
from diag.timeline.states import union
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01
    top_gaps: int = 10
    top_frames: int = 10


CAUSES = {
    "step_tail": "after the step's last kernel: the host finishes the step (logging, checkpointing, "
                 "the next batch) with the GPU empty",
    "sync_wait": "GPU work launched but waiting on an event or stream the host synchronizes on",
    "profiler": "the profiler's own overhead (buffer flushes)",
    "unexplained": "no host event explains it",
}


class IdleDigest(msgspec.Struct):
    """A rank's gap time by step (index into its steps), so that the findings count just the steps
    the ledger counts (warm-up and teardown steps are left out of the means, diag/timeline/step_outliers.py)."""

    gap_ns: dict[str, list[int]]              # cause → each step's gap time
    # Each step's largest listed gaps: (ns, rank, step, start_ns, step index).
    largest: list[tuple[int, int, int, int, int]] = msgspec.field(default_factory=list)
    # A CPU-only run with Python frames: each step's gap time by the innermost frame of its
    # training thread (OUTSIDE_FRAMES: under none).
    frame_ns: list[dict[str, int]] = msgspec.field(default_factory=list)


OUTSIDE_FRAMES = ""

Gap = tuple[int, int, int, int]   # (ns, rank, step, start_ns)


def _steps_of(largest: list[Gap]) -> list[str]:
    """The evidence: the steps that hold the largest gaps, each once, largest first."""
    return list(dict.fromkeys(f"step:{r}:{s}" for _, r, s, _ in largest))


def _gap_rows(largest: list[Gap]) -> list[dict[str, int | float]]:
    """The largest gaps as the details list them."""
    return [{"rank": r, "step": s, "start_ns": a, "ms": ns / 1e6} for ns, r, s, a in largest]


def _largest_by_step(ns: I64, step: I64, start: I64, tl: RankTimeline, keep: int) -> list[tuple[int, int, int, int, int]]:
    """Each step's `keep` largest gaps, in the order sorted((ns, rank, step, start), reverse=True)
    gives them within a step, without a tuple per gap (thousands on a trace of short kernels)."""
    order = np.lexsort((-start, -ns, step))
    by_step = step[order]
    order = order[np.arange(len(order)) - np.searchsorted(by_step, by_step, side="left") < keep]
    number = np.asarray(tl.steps.step, np.int64)
    return [(int(ns[t]), tl.rank, int(number[step[t]]), int(start[t]), int(step[t])) for t in order.tolist()]


def _frame_ns(tl: RankTimeline, a: I64, b: I64, step: I64) -> list[dict[str, int]]:
    """Each step's gap time by the innermost Python frame around it. A host op is its own
    launch, so a CPU-only run's gap is idle_other from its start; the data loader's spans are left
    out, as the ledger leaves them out of the bucket."""
    frames = tl.python_frames
    assert frames is not None
    start, length, frame = innermost_pieces(frames.start_ns, frames.end_ns, a, b, *union(*tl.dataloader_spans))
    # A piece lies in one gap, so in that gap's step (the gaps come in time order: the windows tile).
    in_step = step[np.searchsorted(a, start, side="right") - 1]
    key = in_step * (len(frames.name) + 1) + frame + 1
    order = np.argsort(key, kind="stable")
    key, length = key[order], length[order]
    first = np.flatnonzero(np.append(True, key[1:] != key[:-1]))
    out: list[dict[str, int]] = [{} for _ in tl.steps.step]
    labels: dict[int, str] = {}
    for k, ns in zip(key[first].tolist(), np.add.reduceat(length, first).tolist() if len(first) else [], strict=True):
        i, f = divmod(k, len(frames.name) + 1)
        label = labels.get(f)
        if label is None:
            label = labels[f] = frame_label(frames.name[f - 1]) if f else OUTSIDE_FRAMES
        out[i][label] = out[i].get(label, 0) + ns
    return out


class Idle(Rule[Params]):
    """GPU idle time neither the data loader nor the host's launches explain.

    What it finds: the `idle_other` bucket — idle time after the next activity's launch call had
    already returned — split by what the trace shows around each gap: the tail of a step after its
    last kernel, work held back by an event or a stream the host synchronizes on, the profiler's
    own overhead events; the rest is listed as unexplained, largest gaps first (rank, step, start).
    Each cause's share of the gap time divides the bucket. On a CPU-only run the bucket is the host
    outside aten ops and collectives: its time is named by the innermost Python frames of the
    training thread, where the trace has them (with_stack=True).

    Why it costs MFU: an idle GPU does no model FLOPs; idle time no one launched into is often a
    dependency between streams or ranks, or host work at the end of the step.

    What to do: step tail: move logging and checkpointing off the critical path, prefetch the next
    batch; event waits: check cross-stream dependencies (`wait_stream`, `record_stream`) and
    collectives waiting on peers; profiler: trace fewer steps or without `with_stack`/`profile_memory`;
    unexplained: open the largest gaps in the timeline (`diag tui`, `diag export --perfetto`); a
    CPU-only run: move the named frames' work out of the step or into fewer, larger ops.
    """

    code = "MFU013"
    slug = "idle"
    bucket = "idle_other"
    Params = Params

    def digest(self, ctx: RankContext) -> IdleDigest | None:
        tl = ctx.tl
        if len(tl) == 0:
            return None
        g = ctx.idle_gaps
        j = np.flatnonzero(g.other_ns > 0)
        a, b, ns, step = g.start_ns[j], g.end_ns[j], g.other_ns[j], g.step[j]
        n = len(tl.steps.step)
        d = IdleDigest({k: [0] * n for k in CAUSES})
        if tl.host_timeline:
            # A CPU-only run's gaps are the program's Python between ops, none of the GPU's causes:
            # they are named by frame, and the largest listed.
            if tl.python_frames is not None:
                d.frame_ns = _frame_ns(tl, a, b, step)
            listed = np.ones(len(j), dtype=bool)
        else:
            marks = tl.host_marks
            kinds = np.array(marks.kind if marks else [], dtype=object)
            ms = marks.start_ns if marks else np.zeros(0, np.int64)
            me = marks.end_ns if marks else np.zeros(0, np.int64)
            sync, prof = kinds == "sync", kinds == "profiler"
            # The first cause that holds, in this order, names the gap.
            tail = np.asarray(g.at_window_end, dtype=bool)[j]
            profiler = ~tail & overlapped(ms[prof], me[prof], a, b)
            sync_wait = ~tail & ~profiler & overlapped(ms[sync], me[sync], a, b)
            listed = ~(tail | profiler | sync_wait)
            for cause, hit in (("step_tail", tail), ("profiler", profiler), ("sync_wait", sync_wait),
                               ("unexplained", listed)):
                d.gap_ns[cause] = np.bincount(step[hit], weights=ns[hit], minlength=n).astype(np.int64).tolist()
        # The largest listed gaps: the unexplained ones on a GPU, all of them on a host timeline.
        d.largest = _largest_by_step(ns[listed], step[listed], a[listed], tl, self.params.top_gaps)
        return d

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("idle_other")
        if frac < self.params.min_fraction:
            return []
        gap: dict[str, int] = defaultdict(int)
        largest: list[Gap] = []
        for r, d in self._digests(run):
            for k, v in d.gap_ns.items():
                gap[k] += sum(ns for i, ns in enumerate(v) if (r.file_id, i) in run.states)
            largest += [(ns, rank, s, a) for ns, rank, s, a, i in d.largest if (r.file_id, i) in run.states]
        largest = sorted(largest, reverse=True)[: self.params.top_gaps]
        if any(r.host_timeline for r in run.ranks):
            return [self._host_finding(run, frac, largest)]
        total = sum(gap.values())
        share = {k: (gap[k] / total if total else 0.0) for k in CAUSES}
        top = max(CAUSES, key=lambda k: share[k]) if total else "unexplained"
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
            *run.involved("idle_other", 0.0), _steps_of(largest), advice, summary,
            run.what_if(frac),
            {"by_cause": {k: {"share": share[k], "fraction": share[k] * frac, "what": CAUSES[k]} for k in CAUSES},
             "largest_gaps": _gap_rows(largest)},
            # Profiler overhead is not the run's: no fix in the training code wins it back.
            bucket="idle_other", recoverable_fraction=frac * (1 - share["profiler"]),
        )]

    def _digests(self, run: RunContext) -> list[tuple[RankDigest, IdleDigest]]:
        return [(r, d) for r in run.ranks if (d := r.rules.get(self.code)) is not None]

    def _host_finding(self, run: RunContext, frac: float, largest: list[Gap]) -> Finding:
        """A CPU-only run's: the host outside aten ops and collectives, named by the innermost Python
        frames of the training thread where the trace has them (with_stack=True)."""
        held: dict[str, int] = defaultdict(int)
        for r, d in self._digests(run):
            for i, step in enumerate(d.frame_ns):
                if (r.file_id, i) in run.states:
                    for name, ns in step.items():
                        held[name] += ns
        total = sum(held.values())
        outside = held.pop(OUTSIDE_FRAMES, 0)
        named = sorted(held.items(), key=lambda kv: (-kv[1], kv[0]))
        top, rest = named[: self.params.top_frames], sum(ns for _, ns in named[self.params.top_frames:])

        def part(ns: int) -> dict[str, float]:
            return {"share": ns / total, "fraction": ns / total * frac}

        summary = f"the host is outside aten ops and collectives {frac:.1%} of the step (CPU-only run"
        details: dict[str, object] = {"largest_gaps": _gap_rows(largest)}
        if top:
            summary += "); innermost Python frames: " + ", ".join(
                f"{name} {part(ns)['fraction']:.1%}" for name, ns in top[:3])
            details |= {"by_frame": [{"frame": name, **part(ns)} for name, ns in top],
                        "other_frames": part(rest), "outside_frames": part(outside)}
            advice = ("the Python frames named run between the ops: move their work out of the step, "
                      "or into fewer, larger ops (torch.compile)")
        else:
            summary += ": Python, data handling, the profiler)"
            advice = "profile with with_stack=True to see the Python between ops"
        return Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("idle_other"),
            *run.involved("idle_other", 0.0), _steps_of(largest), advice, summary,
            run.what_if(frac), details,
            # Host time between ops is the program itself: nothing here says what a fix would win.
            bucket="idle_other", recoverable_fraction=0.0,
        )
