"""MFU003 thin-gemms."""

from __future__ import annotations

import statistics
from collections import defaultdict

import msgspec
import numpy as np
import numpy.typing as npt

from diag.attribution import gemm_shape
from diag.attribution.analysis import Finding, Peak, RankContext, RunContext, StepContext, severity
from diag.attribution.ledger import StepLedger
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01
    top_shapes: int = 10


class ThinShape(msgspec.Struct, frozen=True):
    """Why one GEMM shape cannot fill the part."""

    m: int
    n: int
    k: int
    tiles: int | None
    sms: int
    intensity: float | None
    ridge: float | None
    attention: bool              # a batched matmul with a head-sized dimension (attention by hand)

    def why(self) -> str:
        parts = []
        if self.tiles is not None and self.tiles < self.sms:
            parts.append(f"{self.tiles} output tiles for {self.sms} SMs (under one wave)")
        if self.intensity is not None and self.ridge is not None and self.intensity < self.ridge:
            parts.append(f"{self.intensity:.0f} FLOP/byte under the ridge point {self.ridge:.0f}")
        return " and ".join(parts)


class ThinGemmDigest(msgspec.Struct, frozen=True):
    """One rank's thin GEMMs (one entry each) and the rate of its other GEMMs."""

    file_id: int
    act: npt.NDArray[np.int64]          # activity index in the rank's timeline (evidence)
    step: npt.NDArray[np.int64]         # step index, -1 outside every step
    dur_s: npt.NDArray[np.float64]
    flops: npt.NDArray[np.float64]
    shape: list[ThinShape]
    healthy_tflops: npt.NDArray[np.float64]   # achieved TFLOP/s of each well-shaped GEMM
    # Each thin GEMM's (tensor dtype, kernel name): its own dtype's peak is the one its time is judged
    # at (Peak.tflops_of_kernel), not the run's effective peak of a dtype mix; and each well-shaped one's.
    dtype_of: list[tuple[str | None, str]] = msgspec.field(default_factory=list)
    healthy_of: list[tuple[str | None, str]] = msgspec.field(default_factory=list)

    def peaks_tflops(self, peak: Peak) -> npt.NDArray[np.float64]:
        """Each thin GEMM's dense peak at its own dtype."""
        return np.array([peak.tflops_of_kernel(d, k) for d, k in self.dtype_of], np.float64)


