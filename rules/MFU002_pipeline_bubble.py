"""MFU002 pipeline-bubble."""

from __future__ import annotations

import msgspec

from diag.attribution.analysis import Finding, RunContext, StepContext, severity
from diag.attribution.ledger import StepLedger
from diag.timeline.pipeline_actions import PipeAction
from diag.timeline.pipeline_layout import PipelineLayout, detect_layout
from diag.timeline.pipeline_schedules import (
    DUALPIPE,
    DUALPIPE_V,
    FORMULAS,
    GPIPE,
    INTERLEAVED,
    INTERLEAVED_ZB,
    NAMES,
    ONE_F_ONE_B,
    TIMED,
    UNKNOWN,
    ZB_H1,
)
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    # Below half a point of the step a bubble is noise from a stray send/recv, not a schedule.
    min_fraction: float = 0.005


class PipelineBubble(Rule[Params]):
    """Pipeline stages idle while they fill and drain.

    What it finds: time a pipeline stage's GPU spends with only point-to-point (send/recv)
    kernels running — waiting for activations or gradients from its neighbour stage — measured
    against the schedule's ideal bubble (p−1)/(m+p−1) of the step for p stages and m microbatches
    (÷ v with v interleaved virtual stages). p, m and the schedule (GPipe, 1F1B, interleaved) are
    read from the send/recv pattern: the chain of peers, the transfers per channel per step, and
    the order of sends and receives on the last stage (diag/timeline/pipeline_layout.py). Where the
    ranks name their schedule's actions (torch.distributed.pipelining's `PP:3F1`, `PP:3I1`,
    `PP:3W1` annotations) the schedule comes from them, zero-bubble (ZB-H1, ZB-H2, ZB-V, interleaved)
    and DualPipeV included, and so do the F, I, W chunk times their own ideal bubble takes: ZB-H1
    (p−1)(F+B−2W) with B = I+W (Qi et al. 2023, arXiv 2401.10241), ZB-H2 and ZB-V ≈ 0, DualPipeV
    (p−1)(F&B+B−3W) (DeepSeek-V3 §3.2.1, Table 2; diag/timeline/pipeline_schedules.py).

    Why it costs MFU: during fill and drain a stage holds its GPU but has no microbatch to work
    on; with few microbatches per stage the bubble is a large share of every step.

    What to do: raise the number of microbatches per step (gradient accumulation,
    `--num-microbatches` / a larger global batch), then the next schedule, never the one in use:
    1F1B → interleaved (`--num-layers-per-virtual-pipeline-stage`, v > 1); interleaved → more chunks
    or zero-bubble; ZB-H1 → ZB-H2 or ZB-V; DualPipe whose F&B pairs do not overlap → register the
    overlap. Or fewer pipeline stages. Inference: more batches in flight, or fewer stages.
    """

    code = "MFU002"
    slug = "pipeline-bubble"
    bucket = "pipeline_bubble"
    claim_order = 10
    Params = Params

    def claim(self, ctx: StepContext, ledger: StepLedger) -> None:
        ledger.claim("pipeline_bubble", ctx.states.p2p_only_ns * 1e-9, ("comm",))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("pipeline_bubble")
        if frac < self.params.min_fraction:
            return []
        actions: dict[int, list[PipeAction]] = {}
        for r in run.ranks:
            actions.setdefault(r.rank, []).extend(r.pipeline_actions)
        layout = detect_layout((m.call for m in run.matched), actions)
        ranks, steps = run.involved("pipeline_bubble", self.params.min_fraction)
        summary = f"pipeline bubble {frac:.1%} of the step"
        detail: dict[str, object] = {"measured_bubble": frac}
        ideal = layout.theoretical_bubble if layout else None
        if layout is not None:
            detail.update(stages=layout.stages, microbatches=layout.microbatches, schedule=layout.schedule,
                          virtual_stages=layout.virtual_stages, pipelines=layout.replicas,
                          theoretical_bubble=ideal, layout_from=layout.how)
            if layout.times is not None:
                detail.update(chunk_times_ms={k: v * 1e3 for k, v in layout.times.as_dict().items()})
            if layout.schedule in TIMED:
                detail.update(bubble_formula=FORMULAS.get(layout.schedule), theoretical_bubble_s=layout.bubble_s)
        if layout is not None and ideal is not None and layout.microbatches and layout.schedule in TIMED:
            gap = (frac - ideal) * 100
            summary += (f"; {_shape(layout)}, {NAMES[layout.schedule]}: the schedule's ideal is "
                        f"{_timed_formula(layout)} = {ideal:.1%} of the step, measured {abs(gap):.1f} points "
                        f"{'above' if gap >= 0 else 'below'} it")
            detail.update(bubble_vs_theoretical_points=gap, theoretical_with_2m=layout.bubble_with(2 * layout.microbatches))
        elif layout is not None and ideal is not None and layout.microbatches:
            p, m, v = layout.stages, layout.microbatches, layout.virtual_stages
            doubled = layout.bubble_with(2 * m)
            formula = "(p-1)/(m+p-1)" + (f"/v, v={v}" if v > 1 else "")
            gap = (frac - ideal) * 100
            summary += (f"; {p} stages, {m} microbatches per step, {_SCHEDULE_NAMES[layout.schedule]}: the "
                        f"schedule's ideal is {formula} = {ideal:.1%}, measured {abs(gap):.1f} points "
                        f"{'above' if gap >= 0 else 'below'} it; doubling m would make it {doubled:.1%}")
            detail.update(bubble_vs_theoretical_points=gap, theoretical_with_2m=doubled)
        elif layout is not None and layout.schedule in TIMED:
            summary += (f"; {layout.stages} stages, {NAMES[layout.schedule]} ({layout.how}): its ideal "
                        f"{FORMULAS[layout.schedule]} needs the F, B, W chunk times, which only a trace that names "
                        "the schedule's actions gives")
        elif layout is not None:
            missing = f"{layout.stages} stages; microbatches" if layout.stages else "stages"
            summary += f" ({missing} not detected: {layout.how})"
        else:
            summary += " (no send/recv with a known direction and peer: stages and microbatches not detected)"
        if ideal is not None and frac > 1.5 * ideal + 0.02:
            advice = ("the bubble is well above the schedule's ideal: stages are unbalanced or a stage "
                      "waits on something else; balance layers across stages, then raise microbatches")
        else:
            advice = _advice(layout)
        if layout is not None and layout.schedule == GPIPE and (layout.microbatches or 0) > 1:
            advice += ("; GPipe holds all m microbatches' activations: 1F1B has the same bubble with at most p "
                       "in flight, which leaves the memory to raise m")
        if run.inference:   # no gradient accumulation: the stages fill with batches in flight
            advice = ("keep more batches in flight across the stages (more concurrent requests or micro-batches "
                      "per forward), balance layers across stages, or use fewer stages and more tensor parallelism")
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("pipeline_bubble"), ranks, steps,
            [f"step:{lg.rank}:{lg.step}" for lg in run.ledgers if lg.fractions()["pipeline_bubble"] > 0][:20],
            advice, summary, run.what_if(frac), detail,
            # More microbatches, interleaving or a zero-bubble schedule shrink the bubble toward none.
            bucket="pipeline_bubble", recoverable_fraction=frac,
        )]


