"""MFU003 thin-gemms."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from diag.analysis import Finding, RankContext, RunContext, StepContext, severity
from diag.ledger import StepLedger
from rules.base import Rule


@dataclass(frozen=True)
class Params:
    # Hopper's cuBLAS/CUTLASS GEMMs run 128×128 or 128×256 CTA tiles (wgmma is 64×N×16 per
    # warpgroup); a dimension under 128 leaves most of every tile idle.
    min_dim: int = 128
    min_fraction: float = 0.01
    top_shapes: int = 10


@dataclass(frozen=True)
class ThinGemmDigest:
    """One rank's thin GEMMs (one entry each) and the rate of its other GEMMs."""

    file_id: int
    act: npt.NDArray[np.int64]          # activity index in the rank's timeline (evidence)
    step: npt.NDArray[np.int64]         # step index, -1 outside every step
    dur_s: npt.NDArray[np.float64]
    flops: npt.NDArray[np.float64]
    mnk: list[tuple[int, int, int]]
    healthy_tflops: npt.NDArray[np.float64]   # achieved TFLOP/s of each well-shaped GEMM


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

    def digest(self, ctx: RankContext) -> ThinGemmDigest:
        tl = ctx.tl
        thin: list[int] = []
        shapes: list[tuple[int, int, int]] = []
        healthy: list[float] = []
        for i, mnk in enumerate(tl.gemm_mnk):
            if tl.kclass[i] != "gemm" or mnk is None or tl.flops[i] <= 0:
                continue
            if is_thin(mnk, self.params.min_dim):
                thin.append(i)
                shapes.append(mnk)
            elif tl.end_ns[i] > tl.ts_ns[i]:
                healthy.append(tl.flops[i] / ((tl.end_ns[i] - tl.ts_ns[i]) * 1e-9) / 1e12)
        idx = np.asarray(thin, np.int64)
        return ThinGemmDigest(
            tl.file_id, idx, tl.step_of[idx], ((tl.end_ns[idx] - tl.ts_ns[idx]) * 1e-9).astype(np.float64),
            tl.flops[idx], shapes, np.asarray(healthy, np.float64),
        )

    def claim(self, ctx: StepContext, ledger: StepLedger) -> None:
        peak = ctx.peak.flops_per_s
        d: ThinGemmDigest | None = ctx.digest(self.code)
        if peak is None or d is None:
            return
        here = d.step == ctx.index
        loss = float(np.maximum(d.dur_s[here] - d.flops[here] / peak, 0.0).sum())
        ledger.claim("thin_gemm", loss, ("matmul",))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("thin_gemm")
        if frac < self.params.min_fraction:
            return []
        shapes: dict[tuple[int, int, int], list[tuple[float, float]]] = defaultdict(list)
        evidence: dict[tuple[int, int, int], list[str]] = defaultdict(list)
        digests: list[ThinGemmDigest] = [r.rules[self.code] for r in run.ranks if self.code in r.rules]
        for d in digests:
            for j, mnk in enumerate(d.mnk):
                if d.dur_s[j] > 0:
                    shapes[mnk].append((float(d.flops[j] / d.dur_s[j] / 1e12), float(d.dur_s[j])))
                    evidence[mnk].append(f"act:{d.file_id}:{d.act[j]}")
        healthy = np.concatenate([d.healthy_tflops for d in digests]) if digests else np.zeros(0)
        possible = float(np.median(healthy)) if len(healthy) else run.peak.tflops
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
