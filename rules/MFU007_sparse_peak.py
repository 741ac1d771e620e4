"""MFU007 sparse-peak."""

from __future__ import annotations

import msgspec

from diag.attribution.analysis import Finding, RunContext
from diag.knowledge import hardware
from diag.runtime.durations import percent
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    # A given peak within 0.5% of a datasheet "with sparsity" figure is that figure.
    tolerance: float = 0.005


class SparsePeak(Rule[Params]):
    """A "with sparsity" peak in the MFU denominator.

    What it finds: a peak (`--peak-tflops`, or the figure a dashboard used) equal to a part's
    datasheet "with sparsity" TFLOP/s — 2× the dense figure (H100 SXM bf16: 1,979 vs 989).
    diag always reports MFU against the dense peak; this finding shows the other figure.

    Why it costs MFU: it does not cost step time — it halves the MFU that gets reported, so a
    healthy run looks broken and comparisons with published MFU (all dense) are off by 2×.

    What to do: use the dense peak of the part and dtype the GEMMs ran in (`diag mfu --gpu ...`
    prints it); 2:4 structured sparsity is not used by training GEMMs.
    """

    code = "MFU007"
    slug = "sparse-peak"
    bucket = None
    claim_order = 100
    Params = Params

    def findings(self, run: RunContext) -> list[Finding]:
        user = run.peak.user_tflops
        if user is None:
            return []
        matches = hardware.sparse_peak_matches(user, tol=self.params.tolerance, dtype=run.peak.dtype)
        if not matches:
            return []
        part, dtype = matches[0]
        dense = hardware.dense_peak_tflops(part, dtype)
        wrong = run.mfu * dense / user if run.mfu is not None else None
        summary = (f"--peak-tflops {user:g} is the {part.name} {dtype} 'with sparsity' figure; the dense peak is "
                   f"{dense:g}: MFU is {percent(run.mfu)} against the dense peak, {percent(wrong)} against {user:g}")
        points = (run.mfu - wrong) if run.mfu is not None and wrong is not None else 0.0
        return [Finding(
            self.code, self.slug, "high", 0.0, 0.0, sorted({r.rank for r in run.ranks}), [], [],
            f"use the dense peak ({dense:g} TFLOP/s for {part.name} {dtype}); sparsity does not apply to training GEMMs",
            summary, run.mfu,
            {"given_peak_tflops": user, "dense_peak_tflops": dense, "part": part.key, "dtype": dtype,
             "mfu_dense": run.mfu, "mfu_with_given_peak": wrong, "reported_mfu_points_lost": points * 100},
            bucket=None, recoverable_fraction=0.0,   # the denominator: no step time to win
        )]
