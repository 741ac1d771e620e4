"""MFU005 stragglers."""

from __future__ import annotations

from collections import defaultdict

import msgspec

from diag.attribution.analysis import Finding, RunContext, StepContext, severity
from diag.attribution.ledger import StepLedger
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01


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
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("straggler"), culprits, steps,
            [e for r in culprits for e in evidence[r][:10]], advice, summary, run.what_if(frac),
            {"waited_for_s": {str(r): w for r, w in ranked}, "last_arrivals": {str(r): n for r, n in last_count.items()}},
            bucket="straggler", recoverable_fraction=frac,   # a healthy late rank arrives with the rest
        )]
