"""What the rules see and what they produce: step and run contexts, findings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgspec
import numpy as np

from diag.attribution import gemm_shape, workload_mix
from diag.attribution.digest import RankDigest
from diag.attribution.ledger import StepLedger, weighted_share
from diag.attribution.mesh import Mesh
from diag.knowledge import kernels
from diag.knowledge.hardware import PARTS, Part, Vendor, vendor_of
from diag.timeline.clocks import ClockOffset
from diag.timeline.collectives import Matched
from diag.timeline.rank import RankTimeline
from diag.timeline.states import IdleGaps, StepStates, idle_gaps


class Peak(msgspec.Struct, frozen=True):
    """The denominator: dense peak of the part and dtype the GEMMs ran in."""

    tflops: float | None          # None: unknown part and no --peak-tflops
    part_key: str | None
    part_name: str | None
    dtype: str
    source: str                   # how it was decided, one line
    user_tflops: float | None     # --peak-tflops as given
    hbm_gbps: float | None
    nvlink_gbps: float | None
    # dtype → share of matmul FLOPs; `tflops` is their effective peak (diag/attribution/dtype_mix.py)
    dtype_mix: Mapping[str, float] = msgspec.field(default_factory=dict)
    bf16_tflops: float | None = None  # the part's bf16 dense peak, for mfu_bf16 when the mix is not all bf16

    @property
    def flops_per_s(self) -> float | None:
        return None if self.tflops is None else self.tflops * 1e12

    def peak_dtype(self, tensor_dtype: str | None, kernel: str) -> str | None:
        """The dtype whose dense peak a matmul kernel is judged at: its own (the kernel name's, else
        its op's tensors'), where the run's peak is the effective one of a dtype mix that holds it;
        None where the run's own peak applies (one dtype, an unknown part, --peak-tflops given)."""
        dtype = kernels.gemm_dtype(kernel) or tensor_dtype
        part = PARTS.get(self.part_key) if self.part_key else None
        if part is None or dtype is None or len(self.dtype_mix) < 2 or dtype not in self.dtype_mix \
                or dtype not in part.dense_tflops or self.user_tflops is not None:
            return None
        return dtype

    def tflops_of_kernel(self, tensor_dtype: str | None, kernel: str) -> float:
        """The dense peak a matmul kernel can reach, TFLOP/s: its own dtype's (peak_dtype), else the
        run's. A bf16 GEMM of an fp8/bf16 run on an H100 SXM is judged against 989.4, never the
        mix's 1319 (issue 36). Every per-kernel ceiling and roofline is taken from here."""
        assert self.tflops is not None
        dtype = self.peak_dtype(tensor_dtype, kernel)
        return self.tflops if dtype is None else PARTS[str(self.part_key)].dense_tflops[dtype]

    def of_kernel(self, tensor_dtype: str | None, kernel: str) -> float:
        """tflops_of_kernel in FLOP/s."""
        return self.tflops_of_kernel(tensor_dtype, kernel) * 1e12

    def mfu_bf16(self, mfu: float | None) -> float | None:
        """The same model FLOPs/s against the bf16 dense peak, for comparison with published
        figures; None when the mix is all bf16 (it would repeat MFU) or either figure is unknown."""
        if mfu is None or self.tflops is None or self.bf16_tflops is None or set(self.dtype_mix) <= {"bf16"}:
            return None
        return mfu * self.tflops / self.bf16_tflops


# A dataclass where the other records are msgspec Structs: its cached properties need an instance
# __dict__, and a Struct's (dict=True) crashed the garbage collector in a test run on CPython 3.11.
@dataclass(frozen=True)
class RankContext:
    """What a rule sees of one rank in the map step, before its timeline is dropped."""

    tl: RankTimeline
    hbm_gbps: float | None        # the part's (--gpu, or this rank's device properties), None if unknown
    part: Part | None = None      # that part (SMs, peaks), None if unknown

    @cached_property
    def idle_gaps(self) -> IdleGaps:
        """The GPU's idle gaps in this rank's steps: MFU010 and MFU013 both read them, built once."""
        return idle_gaps(self.tl)

    @cached_property
    def attention_bmms(self) -> set[int]:
        """Batched matmuls a softmax stands between (gemm_shape.attention_bmms): MFU003 and MFU009
        call a bmm attention-shaped only among these."""
        return workload_mix.attention_bmms(self.tl.op_name, self.tl.stream, self.tl.kernel.tolist())

    @cached_property
    def gemm_fits(self) -> dict[int, gemm_shape.ShapeFit]:
        """Each GEMM's shape on the part (gemm_shape.fit), by activity index, for the GEMMs with a
        shape and FLOPs (NaN kept), in order; none where the part is unknown. MFU003 judges thin
        shapes by it and MFU009 leaves those out: worked out once, not twice (4.8k GEMMs a rank of
        the control trace)."""
        tl, part = self.tl, self.part
        if part is None:
            return {}
        names, moved, shapes, dtypes = tl.name, tl.bytes_moved, tl.gemm_mnk, tl.dtype
        fits = {}
        for i in np.flatnonzero((tl.kclass == "gemm") & ~(tl.flops <= 0)).tolist():
            mnk = shapes[i]
            if mnk is not None:
                fits[i] = gemm_shape.fit(mnk, float(tl.flops[i]), moved[i], names[i] or "", part, dtypes[i])
        return fits


