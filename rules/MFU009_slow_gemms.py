"""MFU009 slow-gemms."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from diag.attribution import gemm_shape
from diag.attribution.analysis import Finding, RankContext, RunContext, mfu_missing, severity
from diag.attribution.digest import TF32_KERNEL
from diag.attribution.resident_comm import Resident, resident, summarize
from diag.attribution.workload_mix import CONV
from diag.knowledge import hardware
from rules.base import Rule

# A CPU-only run's matmul ops below the peak given: what sets a CPU's matmul rate.
HOST_ADVICE = ("matmul ops on the host run below the --peak-tflops given: check the intra-op threads "
               "(torch.get_num_threads(), OMP_NUM_THREADS: one per physical core) and that oneDNN/MKL runs them "
               "(torch.backends.mkldnn.is_available()); larger batches fill the cores' vector units better")


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01
    top_shapes: int = 8


# cuBLAS names its split-K kernels (and the reduction after them) in the kernel name.
_SPLIT_K = re.compile(r"split_?k|splitK", re.IGNORECASE)
WGRAD = re.compile(r"wgrad", re.IGNORECASE)
CONV_BACKWARD_OPS = frozenset({"aten::convolution_backward", "aten::cudnn_convolution_backward_weight",
                               "aten::cudnn_convolution_backward"})
# The ops PyTorch launches a layout change under: a transpose made contiguous before the GEMM.
_LAYOUT_OPS = frozenset({"aten::copy_", "aten::clone", "aten::contiguous"})
# ...but aten::copy_ is also autocast's cast of fp32 weights to bf16/fp16, which changes no layout:
# torch's Copy.cu runs those as bfloat16_copy_kernel_cuda / float16_copy_kernel_cuda /
# float8_copy_kernel_cuda (a real bf16 H200 convnet put one before every convolution).
_CAST_KERNEL = re.compile(r"(bfloat16|float16|float8\w*)_copy_kernel")
EVIDENCE = 3


class ShapeClass(msgspec.Struct):
    """One GEMM/attention shape on one rank: what ran, and what about it a user can change."""

    kind: str                               # gemm | attention
    op: str | None
    mnk: tuple[int, int, int] | None
    dtype: str | None
    kernel: str
    count: int = 0
    time_s: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0                      # 0: unknown
    causes: set[str] = msgspec.field(default_factory=set)
    evidence: list[str] = msgspec.field(default_factory=list)

    @property
    def key(self) -> tuple[object, ...]:
        return (self.kind, self.op, self.mnk, self.dtype)


class SlowGemmDigest(msgspec.Struct, frozen=True):
    file_id: int
    classes: list[ShapeClass]
    cls: npt.NDArray[np.int64]              # per kernel: index into classes
    step: npt.NDArray[np.int64]
    dur_s: npt.NDArray[np.float64]
    flops: npt.NDArray[np.float64]
    matmul_s: float = 0.0                   # all GEMM/attention kernel time in steps, FLOPs known or not ...
    conv_s: float = 0.0                     # ... and the part of it convolutions ran
    resident: Resident | None = None        # communication kernels beside the GEMMs (resident_comm.py)


# cuBLAS/cuDNN kernels that run on tensor cores by their names (HMMA/xmma/tensorop, the Volta
# h884/s884 and Turing/Ampere h1688/s1688/16816 instruction shapes): an unaligned M did not keep them off.
_TENSOR_CORE_KERNEL = re.compile(r"tensorop|xmma|hmma|[hs]884|[hs]1688|16816|wgmma|mfma", re.IGNORECASE)
# A dimension pays for a partial tile when padding it to TILE would add at least this share of work.
TILE, TILE_WASTE = 64, 0.10
# Resident communication is named when it runs beside GEMMs this share of the step, holding this
# share of the SMs (a tenth: NCCL's ring all-reduce on 16 channels holds 16 of H100's 132).
RESIDENT_SHARE, RESIDENT_SMS = 0.2, 0.1
FP32_CAUSE = "fp32"   # worded in findings(), where the part's peaks are known


def layout_copy(op: str | None, kernel: str) -> bool:
    """A kernel that copies a tensor into another layout (a transpose made contiguous), not a cast."""
    return op in _LAYOUT_OPS and not _CAST_KERNEL.search(kernel)


def causes_of(mnk: tuple[int, int, int] | None, dtype: str | None, kernel: str, op: str | None,
              after_layout_copy: bool, beside_softmax: bool = False) -> set[str]:
    """What about one GEMM a user can change, each as the advice that fixes it, naming the dims
    that need it."""
    out = set()
    if mnk is not None:
        align = 16 if dtype == "fp8" else 8
        # M (the output's rows) is tiled without an alignment need of its own: on a tensor-core
        # kernel only N and K are judged (788×3072×768 already ran on tensor cores).
        judged = (("N", mnk[1]), ("K", mnk[2])) if _TENSOR_CORE_KERNEL.search(kernel) else \
            (("M", mnk[0]), ("N", mnk[1]), ("K", mnk[2]))
        off = [f"{name}={d}" for name, d in judged if d % align]
        partial = [f"{name}={d}" for name, d in zip("MNK", mnk, strict=True)
                   if d % TILE and (-d % TILE) / (d + -d % TILE) >= TILE_WASTE]
        shape = "×".join(map(str, mnk))
        if off:
            out.add(f"pad {', '.join(off)} ({shape}) to a multiple of {align} (tensor cores need it)")
        elif partial:
            out.add(f"pad {', '.join(partial)} ({shape}) to a multiple of {TILE} (a partial tile wastes over "
                    f"{TILE_WASTE:.0%} of its work)")
    if dtype == "fp32" and not TF32_KERNEL.search(kernel):
        out.add(FP32_CAUSE)
    if after_layout_copy:
        out.add("a transpose is copied before the GEMM: keep weights/activations in the layout the GEMM reads")
    # Split-K over a long reduction is the right kernel, not a symptom: a weight gradient reduces
    # over the tokens (on an H200 convnet, cuDNN's wgrad kernels are *_execute_split_k_kernel and
    # their ReduceSplitK follows, both under aten::convolution_backward), and more tokens would
    # only lengthen K.
    reduction_bound = WGRAD.search(kernel) is not None or (op or "") in CONV_BACKWARD_OPS
    if _SPLIT_K.search(kernel) and not reduction_bound:
        out.add("split-K on a small shape: batch more tokens per GEMM")
    if gemm_shape.attention_shaped(op, mnk, beside_softmax):
        out.add("attention as batched matmuls around a softmax: use F.scaled_dot_product_attention / FlashAttention")
    return out


_PAD = re.compile(r"^pad (.+) (to a multiple of .+)$")


def _merge_padding(causes: list[str]) -> list[str]:
    """One line per padding target, listing each shape's dims: "pad N=647, K=30 (98304×647×30);
    K=1705 (1024×1024×1705) to a multiple of 8 ..."."""
    out: list[str] = []
    dims: dict[str, list[str]] = {}
    for c in causes:
        m = _PAD.match(c)
        if m is None:
            out.append(c)
        else:
            dims.setdefault(m.group(2), []).append(m.group(1))
    return [f"pad {'; '.join(d)} {target}" for target, d in dims.items()] + out


