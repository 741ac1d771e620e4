"""MFU006 dataloader-stall."""

from __future__ import annotations

import msgspec

from diag.attribution.analysis import Finding, RunContext, StepContext
from diag.attribution.ledger import StepLedger
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    # Under 5% of the step a loader stall is fine; over 20% it is severe (the bands).
    fine_fraction: float = 0.05
    severe_fraction: float = 0.20
    min_fraction: float = 0.01


class DataloaderStall(Rule[Params]):
    """The GPU idle while the host waits for the next batch.

    What it finds: GPU idle time during which the host's main thread is inside the data loader
    (`enumerate(DataLoader)#...`), claimed as `dataloader`, as a share of the step: under 5%
    fine, over 20% severe.

    Why it costs MFU: the step cannot start until its batch exists; every millisecond of
    loading that is not hidden behind the previous step's GPU work is lost.

    What to do: more loader workers (`num_workers`), `pin_memory=True`, a deeper
    `prefetch_factor`, `persistent_workers=True`; move decoding/tokenization offline.
    """

    code = "MFU006"
    slug = "dataloader-stall"
    bucket = "dataloader"
    claim_order = 40
    Params = Params

    def claim(self, ctx: StepContext, ledger: StepLedger) -> None:
        ledger.claim("dataloader", ctx.states.dataloader_ns * 1e-9, ("idle",))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("dataloader")
        if frac < self.params.min_fraction:
            return []
        if frac > self.params.severe_fraction:
            sev = "high"
        elif frac > self.params.fine_fraction:
            sev = "medium"
        else:
            sev = "info"
        ranks, steps = run.involved("dataloader", 0.0)
        band = "severe" if sev == "high" else ("worth fixing" if sev == "medium" else "fine (under 5%)")
        summary = f"GPU idle waiting for data {frac:.1%} of the step: {band}"
        advice = ("raise DataLoader num_workers, set pin_memory=True, a larger prefetch_factor and "
                  "persistent_workers=True; move decoding/tokenization offline")
        evidence = [f"step:{lg.rank}:{lg.step}" for lg in sorted(
            run.ledgers, key=lambda lg: -lg.buckets["dataloader"])[:20] if lg.buckets["dataloader"] > 0]
        return [Finding(
            self.code, self.slug, sev, frac, run.mean_seconds("dataloader"), ranks, steps, evidence, advice,
            summary, run.what_if(frac), {"fine_below": self.params.fine_fraction, "severe_above": self.params.severe_fraction},
            bucket="dataloader", recoverable_fraction=frac,   # a prefetched batch is ready when the step starts
        )]
