"""MFU008 kernel-inefficiency."""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np

from diag.attribution.analysis import Finding, RankContext, RunContext, severity
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    # Memory-bound kernels (norms, elementwise, optimizer) should stream near HBM bandwidth;
    # under a quarter of it is "far below the roofline".
    min_bw_fraction: float = 0.25
    min_fraction: float = 0.01
    top_kernels: int = 10


# Kernels of one name a finding points at.
EVIDENCE = 3


class SlowKernelDigest(msgspec.Struct, frozen=True):
    lost_by_step: dict[tuple[int, int], float]   # (file, step index) → s
    by_name: dict[str, list[float]]              # kernel name → count, s, lost s
    evidence: dict[str, list[str]]


class KernelInefficiency(Rule[Params]):
    """Non-matmul kernels far below the memory roofline.

    What it finds: norm, elementwise, reduction and optimizer kernels whose bytes moved (from
    the op's recorded shapes and dtypes) divided by their duration is under a quarter of the
    part's HBM bandwidth (3,350 GB/s on H100 SXM). The time beyond bytes ÷ bandwidth is the
    part of `non_matmul` they waste; this rule reports it and claims no separate bucket.

    Why it costs MFU: these kernels do no model FLOPs; at the roofline they would take a
    fraction of the time, and every extra microsecond is the GEMMs' time.

    What to do: fuse them (torch.compile, fused LayerNorm/RMSNorm, fused AdamW `fused=True`
    or `foreach=True`, Apex/Transformer Engine kernels), avoid small launches, keep tensors
    contiguous. Inference has no optimizer: CUDA graphs for the many small launches.
    """

    code = "MFU008"
    slug = "kernel-inefficiency"
    bucket = None
    claim_order = 100
    Params = Params

    def digest(self, ctx: RankContext) -> SlowKernelDigest | None:
        """This rank's kernels under the roofline, by name, and the time they lose by step."""
        hbm = ctx.hbm_gbps
        if not hbm:
            return None
        tl = ctx.tl
        lost_by_step: dict[tuple[int, int], float] = defaultdict(float)
        by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        evidence: dict[str, list[str]] = defaultdict(list)
        # Which kernels are slow, decided over whole columns; the sums below then run over those
        # alone, in activity order, so each float is added as it always was.
        nbytes = np.array([b or 0.0 for b in tl.bytes_moved], dtype=np.float64)
        dur = (tl.end_ns - tl.ts_ns) * 1e-9
        ideal = nbytes / (hbm * 1e9)
        with np.errstate(divide="ignore", invalid="ignore"):
            slow = (tl.kclass == "other") & (nbytes != 0) & (tl.step_of >= 0) & (dur > 0) & \
                (ideal / dur < self.params.min_bw_fraction)
        names = tl.name
        for i in np.flatnonzero(slow).tolist():
            lost = float(dur[i] - ideal[i])
            lost_by_step[(tl.file_id, int(tl.step_of[i]))] += lost
            row = by_name[names[i]]
            row[0] += 1
            row[1] += float(dur[i])
            row[2] += lost
            if len(evidence[names[i]]) < EVIDENCE:
                evidence[names[i]].append(f"act:{tl.file_id}:{i}")
        # Plain dicts: a digest may cross processes (pickled), and defaultdicts of lambdas cannot.
        return SlowKernelDigest(dict(lost_by_step), dict(by_name), dict(evidence))

    def findings(self, run: RunContext) -> list[Finding]:
        hbm = run.peak.hbm_gbps
        if not hbm:
            return []
        lost_by_step: dict[tuple[int, int], float] = defaultdict(float)
        by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        evidence: dict[str, list[str]] = defaultdict(list)
        for r in run.ranks:
            d: SlowKernelDigest | None = r.rules.get(self.code)
            if d is None:
                continue
            lost_by_step.update(d.lost_by_step)
            for name, row in d.by_name.items():
                total = by_name[name]
                for j in range(3):
                    total[j] += row[j]
                evidence[name] += d.evidence[name]
        windows = {(k[0], k[1]): s.window_ns * 1e-9 for k, s in run.states.items()}
        n = len(run.ledgers) or 1
        frac = sum(lost / windows[k] for k, lost in lost_by_step.items() if windows.get(k)) / n
        if frac < self.params.min_fraction:
            return []
        worst = sorted(by_name, key=lambda k: -by_name[k][2])[: self.params.top_kernels]
        rows = [{"kernel": k, "count": int(by_name[k][0]), "time_ms": by_name[k][1] * 1e3, "lost_ms": by_name[k][2] * 1e3}
                for k in worst]
        files = {fid for fid, _ in lost_by_step}
        ranks = sorted({r.rank for r in run.ranks if r.file_id in files})
        summary = (f"non-matmul kernels below {self.params.min_bw_fraction:.0%} of HBM bandwidth waste {frac:.1%} "
                   f"of the step; worst: {worst[0][:80]}")
        optimizer = f"{run.optimizer_knob}, " if run.optimizer_knob else ""
        advice = (f"fuse memory-bound kernels: {run.compile_knob}, fused RMSNorm/LayerNorm, {optimizer}"
                  "Transformer Engine/Apex kernels; avoid many tiny launches")
        if run.inference:   # no optimizer step to fuse
            advice = (f"fuse memory-bound kernels: {run.compile_knob}, fused RMSNorm/LayerNorm and rotary/activation "
                      "kernels, Transformer Engine/Apex kernels"
                      + ("" if run.uses("cuda_graphs") else f"; {run.graphs_knob} for many tiny launches"))
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, frac * _mean_window(run), ranks, [],
            [e for k in worst for e in evidence[k][:EVIDENCE]], advice, summary, run.what_if(frac),
            {"kernels": rows, "hbm_gbps": hbm},
            bucket="non_matmul", recoverable_fraction=frac,   # the time beyond bytes at HBM bandwidth
        )]


def _mean_window(run: RunContext) -> float:
    return sum(lg.window_s for lg in run.ledgers) / len(run.ledgers) if run.ledgers else 0.0