class ThinGemms(Rule[Params]):
    """GEMMs whose shape cannot fill the GPU.

    What it finds: GEMM kernels (M, N, K from the op's recorded shapes) that on the identified part
    either have fewer output tiles than SMs — one partial wave at the tile the kernel name gives
    (nvjet_tst_128x256_...) or the part's usual one (data/gemm_ceiling.csv): 256 tokens × 4096 on an
    H100 is 2 · 16 = 32 tiles of 128×256 for 132 SMs — or do fewer FLOPs per byte than the part's
    ridge point (dense peak ÷ HBM bandwidth: 295 on H100 SXM bf16). The time they spend beyond
    their FLOPs at the dense peak is claimed as `thin_gemm`; what a fix can win is the time beyond
    their FLOPs at the rate this run's well-shaped GEMMs reach (measured, never the datasheet).

    Why it costs MFU: a GEMM that cannot give every SM a tile leaves SMs idle for its whole
    duration; one under the ridge point waits on memory instead of computing. Tensor parallelism
    split too fine, tiny microbatches and attention written as plain matmuls are the usual causes.

    What to do: raise the micro-batch size (tokens per GEMM), lower the tensor-parallel degree
    (`--tensor-model-parallel-size`), fuse small projections (QKV in one GEMM); attention-shaped
    matmuls (K or N = head_dim under `aten::bmm`) belong in fused attention
    (`F.scaled_dot_product_attention`, FlashAttention). Inference: batch more sequences
    per forward.
    """

    code = "MFU003"
    slug = "thin-gemms"
    bucket = "thin_gemm"
    claim_order = 30
    Params = Params

    def digest(self, ctx: RankContext) -> ThinGemmDigest | None:
        tl, part = ctx.tl, ctx.part
        if part is None:
            return None   # thin is a property of the shape on a part: unknown part, no judgement
        thin: list[int] = []
        shapes: list[ThinShape] = []
        healthy: list[float] = []
        dtype_of: list[tuple[str | None, str]] = []
        healthy_of: list[tuple[str | None, str]] = []
        names = tl.name
        for i, f in ctx.gemm_fits.items():
            mnk = tl.gemm_mnk[i]
            assert mnk is not None   # gemm_fits holds the GEMMs with a shape
            if f.thin:
                thin.append(i)
                dtype_of.append((tl.dtype[i], names[i] or ""))
                shapes.append(ThinShape(*mnk, f.tiles, f.sms, f.intensity, f.ridge,
                                        gemm_shape.attention_shaped(tl.op_name[i], mnk, i in ctx.attention_bmms)))
            elif tl.end_ns[i] > tl.ts_ns[i]:
                healthy.append(tl.flops[i] / ((tl.end_ns[i] - tl.ts_ns[i]) * 1e-9) / 1e12)
                healthy_of.append((tl.dtype[i], names[i] or ""))
        idx = np.asarray(thin, np.int64)
        return ThinGemmDigest(
            tl.file_id, idx, tl.step_of[idx], ((tl.end_ns[idx] - tl.ts_ns[idx]) * 1e-9).astype(np.float64),
            tl.flops[idx], shapes, np.asarray(healthy, np.float64), dtype_of, healthy_of,
        )

    def claim(self, ctx: StepContext, ledger: StepLedger) -> None:
        peak = ctx.peak.flops_per_s
        d: ThinGemmDigest | None = ctx.digest(self.code)
        if peak is None or d is None:
            return
        here = d.step == ctx.index
        loss = float(np.maximum(d.dur_s[here] - d.flops[here] / (d.peaks_tflops(ctx.peak)[here] * 1e12), 0.0).sum())
        ledger.claim("thin_gemm", loss, ("matmul",))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("thin_gemm")
        if frac < self.params.min_fraction:
            return []
        shapes: dict[ThinShape, list[tuple[float, float]]] = defaultdict(list)
        evidence: dict[ThinShape, list[str]] = defaultdict(list)
        digests: list[ThinGemmDigest] = [r.rules[self.code] for r in run.ranks if r.rules.get(self.code)]
        healthy = np.concatenate([d.healthy_tflops for d in digests]) if digests else np.zeros(0)
        measured = float(np.median(healthy)) if len(healthy) else None
        ceiling = gemm_shape.ceiling_of(run.peak.part_key)
        by_dtype = _measured_by_dtype(run, digests)
        targets = [_targets(run, d, measured, ceiling, by_dtype) for d in digests]
        distinct = {float(x) for t in targets if t is not None for x in np.atleast_1d(t) if not np.isnan(x)}
        reach: dict[ThinShape, list[float]] = defaultdict(list)   # in a dtype mix: each GEMM's own target
        for d, t in zip(digests, targets, strict=True):
            for j, s in enumerate(d.shape):
                if d.dur_s[j] > 0:
                    shapes[s].append((float(d.flops[j] / d.dur_s[j] / 1e12), float(d.dur_s[j])))
                    evidence[s].append(f"act:{d.file_id}:{d.act[j]}")
                    if by_dtype is not None and t is not None:
                        reach[s].append(float(np.atleast_1d(t)[j]))
        if by_dtype is not None:   # a dtype mix: no one rate of "the other GEMMs" to promise every dtype
            measured = None
        target = measured or (next(iter(distinct)) if len(distinct) == 1 else None)
        worst = sorted(shapes, key=lambda s: -sum(d for _, d in shapes[s]))[: self.params.top_shapes]
        rows = [{
            "m": s.m, "n": s.n, "k": s.k, "count": len(shapes[s]), "time_ms": sum(d for _, d in shapes[s]) * 1e3,
            "achieved_tflops": statistics.median(r for r, _ in shapes[s]), "output_tiles": s.tiles, "sms": s.sms,
            "flop_per_byte": s.intensity, "ridge_flop_per_byte": s.ridge, "why": s.why(),
            "attention_shaped": s.attention,
        } for s in worst]
        ranks, steps = run.involved("thin_gemm", 0.0)
        summary = f"thin GEMMs lose {frac:.1%} of the step"
        if worst:
            s = worst[0]
            achieved = statistics.median(r for r, _ in shapes[s])
            summary += f"; worst shape M={s.m} N={s.n} K={s.k}: {s.why()}, {achieved:.0f} TFLOP/s"
            if reach.get(s) and not np.isnan(statistics.median(reach[s])):
                summary += f" where a GEMM of its dtype reaches {statistics.median(reach[s]):.0f}"
            else:
                summary += (f" where this run's other GEMMs reach {measured:.0f}" if measured is not None
                            else "; no well-shaped GEMM in this run to compare with")
        attention_s = sum(d for s in shapes if s.attention for _, d in shapes[s])
        total_s = sum(d for s in shapes for _, d in shapes[s])
        if total_s and attention_s >= total_s / 2:
            advice = ("the thin GEMMs are attention written as batched matmuls (K or N = head_dim under aten::bmm): "
                      "use fused attention (F.scaled_dot_product_attention, FlashAttention)")
        elif run.family.family in ("recommender", "convnet"):
            # No tensor parallelism or QKV there: the thin dimension is the per-rank batch.
            advice = "give each GEMM enough rows to fill the GPU: raise the per-rank batch size"
        else:
            # Lowering TP only where the run can have it: more than one rank, and no mesh that
            # settles the tensor-parallel degree at 1 (pg_config lists no TP group: mesh.py).
            tp = run.world_size > 1 and not (run.mesh is not None and "tp" in run.mesh.certain
                                             and run.mesh.dims.get("tp", 1) == 1)
            advice = ("give each GEMM enough tokens to fill the GPU: raise the micro-batch size, "
                      + ("lower --tensor-model-parallel-size, " if tp else "")
                      + "fuse small projections (QKV in one GEMM)")
            if attention_s:
                advice += "; attention done as batched matmuls belongs in F.scaled_dot_product_attention"
            if run.inference:   # decode GEMMs are thin by the batch: M is the number of sequences in flight
                advice = advice.replace("raise the micro-batch size", "batch more sequences per forward (larger "
                                        "max batch size, continuous batching)")
        recoverable = _recoverable(run, digests, targets)
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("thin_gemm"), ranks, steps,
            [e for s in worst for e in evidence[s][:3]], advice, summary, run.what_if(frac),
            {"shapes": rows, "other_gemms_tflops": measured, "target_tflops": target,
             "target_source": _target_source(measured, ceiling if distinct or measured else None, by_dtype)},
            bucket="thin_gemm", recoverable_fraction=min(recoverable, frac) if distinct or measured else frac,
        )]