class StepContext(msgspec.Struct, frozen=True):
    rank: RankDigest
    index: int                    # into rank.steps
    states: StepStates
    peak: Peak

    def digest(self, code: str) -> Any:
        """The per-rank digest the rule `code` made of this rank in the map step."""
        return self.rank.rules.get(code)


class _Positional(msgspec.Struct, frozen=True):
    """A Finding's positional fields: msgspec makes fields keyword-only by class, not one by one."""

    code: str
    slug: str
    severity: str                 # high | medium | low | info
    lost_fraction: float          # of step time; × 100 = the MFU points it costs in the waterfall
    lost_s: float                 # per step, mean over ranks and steps
    ranks: list[int]
    steps: list[int]
    evidence: list[str]           # ids the TUI jumps to: act:<file>:<i>, coll:<instance>, step:<rank>:<step>
    advice: str
    summary: str                  # one line: what was found, with the numbers
    what_if_mfu: float | None     # the MFU if this cause were removed
    details: dict[str, Any] = msgspec.field(default_factory=dict)


class Finding(_Positional, frozen=True, kw_only=True):
    # The ledger bucket this finding explains (None: not a time bucket, as MFU007's denominator).
    bucket: str | None
    # Of step time, the part a fix can plausibly win: all of an exposed collective; for GEMMs only
    # the gap to what their shape can reach on this part. Findings are ranked by it.
    recoverable_fraction: float
    # The bucket-removal estimate (RunContext.what_if), kept beside a what_if_mfu re-timed on the
    # critical path's graph (diag/attribution/what_if.py); equal where no re-timed what-if is built.
    what_if_mfu_naive: float | None = None

    @property
    def mfu_points(self) -> float:
        # At the dense peak the whole step would be model compute: each bucket's share of the step
        # is the MFU points it takes from 100% (the waterfall sums to the achieved MFU).
        return self.lost_fraction * 100

    @property
    def recoverable_points(self) -> float:
        return self.recoverable_fraction * 100


