"""MFU002 pipeline-bubble."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from diag.analysis import Finding, RunContext, StepContext, severity
from diag.ledger import StepLedger
from rules.base import Rule


@dataclass(frozen=True)
class Params:
    # Below half a point of the step a bubble is noise from a stray send/recv, not a schedule.
    min_fraction: float = 0.005


class PipelineBubble(Rule[Params]):
    """Pipeline stages idle while they fill and drain.

    What it finds: time a pipeline stage's GPU spends with only point-to-point (send/recv)
    kernels running — waiting for activations or gradients from its neighbour stage — measured
    against the schedule's ideal bubble (p−1)/(m+p−1) of the step for p stages and m microbatches
    (÷ v with v interleaved virtual stages).

    Why it costs MFU: during fill and drain a stage holds its GPU but has no microbatch to work
    on; with few microbatches per stage the bubble is a large share of every step.

    What to do: raise the number of microbatches per step (gradient accumulation,
    `--num-microbatches` / a larger global batch), use an interleaved schedule
    (`--num-layers-per-virtual-pipeline-stage`, v > 1), or fewer pipeline stages.
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
        p, m = _layout(run)
        ideal = (p - 1) / (m + p - 1) if p and m else None
        ranks, steps = run.involved("pipeline_bubble", self.params.min_fraction)
        detail = {"measured_fraction": frac, "stages_p": p, "microbatches_m": m, "ideal_fraction": ideal}
        if ideal is not None and p is not None and m is not None:
            gain_m = (p - 1) / (2 * m + p - 1)
            summary = (f"pipeline bubble {frac:.1%} of the step; p={p}, m={m}: the schedule's ideal is "
                       f"(p-1)/(m+p-1) = {ideal:.1%}; doubling m would make it {gain_m:.1%}")
            detail["ideal_with_2m"] = gain_m
        else:
            summary = f"pipeline bubble {frac:.1%} of the step (stages and microbatches not detected)"
        if ideal is not None and frac > 1.5 * ideal + 0.02:
            advice = ("the bubble is well above the schedule's ideal: stages are unbalanced or a stage "
                      "waits on something else; balance layers across stages, then raise microbatches")
        else:
            advice = ("raise microbatches per step (gradient accumulation / --num-microbatches) or use the "
                      "interleaved schedule (--num-layers-per-virtual-pipeline-stage, v>1 divides the bubble by v)")
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("pipeline_bubble"), ranks, steps,
            [f"step:{lg.rank}:{lg.step}" for lg in run.ledgers if lg.fractions()["pipeline_bubble"] > 0][:20],
            advice, summary, run.what_if(frac), detail,
        )]


def _layout(run: RunContext) -> tuple[int | None, int | None]:
    """Stages p from the chain of 2-rank point-to-point groups; microbatches m from the sends of
    the first stage per step (one activation send per microbatch)."""
    edges: dict[int, set[int]] = defaultdict(set)
    for mt in run.matched:
        c = mt.call
        if c.collective == "sendrecv" and c.group_ranks:
            members = [int(r) for r in c.group_ranks.split(",")]
            if len(members) == 2:
                a, b = members
                edges[a].add(b)
                edges[b].add(a)
    if not edges:
        return None, None
    seen: set[int] = set()
    longest = 0
    ends = [r for r, nb in edges.items() if len(nb) == 1]
    for start in ends:
        if start in seen:
            continue
        length, prev, cur = 1, None, start
        seen.add(cur)
        while True:
            nxt = [n for n in edges[cur] if n != prev]
            if not nxt:
                break
            prev, cur = cur, nxt[0]
            seen.add(cur)
            length += 1
        longest = max(longest, length)
    first = min(r for r, nb in edges.items() if len(nb) == 1) if ends else None
    if first is None:
        return longest or None, None
    per_step: dict[int | None, int] = defaultdict(int)
    for mt in run.matched:
        if mt.call.rank == first and mt.call.collective == "sendrecv":
            per_step[mt.call.step] += 1
    counts = [n for s, n in per_step.items() if s is not None]
    # The first stage sends activations forward and receives gradients back: two calls per microbatch.
    m = (max(counts) // 2) if counts else None
    return longest, m or None