def _measured_by_dtype(run: RunContext, digests: list[ThinGemmDigest]) -> dict[str | None, float] | None:
    """In a dtype mix (the run's peak an effective one), the median rate of the well-shaped GEMMs
    of each dtype whose peak judges them (Peak.peak_dtype); None in a run of one dtype."""
    if len(run.peak.dtype_mix) < 2 or run.peak.tflops is None:
        return None
    rates: dict[str | None, list[float]] = defaultdict(list)
    for e in digests:
        for rate, (dt, k) in zip(e.healthy_tflops.tolist(), e.healthy_of, strict=True):
            rates[run.peak.peak_dtype(dt, k)].append(rate)
    return {dt: float(np.median(r)) for dt, r in rates.items()}


def _targets(run: RunContext, d: ThinGemmDigest, measured: float | None, ceiling: gemm_shape.Ceiling | None,
             by_dtype: dict[str | None, float] | None) -> float | npt.NDArray[np.float64] | None:
    """What each of a rank's thin GEMMs would reach reshaped, TFLOP/s: this run's well-shaped GEMMs
    (the median), else the part's ceiling of the dense peak. In a dtype mix, each at its own dtype:
    the well-shaped GEMMs of that dtype, else the ceiling of that dtype's peak (issue 36: a bf16 GEMM
    of an fp8/bf16 run is never promised more than bf16 can do)."""
    if by_dtype is None:
        return measured if measured else ceiling.ceiling * run.peak.tflops if ceiling and run.peak.tflops else None
    return np.array([by_dtype.get(run.peak.peak_dtype(dt, k)) or (
        ceiling.ceiling * run.peak.tflops_of_kernel(dt, k) if ceiling else np.nan) for dt, k in d.dtype_of],
        np.float64)


def _recoverable(run: RunContext, digests: list[ThinGemmDigest],
                 targets: list[float | npt.NDArray[np.float64] | None]) -> float:
    """Mean over rank-steps of Σ (thin GEMM time − its FLOPs at the target rate, TFLOP/s: one for
    the rank or one per GEMM) ÷ step time."""
    if not run.ledgers:
        return 0.0
    windows = {k: st.window_ns * 1e-9 for k, st in run.states.items()}
    total = 0.0
    for d, target in zip(digests, targets, strict=True):
        if target is None:
            continue
        gain = np.nan_to_num(np.maximum(d.dur_s - d.flops / (target * 1e12), 0.0))   # nan: no target known
        for step in np.unique(d.step[d.step >= 0]).tolist():
            w = windows.get((d.file_id, step))
            if w:
                total += float(gain[d.step == step].sum()) / w
    return total / len(run.ledgers)


def _target_source(measured: float | None, ceiling: gemm_shape.Ceiling | None,
                   by_dtype: dict[str | None, float] | None = None) -> str | None:
    if by_dtype is not None:
        ceil = f"{ceiling.ceiling:.0%} of that dtype's dense peak ({ceiling.source})" if ceiling else "none known"
        return f"per dtype (a dtype mix): the median of this run's well-shaped GEMMs of the same dtype, else {ceil}"
    if measured is not None:
        return "measured: median of this run's well-shaped GEMMs"
    return f"{ceiling.ceiling:.0%} of the dense peak ({ceiling.source})" if ceiling else None