class RunContext(msgspec.Struct):
    ranks: list[RankDigest]                      # one per trace file (rank and capture window)
    ledgers: list[StepLedger]
    states: dict[tuple[int, int], StepStates]     # (file_id, step index) → states
    matched: list[Matched]
    offsets: dict[int, ClockOffset]
    peak: Peak
    mfu: float | None
    hfu: float | None
    world_size: int
    exposed_ns: dict[tuple[int, int], int]       # (file_id, activity index) → comm time with no compute beside it, less the wait for the last rank
    notes: list[str] = msgspec.field(default_factory=list)
    workload: str = "training"                   # "training" | "inference" (no backward pass anywhere)
    steps_excluded: list[tuple[int, int, str]] = msgspec.field(default_factory=list)   # (rank, step, why): not in the means
    flops_coverage: float | None = None           # share of GEMM/attention kernel time with FLOPs from shapes
    mfu_range: tuple[float, float] | None = None  # (lower, upper) where coverage is under the point's 90% (engine.run)
    mesh: Mesh | None = None                     # the parallel layout (attribution/mesh.py)

    @property
    def inference(self) -> bool:
        return self.workload == "inference"

    @property
    def host_timeline(self) -> bool:
        """A CPU-only run: the activities are host ops, and no GPU's causes or knobs apply."""
        return any(r.host_timeline for r in self.ranks)

    def uses(self, feature: str) -> bool:
        """Whether any rank's trace shows the run using `feature` (workload_mix.py names them;
        cuda_graphs: kernels a graph launch ran): advice never recommends it."""
        if feature == "cuda_graphs":
            return any(r.graph_launches for r in self.ranks)
        return any(r.mix is not None and feature in r.mix.features for r in self.ranks)

    @property
    def graphs_knob(self) -> str:
        """How advice names CUDA graphs for a run that has none: a serving engine's own switch where
        the trace shows vLLM or SGLang (run eager: enforce_eager, --disable-cuda-graph), else
        torch.compile's mode that captures them."""
        if self.uses("vllm"):
            return "CUDA graphs (vLLM runs eager here: drop enforce_eager=True / --enforce-eager)"
        if self.uses("sglang"):
            return "CUDA graphs (SGLang runs eager here: drop --disable-cuda-graph)"
        return 'CUDA graphs (torch.compile(mode="reduce-overhead"))'

    @property
    def compile_knob(self) -> str:
        """How advice names torch.compile: as the fix, or, where the trace shows it in use (Triton
        kernels, CompiledFunction), as more of the step under it."""
        if self.uses("torch_compile"):
            return "more of the step under torch.compile (it is in use: fewer graph breaks)"
        return "torch.compile"

    @property
    def optimizer_knob(self) -> str:
        """A fused optimizer step as advice, or "" where there is none to fuse (inference) or the
        trace shows one already (torch's FusedAdamMathFunctor, Apex/TE multi_tensor_adam)."""
        return "" if self.inference or self.uses("fused_optimizer") else "AdamW(fused=True)"

    @property
    def norm_fusion(self) -> str:
        """The fused kernels a family's memory-bound chains have: a transformer's norms (Apex,
        Transformer Engine), a convnet's conv+BN+activation; a recommender's neither."""
        family = self.family.family
        if family == "convnet":
            return "BatchNorm+activation fused after each convolution"
        if family == "recommender":
            return ""
        return "fused add+norm (Apex/Transformer Engine)"

    @property
    def family(self) -> workload_mix.Family:
        """What the run is, by its kernel mix over all ranks (workload_mix.family_of)."""
        signals: dict[str, int] = {}
        features: set[str] = set()
        for r in self.ranks:
            if r.mix is not None:
                for k, v in r.mix.signals.items():
                    signals[k] = signals.get(k, 0) + v
                features |= set(r.mix.features)
        return workload_mix.family_of(signals, features)

    @property
    def vendor(self) -> Vendor:
        """Whose link, collective library and tools advice names (parts.toml [vendor.*])."""
        names = [r.device_props.get("name") for r in self.ranks if r.device_props]
        return vendor_of(self.peak.part_key, names[0] if names else None)

    def mean_fraction(self, bucket: str) -> float:
        """The bucket's share of all analyzed rank-step time (the report's `ledger`)."""
        return weighted_share(self.ledgers, bucket)

    def mean_seconds(self, bucket: str) -> float:
        if not self.ledgers:
            return 0.0
        return sum(lg.buckets[bucket] for lg in self.ledgers) / len(self.ledgers)

    def what_if(self, fraction: float) -> float | None:
        """MFU if a cause taking `fraction` of the step were removed: the same work in less time."""
        if self.mfu is None or fraction >= 1.0:
            return None
        return self.mfu / (1.0 - fraction)

    def involved(self, bucket: str, min_fraction: float = 0.0) -> tuple[list[int], list[int]]:
        ranks = sorted({lg.rank for lg in self.ledgers if lg.fractions()[bucket] > min_fraction})
        steps = sorted({lg.step for lg in self.ledgers if lg.fractions()[bucket] > min_fraction})
        return ranks, steps


def severity(points: float) -> str:
    """From the MFU-relative cost in percent of the step: ≥10 high, ≥3 medium, ≥1 low, else info."""
    if points >= 10:
        return "high"
    if points >= 3:
        return "medium"
    if points >= 1:
        return "low"
    return "info"


def mfu_missing(peak_known: bool, host: bool = False, listed_gpu: bool = False) -> str:
    """What to pass for the MFU the trace could not give: the peak where the part is unknown (on a
    CPU-only run, the CPU's: there is no part; a trace that lists a GPU it did not record needs that
    recorded), else the model FLOPs (the part was found, and op shapes did not cover enough GEMM time)."""
    if host and listed_gpu:
        return "capture with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] (the GPU's timeline is not in the trace)"
    if not peak_known and host:
        return "pass --peak-tflops (the CPU's peak: the trace has no GPU)"
    if not peak_known:
        return "pass --gpu or --peak-tflops (the part's dense peak is unknown)"
    return "pass --model with tokens_per_step (model FLOPs are unknown), or --tokens-per-step with a preset"
