"""MFU004 recompute."""

from __future__ import annotations

import msgspec

from diag.attribution.analysis import Finding, RankContext, RunContext, StepContext, severity
from diag.attribution.ledger import StepLedger
from rules.base import Rule

# Recomputed kernels a finding points at (the first ones, in rank order).
EVIDENCE = 20


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01
    # Selective recomputation (Korthikanti et al. 2022, §4.2) re-runs the attention core alone,
    # no linear layer; full recomputation re-runs whole layers, their projections and MLP GEMMs
    # too. Recomputed FLOPs more than this share in linear-layer GEMMs are full recomputation. Not
    # a share of the forward FLOPs: torch.utils.checkpoint stops recomputing once the tensors the
    # backward needs are back (a block's last linear is skipped), and the head is never
    # checkpointed, so full recomputation of every block re-ran 62.5% of the forward FLOPs in a
    # real H200 capture (tests/data/gpu_captures/h200/example_full).
    full_gemm_share: float = 0.1


class Recompute(Rule[Params]):
    """Forward work executed twice by activation checkpointing.

    What it finds: forward ops (matmuls, attention) run again inside the backward pass, their
    FLOPs at the dense peak claimed as `recompute` — the gap between HFU (which counts them) and
    MFU (which does not) — and whether the recomputation is full (the whole layer) or selective.

    Why it costs MFU: recomputed FLOPs keep the GPU busy without advancing the model; full
    recomputation adds a third forward pass (8N instead of 6N FLOPs per token).

    What to do: checkpoint selectively — attention only (Megatron `--recompute-granularity
    selective`, a `torch.utils.checkpoint` policy saving matmul outputs), checkpoint fewer
    layers (`--recompute-num-layers`), or free memory another way (FSDP/ZeRO sharding,
    activation offload) so less recomputation is needed.
    """

    code = "MFU004"
    slug = "recompute"
    bucket = "recompute"
    claim_order = 5
    Params = Params

    def digest(self, ctx: RankContext) -> list[str]:
        tl = ctx.tl
        return [f"act:{tl.file_id}:{i}" for i, p in enumerate(tl.phase) if p == "recompute" and tl.flops[i] > 0][:EVIDENCE]

    def claim(self, ctx: StepContext, ledger: StepLedger) -> None:
        peak = ctx.peak.flops_per_s
        if peak is not None and ctx.states.model_flops is not None:
            ledger.claim("recompute", ctx.states.recompute_flops / peak, ("matmul", "non_matmul"))
        else:
            # No peak (CPU-only run, unknown part) or FLOPs not trusted: the time the recomputed
            # ops took, measured.
            ledger.claim("recompute", ctx.states.recompute_ns * 1e-9, ("matmul", "non_matmul"))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("recompute")
        if frac < self.params.min_fraction:
            return []
        rec = sum(s.recompute_flops for s in run.states.values())
        fwd = sum(s.fwd_flops for s in run.states.values())
        ratio = rec / fwd if fwd > 0 else None
        gemm = sum(s.recompute_gemm_flops for s in run.states.values())
        gemm_share = gemm / rec if rec > 0 else None
        kind = "full" if gemm_share is not None and gemm_share > self.params.full_gemm_share else "selective"
        ranks, steps = run.involved("recompute", 0.0)
        gap = (run.hfu - run.mfu) if run.hfu is not None and run.mfu is not None else None
        summary = f"{kind} recomputation: {frac:.1%} of the step re-runs forward work"
        if ratio is not None and gemm_share is not None:
            summary += (f" ({ratio:.0%} of the forward FLOPs again, {gemm_share:.0%} of them in linear layers"
                        f"{'' if kind == 'full' else ', the rest attention'})")
        if gap is not None:
            summary += f"; HFU − MFU = {gap * 100:.1f} points"
        advice = ("use selective recomputation (attention only: --recompute-granularity selective, or a "
                  "torch.utils.checkpoint policy that saves matmul outputs), checkpoint fewer layers "
                  "(--recompute-num-layers), or shard/offload to free memory instead")
        if kind == "selective":
            advice = ("recomputation is already selective; checkpoint fewer layers or free memory by "
                      + ("activation offload (FSDP is in use)" if run.uses("fsdp") else
                         "sharding (FSDP/ZeRO) or activation offload"))
        evidence = [e for r in run.ranks for e in r.rules.get(self.code) or ()][:EVIDENCE]
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("recompute"), ranks, steps,
            evidence, advice, summary, run.what_if(frac),
            {"kind": kind, "recompute_over_forward_flops": ratio, "recompute_linear_share": gemm_share,
             "hfu_minus_mfu": gap},
            bucket="recompute", recoverable_fraction=frac,   # memory freed otherwise needs no replay
        )]
