"""MFU002 pipeline-bubble."""

from __future__ import annotations

import msgspec

from diag.attribution.analysis import Finding, RunContext, StepContext, severity
from diag.attribution.ledger import StepLedger
from diag.timeline.pipeline_layout import GPIPE, INTERLEAVED, ONE_F_ONE_B, UNKNOWN, detect_layout
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
    the order of sends and receives on the last stage (diag/timeline/pipeline_layout.py).

    Why it costs MFU: during fill and drain a stage holds its GPU but has no microbatch to work
    on; with few microbatches per stage the bubble is a large share of every step.

    What to do: raise the number of microbatches per step (gradient accumulation,
    `--num-microbatches` / a larger global batch), use an interleaved schedule
    (`--num-layers-per-virtual-pipeline-stage`, v > 1), or fewer pipeline stages.
    Inference: more batches in flight across the stages, or fewer stages.
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
        layout = detect_layout(m.call for m in run.matched)
        ranks, steps = run.involved("pipeline_bubble", self.params.min_fraction)
        summary = f"pipeline bubble {frac:.1%} of the step"
        detail: dict[str, object] = {"measured_bubble": frac}
        ideal = layout.theoretical_bubble if layout else None
        if layout is not None:
            detail.update(stages=layout.stages, microbatches=layout.microbatches, schedule=layout.schedule,
                          virtual_stages=layout.virtual_stages, pipelines=layout.replicas,
                          theoretical_bubble=ideal, layout_from=layout.how)
        if layout is not None and ideal is not None and layout.microbatches:
            p, m, v = layout.stages, layout.microbatches, layout.virtual_stages
            doubled = layout.bubble_with(2 * m)
            formula = "(p-1)/(m+p-1)" + (f"/v, v={v}" if v > 1 else "")
            gap = (frac - ideal) * 100
            summary += (f"; {p} stages, {m} microbatches per step, {_SCHEDULE_NAMES[layout.schedule]}: the "
                        f"schedule's ideal is {formula} = {ideal:.1%}, measured {abs(gap):.1f} points "
                        f"{'above' if gap >= 0 else 'below'} it; doubling m would make it {doubled:.1%}")
            detail.update(bubble_vs_theoretical_points=gap, theoretical_with_2m=doubled)
        elif layout is not None:
            missing = f"{layout.stages} stages; microbatches" if layout.stages else "stages"
            summary += f" ({missing} not detected: {layout.how})"
        else:
            summary += " (no send/recv with a known direction and peer: stages and microbatches not detected)"
        if ideal is not None and frac > 1.5 * ideal + 0.02:
            advice = ("the bubble is well above the schedule's ideal: stages are unbalanced or a stage "
                      "waits on something else; balance layers across stages, then raise microbatches")
        else:
            advice = ("raise microbatches per step (gradient accumulation / --num-microbatches) or use the "
                      "interleaved schedule (--num-layers-per-virtual-pipeline-stage, v>1 divides the bubble by v)")
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


_SCHEDULE_NAMES = {GPIPE: "GPipe", ONE_F_ONE_B: "1F1B", INTERLEAVED: "interleaved 1F1B", UNKNOWN: "schedule unknown"}
