"""The dtypes the model's matmuls ran in, and the peak they imply together.

With mixed dtypes the ideal time of the matmul FLOPs is Σ_d FLOPs_d ÷ peak_d (FP8 GEMMs at the
FP8 dense peak, bf16 ones at bf16), so the one peak that MFU divides by is the effective peak

    peak_eff = Σ FLOPs ÷ Σ (FLOPs_d ÷ peak_d) = 1 ÷ Σ_d (share_d ÷ peak_d)

(a weighted harmonic mean). torchao Float8Linear training — linear layers in fp8, attention in
bf16 — comes out between the bf16 and fp8 peaks.

Where the shares come from, best first:

1. op shapes (record_shapes): FLOPs by the dtype of the op's tensors, refined by the kernel's
   name where the tensors cannot tell (fp32 tensors on TF32 kernels) — when shapes cover most
   GEMM/attention kernel time;
2. kernel names (data/kernels.toml [[gemm_dtype]]): GEMM/attention kernel time by the dtype its
   name says; kernels whose names say none are taken to run in the same mix. Time is turned into
   FLOPs as time_d × peak_d, i.e. every dtype's kernels at the same fraction of their peak,
   which makes peak_eff the time-weighted mean of the peaks;
3. nothing: the default, bf16 (fp16 on parts without bf16, V100).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import msgspec

from diag.attribution.digest import RankDigest
from diag.knowledge import hardware

# Below this share, a dtype the part has no peak for (fp64 on H800, say) is left out of the mix
# with a note; above it the mix cannot be priced and the peak is unknown.
NEGLIGIBLE_SHARE = 0.01


class DtypeMix(msgspec.Struct, frozen=True):
    shares: Mapping[str, float]  # dtype → share of matmul FLOPs, summing to 1
    basis: str                   # how the shares were found, for the peak's source line ("" from shapes)

    @property
    def dominant(self) -> str:
        return max(self.shares, key=lambda d: (self.shares[d], d))

    def priced(self, part: hardware.Part) -> tuple[dict[str, float], list[str]]:
        """(shares of the dtypes the part has a peak for, renormalized; dtypes left out)."""
        missing = [d for d in self.shares if d not in part.dense_tflops]
        if sum(self.shares[d] for d in missing) > NEGLIGIBLE_SHARE:
            return {}, missing
        kept = {d: s for d, s in self.shares.items() if d in part.dense_tflops}
        total = sum(kept.values())
        return {d: s / total for d, s in kept.items()}, missing


def _normalized(weights: Mapping[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {d: w / total for d, w in sorted(weights.items(), key=lambda x: -x[1]) if w > 0}


def summed(maps: Iterable[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for m in maps:
        for k, v in m.items():
            out[k] += v
    return dict(out)


def run_mix(ranks: list[RankDigest], part: hardware.Part | None, shapes_trusted: bool) -> DtypeMix:
    """The run's mix (module docstring). `shapes_trusted`: op shapes cover enough GEMM/attention
    kernel time for their FLOPs to speak for the run (engine.MIN_SHAPE_COVERAGE)."""
    default = hardware.default_dtype(part)
    flops = summed(r.gemm_dtype_flops for r in ranks)
    named = summed(r.matmul_name_dtype_ns for r in ranks)
    if flops and shapes_trusted:
        return DtypeMix(_normalized(flops), "")  # the usual case: said by the FLOPs note already
    by_time = {d: float(ns) for d, ns in named.items() if d and ns > 0}
    if by_time:
        peak = {d: part.dense_tflops.get(d, 0.0) if part is not None else 1.0 for d in by_time}
        if part is not None and all(peak.values()):
            weights = {d: t * peak[d] for d, t in by_time.items()}
        else:
            weights = dict(by_time)   # no peaks to weigh by: the shares are of kernel time
        return DtypeMix(_normalized(weights), "GEMM kernel names (no usable shapes; kernels whose names say no "
                        f"dtype, {_share(named)} of GEMM time, are taken to run in the same mix)")
    if flops:
        return DtypeMix(_normalized(flops), "matmul FLOPs by dtype from the op shapes recorded")
    return DtypeMix({default: 1.0}, f"GEMM dtype unknown: no shapes recorded and no kernel name says; assumed {default}")


def _share(named: Mapping[str, float]) -> str:
    total = sum(named.values())
    return f"{named.get('', 0) / total:.0%}" if total else "0%"


def describe(part: hardware.Part, shares: Mapping[str, float]) -> str:
    """'dense fp8 1979 TFLOP/s' or 'effective 1414 TFLOP/s = fp8 62% at 1979, bf16 38% at 989'."""
    if len(shares) == 1:
        (d,) = shares
        return f"dense {d} {hardware.dense_peak_tflops(part, d):g} TFLOP/s"
    parts = ", ".join(f"{d} {s:.0%} at {hardware.dense_peak_tflops(part, d):g}" for d, s in shares.items())
    return f"effective {hardware.effective_peak_tflops(part, shares):.4g} TFLOP/s (dense peaks by matmul FLOPs: {parts})"