# An overlapped pair within 10% of F + B: the passes ran one after the other (the rest is jitter).
_NO_OVERLAP = 0.9
_SCHEDULE_NAMES = {k: NAMES[k] for k in (GPIPE, ONE_F_ONE_B, INTERLEAVED, UNKNOWN)}


def _shape(layout: PipelineLayout) -> str:
    v = f" × {layout.virtual_stages} stages each" if layout.virtual_stages > 1 else ""
    return f"{layout.stages} ranks{v}, {layout.microbatches} microbatches per step"


def _timed_formula(layout: PipelineLayout) -> str:
    """The formula with its inputs, in ms: '(p-1)(F+B-2W), p=4, F 1.20, B 2.40 (I 1.20 + W 1.20) ms → 3.60 ms'."""
    t, formula = layout.times, FORMULAS[layout.schedule]
    if t is None or layout.bubble_s is None:
        return formula
    parts = [f"F {t.F * 1e3:.2f}", f"B {t.B * 1e3:.2f}" + (
        f" (I {t.I * 1e3:.2f} + W {t.W * 1e3:.2f})" if t.I is not None and t.W is not None else "")]
    if t.FB is not None:
        parts.append(f"F&B {t.FB * 1e3:.2f}")
    return f"{formula}, p={layout.stages}, {', '.join(parts)} ms → {layout.bubble_s * 1e3:.2f} ms per step"


def _advice(layout: PipelineLayout | None) -> str:
    """More microbatches always; then the next schedule, never the one the run already uses."""
    more = "raise microbatches per step (gradient accumulation / --num-microbatches)"
    schedule = layout.schedule if layout is not None else UNKNOWN
    if schedule == INTERLEAVED:
        return (f"{more}, or more model chunks per rank (v={layout.virtual_stages if layout else '?'} now divides "
                "the bubble by v), or a zero-bubble schedule (ScheduleInterleavedZeroBubble: weight-gradient "
                "passes fill the cool-down)")
    if schedule in (ZB_H1, INTERLEAVED_ZB):
        return (f"{more}; the run is zero-bubble already: what is left is the (p-1)(F+B-2W) ZB-H1 keeps, which "
                "ZB-H2 (more warm-up forwards, about twice the activations) or ZB-V (ScheduleZBVZeroBubble) remove "
                "when F, I and W take about the same time")
    if schedule in (DUALPIPE, DUALPIPE_V):
        t = layout.times if layout is not None else None
        if t is not None and t.FB is not None and t.FB >= _NO_OVERLAP * (t.F + t.B):
            # F&B no shorter than F + B: the pair runs one pass after the other (torch's runtime does
            # unless a custom OVERLAP_F_B function is registered), so DualPipe's overlap is not there.
            return (f"{more}; the overlapped forward-backward pairs take F&B {t.FB * 1e3:.2f} ms against F+B "
                    f"{(t.F + t.B) * 1e3:.2f} ms: nothing overlaps. Register an overlapped forward-backward "
                    "(schedule.register_custom_function(OVERLAP_F_B, …), DualPipe's overlapped_forward_backward) "
                    "so one chunk's communication hides under the other's compute")
        return f"{more}; balance the layers across stages (the ideal assumes equal F, B, W on every stage)"
    if schedule in TIMED:
        return (f"{more}; the schedule's ideal is near zero only when F, I and W take about the same time: "
                "balance the layers across stages and the passes' costs")
    return (f"{more} or use the interleaved schedule (--num-layers-per-virtual-pipeline-stage, v>1 divides the "
            "bubble by v)")
