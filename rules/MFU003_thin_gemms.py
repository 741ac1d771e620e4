"""MFU003 thin-gemms."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from diag.analysis import Finding, RunContext, StepContext, severity
from diag.ledger import StepLedger
from rules.base import Rule


@dataclass(frozen=True)
class Params:
    # Hopper's cuBLAS/CUTLASS GEMMs run 128×128 or 128×256 CTA tiles (wgmma is 64×N×16 per
    # warpgroup); a dimension under 128 leaves most of every tile idle.
    min_dim: int = 128
    min_fraction: float = 0.01
    top_shapes: int = 10


def is_thin(mnk: tuple[int, int, int] | None, min_dim: int) -> bool:
    return mnk is not None and min(mnk) < min_dim


class ThinGemms(Rule[Params]):
    """GEMMs with a dimension too small to fill the tensor cores.

    What it finds: GEMM kernels whose M, N or K is below `min_dim` (from the op's recorded
    shapes), grouped by shape, with the TFLOP/s they reached against what this run's
    well-shaped GEMMs reach. The time they spend beyond their FLOPs at the dense peak is
    claimed as `thin_gemm`.

    Why it costs MFU: a thin GEMM keeps the whole GPU busy while most of each tile computes
    padding; tensor parallelism split too fine (hidden/TP) or tiny microbatches are the usual cause.

    What to do: lower the tensor-parallel degree (`--tensor-model-parallel-size`) so per-GPU
    shards stay ≥ 128 wide, raise the micro-batch size, pad vocab/hidden to multiples of 128,
    or fuse the small projections.
    """

    code = "MFU003"
    slug = "thin-gemms"
    bucket = "thin_gemm"
    claim_order = 30
    Params = Params

    def claim(self, ctx: StepContext, ledger: StepLedger) -> None:
        peak = ctx.peak.flops_per_s
        if peak is None:
            return
        tl = ctx.tl
        loss = 0.0
        for i in ctx.activities:
            if tl.kclass[i] == "gemm" and is_thin(tl.gemm_mnk[i], self.params.min_dim) and tl.flops[i] > 0:
                loss += max((tl.end_ns[i] - tl.ts_ns[i]) * 1e-9 - tl.flops[i] / peak, 0.0)
        ledger.claim("thin_gemm", loss, ("matmul",))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("thin_gemm")
        if frac < self.params.min_fraction:
            return []
        shapes: dict[tuple[int, int, int], list[tuple[float, float]]] = defaultdict(list)
        healthy: list[float] = []
        evidence: dict[tuple[int, int, int], list[str]] = defaultdict(list)
        for tl in run.timelines:
            for i, mnk in enumerate(tl.gemm_mnk):
                dur = (tl.end_ns[i] - tl.ts_ns[i]) * 1e-9
                if tl.kclass[i] != "gemm" or mnk is None or tl.flops[i] <= 0 or dur <= 0:
                    continue
                rate = tl.flops[i] / dur / 1e12
                if is_thin(mnk, self.params.min_dim):
                    shapes[mnk].append((rate, dur))
                    evidence[mnk].append(f"act:{tl.file_id}:{i}")
                else:
                    healthy.append(rate)
        possible = statistics.median(healthy) if healthy else run.peak.tflops
        worst = sorted(shapes, key=lambda s: -sum(d for _, d in shapes[s]))[: self.params.top_shapes]
        rows = [{
            "m": s[0], "n": s[1], "k": s[2], "count": len(shapes[s]), "time_ms": sum(d for _, d in shapes[s]) * 1e3,
            "achieved_tflops": statistics.median(r for r, _ in shapes[s]), "possible_tflops": possible,
        } for s in worst]
        ranks, steps = run.involved("thin_gemm", 0.0)
        summary = f"thin GEMMs lose {frac:.1%} of the step"
        if worst and possible:
            m, n, k = worst[0]
            achieved = statistics.median(r for r, _ in shapes[worst[0]])
            summary += (f"; worst shape M={m} N={n} K={k} reaches {achieved:.0f} TFLOP/s where this run's "
                        f"other GEMMs reach {possible:.0f}")
        advice = ("keep every GEMM dimension >= 128 per GPU: lower --tensor-model-parallel-size, raise the "
                  "micro-batch size, pad hidden/vocab to multiples of 128, fuse small projections")
        ev = [e for s in worst for e in evidence[s][:3]]
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("thin_gemm"), ranks, steps,
            ev, advice, summary, run.what_if(frac), {"shapes": rows, "min_dim": self.params.min_dim},
        )]