def precision_advice(part: hardware.Part | None, dtype: str, convs: bool) -> str | None:
    """Mixed precision first when the matmuls run in fp32 (or TF32) on a part whose 16-bit tensor
    cores peak at least twice as high, with the ratio from parts.toml; TF32 where the part has it."""
    if part is None or dtype not in ("fp32", "tf32") or dtype not in part.dense_tflops:
        return None
    fast = "bf16" if "bf16" in part.dense_tflops else "fp16" if "fp16" in part.dense_tflops else None
    if fast is None or part.dense_tflops[fast] < 2 * part.dense_tflops[dtype]:
        return None
    ratio = part.dense_tflops[fast] / part.dense_tflops[dtype]
    what = "matmuls and convolutions" if convs else "matmuls"
    text = (f"{what} run in {dtype} on {part.name}, whose {fast} tensor-core peak is {ratio:.0f}× its "
            f"{dtype} peak ({part.dense_tflops[fast]:g} vs {part.dense_tflops[dtype]:g} TFLOP/s dense): train in "
            f"mixed precision (torch.autocast(\"cuda\", dtype=torch.{'bfloat16' if fast == 'bf16' else 'float16'})"
            + (", with GradScaler" if fast == "fp16" else "") + ")")
    if dtype == "fp32" and "tf32" in part.dense_tflops:
        text += (f", or TF32 at least ({part.dense_tflops['tf32']:g} TFLOP/s: torch.backends.cuda.matmul.allow_tf32 "
                 "= True" + (", torch.backends.cudnn.allow_tf32 = True" if convs else "") + ")")
    if convs:
        text += "; convolutions in channels_last (model.to(memory_format=torch.channels_last))"
    return text


