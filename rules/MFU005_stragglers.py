"""MFU005 stragglers."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

import msgspec

from diag.attribution.analysis import Finding, RunContext, StepContext, severity
from diag.attribution.ledger import StepLedger
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01
    # The same rank late in more than this share of the steps with waits is a persistent straggler.
    persistent_share: float = 0.5


class Stragglers(Rule[Params]):
    """Ranks that arrive late at collectives, and everyone who waits for them.

    What it finds: for each collective instance (matched across ranks by process group and
    Seq, else by order), the rank that arrived last — the one with the shortest kernel — and
    every other rank's extra kernel time, which is waiting, not transfer. The exposed part of
    that wait is claimed as `straggler`; the finding names the late ranks and how long the
    others waited for each.

    Why it costs MFU: a collective finishes only when its last rank arrives; one slow GPU or
    host stalls every rank in the group, every step.

    What to do: look at the named rank's host — thermal or power throttling
    (`nvidia-smi -q -d PERFORMANCE`; on AMD `amd-smi metric`), a slower NIC or PCIe link, a CPU-bound data loader or
    noisy neighbour on that node — and replace or drain it; rebalance uneven work (pipeline
    stages, sequence lengths).

    Why a rank is late (`details.pattern`): the rank the others waited for most in each step
    (`late_by_step`); `persistent` when one rank is it in most steps (hardware, its host, a slow
    link: drain it), `rotating` when it changes from step to step (data-dependent work). Rotating
    with expert-parallel groups is MoE routing imbalance — the late rank's GEMM time per step against
    the others' median (`matmul_vs_median_by_step`) is the excess work its experts got — and the fix
    is load balancing (aux loss, capacity factor, token dropping), not draining a node.
    """

    code = "MFU005"
    slug = "stragglers"
    bucket = "straggler"
    claim_order = 20
    Params = Params

    def claim(self, ctx: StepContext, ledger: StepLedger) -> None:
        ledger.claim("straggler", ctx.states.wait_ns * 1e-9, ("comm",))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("straggler")
        if frac < self.params.min_fraction:
            return []
        waited_for: dict[int, float] = defaultdict(float)
        last_count: dict[int, int] = defaultdict(int)
        evidence: dict[int, list[str]] = defaultdict(list)
        for mt in run.matched:
            if mt.last_rank is None:
                continue
            if mt.call.rank == mt.last_rank:
                last_count[mt.last_rank] += 1
                evidence[mt.last_rank].append(f"coll:{mt.instance}")
            waited_for[mt.last_rank] += mt.wait_ns * 1e-9
        ranked = sorted(waited_for.items(), key=lambda kv: -kv[1])
        total = sum(waited_for.values()) or 1.0
        culprits = [r for r, w in ranked if w / total >= 0.2][:4] or [r for r, _ in ranked[:1]]
        _, steps = run.involved("straggler", 0.0)
        names = ", ".join(f"rank {r} (last to arrive in {last_count[r]} collectives; the others waited "
                          f"{waited_for[r] * 1e3:.1f} ms in total for it)" for r in culprits)
        summary = f"ranks wait {frac:.1%} of the step for late arrivals; the late: {names}"
        advice = (f"inspect rank(s) {', '.join(map(str, culprits))}: GPU throttling ({run.vendor.smi}), "
                  "slow NIC/PCIe, a CPU-bound loader or noisy neighbour on that host; drain or replace it, "
                  "or rebalance uneven work")
        late_by_step = _late_by_step(run)
        pattern = _pattern(late_by_step, self.params.persistent_share)
        moe = run.mesh is not None and run.mesh.dims.get("ep", 1) > 1
        if pattern == "rotating":
            order = ", ".join(str(r) for r in late_by_step.values())
            summary += f"; the late rank rotates from step to step ({order})"
            advice = (ROTATING_MOE if moe else ROTATING) + f" (late by step: {order})"
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("straggler"), culprits, steps,
            [e for r in culprits for e in evidence[r][:10]], advice, summary, run.what_if(frac),
            {"waited_for_s": {str(r): w for r, w in ranked}, "last_arrivals": {str(r): n for r, n in last_count.items()},
             "pattern": pattern, "late_by_step": {str(s): r for s, r in late_by_step.items()},
             "matmul_vs_median_by_step": _matmul_vs_median(run, late_by_step)},
            bucket="straggler", recoverable_fraction=frac,   # a healthy late rank arrives with the rest
        )]


ROTATING = ("the late rank changes from step to step: uneven work, not a slow GPU — balance it (pack or bucket "
            "sequences by length, even out data-dependent work per rank); draining a node will not help")
ROTATING_MOE = ("the late rank changes from step to step and the run has expert-parallel groups: MoE routing "
                "imbalance, not a slow GPU — balance the experts' load (auxiliary load-balancing loss, "
                "--moe-aux-loss-coeff; a capacity factor with token dropping, --moe-expert-capacity-factor; "
                "aux-loss-free bias balancing, --moe-router-enable-expert-bias); draining a node will not help")


def _late_by_step(run: RunContext) -> dict[int, int]:
    """Per step, the rank the others waited for longest in it (ties: the lowest rank)."""
    waited: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for mt in run.matched:
        if mt.last_rank is not None and mt.wait_ns > 0 and mt.call.step is not None:
            waited[mt.call.step][mt.last_rank] += mt.wait_ns
    return {s: min(w, key=lambda r: (-w[r], r)) for s, w in sorted(waited.items())}


def _pattern(late_by_step: dict[int, int], persistent_share: float) -> str | None:
    """persistent | rotating; None with fewer than two steps to compare."""
    if len(late_by_step) < 2:
        return None
    most = max(Counter(late_by_step.values()).values())
    return "persistent" if most / len(late_by_step) > persistent_share else "rotating"


def _matmul_vs_median(run: RunContext, late_by_step: dict[int, int]) -> dict[str, float]:
    """Per step, the late rank's GEMM/attention kernel time ÷ the median of the other ranks': above 1,
    its matmuls took longer (in MoE with a rotating late rank, more tokens routed to its experts)."""
    rank_of = {r.file_id: r.rank for r in run.ranks}
    by_step: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for (fid, _), st in run.states.items():
        by_step[st.step][rank_of[fid]] += st.matmul_ns
    out = {}
    for step, late in late_by_step.items():
        ns = by_step.get(step, {})
        others = [v for r, v in ns.items() if r != late]
        if late in ns and others and statistics.median(others) > 0:
            out[str(step)] = ns[late] / statistics.median(others)
    return out