def fallback_advice(part: hardware.Part | None, convs: bool, smi: str) -> str:
    """No cause in the trace: what is left to try, for what the part and the ops allow. Transformer
    Engine's kernels are linear layers and attention on Hopper and later (fp8 in the part's
    table), never convolutions."""
    tries = ['torch.compile(mode="max-autotune")']
    if not convs and part is not None and "fp8" in part.dense_tflops:
        tries.append("Transformer Engine kernels")
    if convs:
        tries.append("torch.backends.cudnn.benchmark = True")
    return f"no layout or dtype cause in the trace: try {' or '.join(tries)}, and check clocks ({smi})"


class SlowGemms(Rule[Params]):
    """GEMMs and attention kernels slower than their shape can run on this part.

    What it finds: the `gemm_inefficiency` bucket — time GEMM and attention kernels spend beyond
    their FLOPs at the dense peak, thin GEMMs (MFU003) aside. Per shape class (op, M×N×K, dtype)
    it compares the achieved TFLOP/s with what that shape can reach on this part: the roofline of
    its arithmetic intensity (FLOPs ÷ bytes × HBM bandwidth), capped at the fraction of the dense
    peak the best kernels reach there (data/gemm_ceiling.csv: 75% on Hopper, 73% on A100, each row
    cited). The time beyond that is what a fix can win; the rest of the bucket is the normal
    distance of good kernels from the datasheet.

    Why it costs MFU: the tensor cores sit partly idle inside a kernel that could run faster.

    What to do: per worst shape, the cause the trace shows — M, N, K not multiples of 8/16/64
    (pad them), fp32 matmuls without TF32 (`torch.backends.cuda.matmul.allow_tf32 = True`),
    transposes copied beside the GEMM (fix the layout), split-K on small shapes (more tokens per
    GEMM), attention as plain matmuls (`F.scaled_dot_product_attention`); otherwise
    `torch.compile(mode="max-autotune")` or Transformer Engine kernels.
    """

    code = "MFU009"
    slug = "slow-gemms"
    bucket = "gemm_inefficiency"
    Params = Params

    def digest(self, ctx: RankContext) -> SlowGemmDigest | None:
        tl = ctx.tl
        classes: dict[tuple[object, ...], int] = {}
        rows: list[ShapeClass] = []
        idx: list[int] = []
        cls: list[int] = []
        names, moved, stream = tl.name, tl.bytes_moved, tl.stream
        # Python lists, not NumPy scalars, for the walk over every activity (a third of its time).
        kernel, kclass, flops, step_of = tl.kernel.tolist(), tl.kclass.tolist(), tl.flops.tolist(), tl.step_of.tolist()
        fits = ctx.gemm_fits
        last_on_stream: dict[object, int] = {}
        matmul_s = conv_s = 0.0
        for i in range(len(tl)):
            prev = last_on_stream.get(stream[i])
            if kernel[i]:
                last_on_stream[stream[i]] = i
            kind = kclass[i]
            if kind not in ("gemm", "attention") or step_of[i] < 0:
                continue
            dur = float(tl.end_ns[i] - tl.ts_ns[i]) * 1e-9
            matmul_s += dur
            if CONV.search(names[i] or "") or CONV.search(tl.op_name[i] or ""):
                conv_s += dur
            if flops[i] <= 0:
                continue
            mnk = tl.gemm_mnk[i]
            if kind == "gemm" and (fit := fits.get(i)) is not None and fit.thin:
                continue   # MFU003's
            sc = ShapeClass(kind, tl.op_name[i], mnk, tl.dtype[i], names[i] or "")
            j = classes.setdefault(sc.key, len(rows))
            if j == len(rows):
                rows.append(sc)
            row = rows[j]
            row.count += 1
            row.time_s += float(tl.end_ns[i] - tl.ts_ns[i]) * 1e-9
            row.flops += float(tl.flops[i])
            row.bytes += moved[i] or 0.0
            layout = prev is not None and tl.kclass[prev] == "other" and layout_copy(tl.op_name[prev], names[prev] or "")
            row.causes |= causes_of(mnk, tl.dtype[i], names[i] or "", tl.op_name[i], layout, i in ctx.attention_bmms)
            if len(row.evidence) < EVIDENCE:
                row.evidence.append(f"act:{tl.file_id}:{i}")
            idx.append(i)
            cls.append(j)
        if not matmul_s:
            return None
        a = np.asarray(idx, np.int64)
        return SlowGemmDigest(tl.file_id, rows, np.asarray(cls, np.int64), tl.step_of[a],
                              ((tl.end_ns[a] - tl.ts_ns[a]) * 1e-9).astype(np.float64), tl.flops[a],
                              matmul_s, conv_s, resident(tl))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("gemm_inefficiency")
        if frac < self.params.min_fraction:
            return []
        digests: list[SlowGemmDigest] = [r.rules[self.code] for r in run.ranks if r.rules.get(self.code)]
        ranks, steps = run.involved("gemm_inefficiency", 0.0)
        lost_s = run.mean_seconds("gemm_inefficiency")
        peak = run.peak.flops_per_s
        if peak is None or run.mfu is None:
            # The bucket holds all GEMM/attention time, model compute included: no inefficiency
            # to advise on, only the input that would split it (issue 36) and, where the run's
            # dtype leaves the part's tensor cores idle, the precision lever, which needs no FLOPs.
            part, convs = self._part_and_convs(run, digests)
            precision = precision_advice(part, run.peak.dtype, convs)
            host = run.host_timeline
            split = mfu_missing(peak is not None, host, run.peak.part_name is not None) + \
                " to split GEMM time into model compute and inefficiency"
            return [Finding(
                self.code, self.slug, "info", frac, lost_s, ranks, steps, [],
                "; ".join([precision, split] if precision else [split]),
                f"{'matmul ops on the host' if host else 'GEMM/attention kernels'} take {frac:.1%} of the step; without "
                f"{'model FLOPs' if peak is not None else 'a peak'} it is not split into model compute and loss",
                None, {}, bucket="gemm_inefficiency", recoverable_fraction=0.0,
            )]
        ceiling = gemm_shape.ceiling_of(run.peak.part_key)
        cap = ceiling.ceiling if ceiling else 1.0
        hbm = run.peak.hbm_gbps * 1e9 if run.peak.hbm_gbps else None
        merged: dict[tuple[object, ...], ShapeClass] = {}
        gain_by_class: dict[tuple[object, ...], float] = defaultdict(float)
        windows = {k: st.window_ns * 1e-9 for k, st in run.states.items()}
        recoverable = 0.0
        for d in digests:
            reach = np.array([gemm_shape.reachable_flops_per_s(
                run.peak.of_kernel(c.dtype, c.kernel), cap, gemm_shape.intensity(c.flops, c.bytes), hbm)
                for c in d.classes])
            gain = np.maximum(d.dur_s - d.flops / reach[d.cls], 0.0)
            for step in np.unique(d.step).tolist():
                if windows.get((d.file_id, step)):
                    recoverable += float(gain[d.step == step].sum()) / windows[(d.file_id, step)]
            for j, c in enumerate(d.classes):
                m = merged.setdefault(c.key, ShapeClass(c.kind, c.op, c.mnk, c.dtype, c.kernel))
                m.count += c.count
                m.time_s += c.time_s
                m.flops += c.flops
                m.bytes += c.bytes
                m.causes |= c.causes
                m.evidence += c.evidence[: EVIDENCE - len(m.evidence)]
                gain_by_class[c.key] += float(gain[d.cls == j].sum())
        recoverable = min(recoverable / max(len(run.ledgers), 1), frac)
        worst = sorted(merged.values(), key=lambda c: -gain_by_class[c.key])[: self.params.top_shapes]
        rows: list[dict[str, Any]] = []
        for c in worst:
            flop_per_byte = gemm_shape.intensity(c.flops, c.bytes)
            reachable = gemm_shape.reachable_flops_per_s(run.peak.of_kernel(c.dtype, c.kernel), cap,
                                                         flop_per_byte, hbm)
            rows.append({
                "kind": c.kind, "op": c.op, "mnk": list(c.mnk) if c.mnk else None, "dtype": c.dtype,
                "kernel": c.kernel[:120], "count": c.count, "time_ms": c.time_s * 1e3,
                "achieved_tflops": c.flops / c.time_s / 1e12 if c.time_s else None,
                "reachable_tflops": reachable / 1e12, "flop_per_byte": flop_per_byte,
                "recoverable_ms": gain_by_class[c.key] * 1e3, "causes": sorted(c.causes),
            })
        host = run.host_timeline
        summary = (f"{'matmul ops on the host' if host else 'GEMM/attention kernels'} below peak cost {frac:.1%} of "
                   f"the step, {recoverable:.1%} recoverable")
        if rows and rows[0]["achieved_tflops"] is not None and gain_by_class[worst[0].key] > 0:
            r0 = rows[0]
            shape = "×".join(map(str, r0["mnk"])) if r0["mnk"] else r0["kind"]
            # A CPU's TFLOP/s are fractions: three significant digits where a GPU's read as integers.
            rate = (lambda x: f"{x:.3g}") if host else (lambda x: f"{x:.0f}")
            summary += (f"; worst: {r0['op'] or r0['kind']} {shape} {r0['dtype'] or ''} at "
                        f"{rate(r0['achieved_tflops'])} TFLOP/s where its shape can reach {rate(r0['reachable_tflops'])}")
        causes = sorted({x for c in worst if gain_by_class[c.key] > 0 for x in c.causes})
        beside = summarize([(d.file_id, d.resident) for d in digests if d.resident is not None], set(run.states))
        # The causes (tensor-core alignment, TF32, split-K) and knobs are a GPU's: a CPU's are its threads.
        advice = HOST_ADVICE if host else "; ".join(self._advice(run, causes, digests) + self._resident_advice(run, beside))
        return [Finding(
            self.code, self.slug, severity(recoverable * 100), frac, lost_s, ranks, steps,
            [e for c in worst for e in c.evidence], advice, summary, run.what_if(recoverable),
            {"shapes": rows, "ceiling": cap, "ceiling_source": ceiling.source if ceiling else
             "no ceiling known for this part: measured against the dense peak", "resident_comm": beside},
            bucket="gemm_inefficiency", recoverable_fraction=recoverable,
        )]

    def _advice(self, run: RunContext, causes: list[str], digests: list[SlowGemmDigest]) -> list[str]:
        """The worst shapes' causes; fp32 worded for the part (precision_advice), and with no cause
        of a shape, the run's own dtype on the part, else what is left to try (fallback_advice)."""
        part, convs = self._part_and_convs(run, digests)
        lines = _merge_padding([c for c in causes if c != FP32_CAUSE])
        if FP32_CAUSE in causes:
            lines.insert(0, precision_advice(part, "fp32", convs) or (
                "fp32 matmuls without TF32: torch.backends.cuda.matmul.allow_tf32 = True (or "
                "torch.set_float32_matmul_precision('high')), or train in bf16"))
        if lines:
            return lines
        precision = precision_advice(part, run.peak.dtype, convs)
        return [precision] if precision else [fallback_advice(part, convs, run.vendor.smi)]

    @staticmethod
    def _part_and_convs(run: RunContext, digests: list[SlowGemmDigest]) -> tuple[hardware.Part | None, bool]:
        """The run's part, and whether convolutions hold half its matmul time or more."""
        part = hardware.PARTS.get(run.peak.part_key) if run.peak.part_key else None
        matmul_s = sum(d.matmul_s for d in digests)
        return part, bool(matmul_s) and sum(d.conv_s for d in digests) >= matmul_s / 2

    def _resident_advice(self, run: RunContext, beside: dict[str, Any] | None) -> list[str]:
        """Communication kernels that ran beside the GEMMs a fifth of the step or more, holding a
        tenth of the SMs or more: the GEMMs had the rest of the part."""
        if beside is None or beside["share_of_step_beside_gemms"] < RESIDENT_SHARE:
            return []
        held, sms = beside["sms_held"], beside["sms"]
        if not held or not sms or held / sms < RESIDENT_SMS:
            return []
        knob = ("deep_ep.Buffer.set_num_sms" if run.uses("deepep") else
                f"{run.vendor.collectives}'s NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS")
        return [f"communication kernels ({', '.join(k[:60] for k in beside['kernels'][:2])}) run beside the GEMMs "
                f"{beside['share_of_step_beside_gemms']:.0%} of the step holding {held} of {sms} SMs: the GEMMs "
                f"get the rest; give communication fewer SMs ({knob}) where its own time allows"]
