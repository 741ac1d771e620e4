"""What a GPU kernel is, from its name: the table the timeline sweep and the rules share.

Classes:

- `gemm`: matrix multiplies, and convolutions, which cuDNN runs as (implicit) GEMMs, with the
  helper kernels of those algorithms (split-K reductions, epilogues, Winograd/FFT transforms):
  their time is time spent doing model FLOPs.
- `attention`: fused attention (FlashAttention, memory-efficient/xformers, cuDNN SDPA).
- `comm`: collectives and point-to-point transfers (NCCL, RCCL, MSCCL, symmetric memory).
- `copy`: SM kernels that only move bytes (`copy_`/`.to()`/`.contiguous()`, `torch.cat`, layout
  transposes). They occupy SMs, so for the GPU-state sweep they are compute, not the `memcpy`
  state that copy-engine `Memcpy` events are; the class lets a rule name them.
- `memset`: `Memset` events, and fill kernels (`zero_`, `fill_`): a memset done on SMs.
- `other`: everything else: norms, elementwise, reductions, optimizer steps, embeddings,
  Triton pointwise/reduction kernels, and names that say nothing (old Triton `triton__0d1d2d`).

Matching is on the kernel's *head*: the demangled name without `void ` and without its
parameter list, template arguments kept (`cutlass::Kernel<cutlass_80_tensorop_s1688gemm_...>`
names its GEMM there), so a parameter type such as `cublasGemvParams` or `cudnn::reduced_divisor`
cannot make an elementwise kernel look like a GEMM. The first matching pattern wins.

Memcpy/memset *events* are typed by ingest (`copies.kind`); `classify` also accepts their names
("Memcpy HtoD (Pageable -> Device)", "Memset (Device)") so one function covers every GPU event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache


class KernelClass(str, Enum):
    """A StrEnum (spelled for Python 3.10, which pyproject still allows)."""

    GEMM = "gemm"
    ATTENTION = "attention"
    COMM = "comm"
    COPY = "copy"
    MEMSET = "memset"
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class KernelPattern:
    kernel_class: KernelClass
    regex: re.Pattern[str]
    emitted_by: str  # the library whose kernels this names


def _p(kernel_class: KernelClass, regex: str, emitted_by: str, flags: int = 0) -> KernelPattern:
    return KernelPattern(kernel_class, re.compile(regex, flags), emitted_by)


_I = re.IGNORECASE
_G, _A, _C = KernelClass.GEMM, KernelClass.ATTENTION, KernelClass.COMM

# Ordered: the first match wins. Communication first (nothing else is named nccl*), then the
# event names, then attention before GEMM (CUTLASS-based attention kernels contain `cutlass`).
PATTERNS: tuple[KernelPattern, ...] = (
    # NCCL: ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem) (2.x to 2.18) and
    # ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>) (2.19+);
    # RCCL (AMD) keeps NCCL's names; MSCCL: mscclKernel_*.
    _p(_C, r"^(nccl|rccl|msccl)\w*Kernel", "NCCL / RCCL / MSCCL"),
    _p(_C, r"\b(one_shot|two_shot|multimem)_all_(reduce|gather)", "PyTorch symmetric memory (c10d)"),
    _p(_C, r"\bcross_device_reduce", "vLLM custom all-reduce"),
    _p(_C, r"\bdeep_ep::", "DeepEP (MoE all-to-all over NVSHMEM)"),
    # Copy-engine events as Kineto names them (NVIDIA and ROCm spellings).
    _p(KernelClass.COPY, r"^(Memcpy|Copy(Host|Device)To)", "CUDA/HIP runtime memcpy event"),
    _p(KernelClass.MEMSET, r"^(Memset|FillBuffer)", "CUDA/HIP runtime memset event"),
    # Inductor names its pointwise/reduction kernels after the ops they fuse: triton_poi_fused_addmm_relu_0
    # is a GEMM's epilogue, triton_poi_fused__scaled_dot_product_efficient_attention_0 a layout copy.
    _p(KernelClass.OTHER, r"^triton_(poi|red|per)_", "Inductor pointwise / reduction kernels"),
    # Attention.
    _p(
        _A,
        r"flash_fwd|flash_bwd|flash::|flash_attn|FlashAttn",
        "FlashAttention 2/3 (Dao-AILab, pytorch_flash)",
    ),
    _p(_A, r"fmha", "PyTorch mem-efficient / xformers (fmha_cutlassF/B), CK and TensorRT fMHA"),
    _p(_A, r"sdpa", "cuDNN SDPA (cudnn_generated_fort_native_sdpa_*)"),
    _p(
        _A,
        r"efficient_attention|attention_kernel|AttentionKernel|AttentionBackwardKernel",
        "PyTorch mem-efficient attention",
    ),
    _p(_A, r"^triton_tem_\w*(flex_attention|attention)", "Inductor flex-attention template"),
    _p(_A, r"^_attn_(fwd|bwd)", "Triton FlashAttention (ROCm, Triton tutorial)"),
    # GEMM. `(?<!fb)` keeps FBGEMM's embedding kernels (fbgemm_gpu::...) out: the library's
    # name is not a GEMM; its real GEMMs are CUTLASS kernels and match below.
    _p(
        _G,
        r"(?<!fb)gemm|gemv",
        "cuBLAS/cuBLASLt (ampere_sgemm_*, volta_h884gemm_*, gemmk1, gemmSN, gemv2T), CK",
        _I,
    ),
    _p(_G, r"\bnvjet_", "cuBLAS Hopper/Blackwell (nvjet_tst_*, nvjet_hsh_*)"),
    _p(_G, r"cutlass", "CUTLASS (cutlass::Kernel<...>, cutlass_cudnn_*)", _I),
    _p(_G, r"\bsm\d+_xmma|xmma_gemm", "cuBLAS/cuDNN xmma kernels (sm80_xmma_*, sm90_xmma_*)"),
    _p(_G, r"cublas|splitKreduce|^epilogue::impl::", "cuBLAS/cuBLASLt split-K reduction and epilogue"),
    _p(_G, r"^Cijk_", "Tensile / hipBLASLt (rocBLAS, AMD)"),
    _p(
        _G, r"^triton_tem_\w*(mm|matmul|convolution)|(^|_)matmul_kernel", "Triton / Inductor matmul templates"
    ),
    _p(
        _G,
        r"[shi]\d*cudnn|winograd|^fft2d_(r2c|c2r)|(dgrad|wgrad)\w*(engine|alg)|reduce_wgrad|implicit_convolve|cask_cudnn",
        "cuDNN convolution (scudnn, Winograd, FFT, dgrad/wgrad engines, cask offsets)",
    ),
    # Copies on SMs.
    _p(
        KernelClass.COPY,
        r"direct_copy_kernel|CatArrayBatchedCopy|nchwToNhwc|nhwcToNchw",
        "PyTorch copy_/cat, cuDNN layout transforms",
    ),
    # Fill kernels: zero_() and fill_() are memsets done by an SM kernel.
    _p(KernelClass.MEMSET, r"FillFunctor", "PyTorch fill_/zero_"),
)


def _head(name: str) -> str:
    """`void ns::f<T, g(int)>(Args...)` -> `ns::f<T, g(int)>`: drop `void ` and the parameter list."""
    text = name.strip().replace("(anonymous namespace)", "anonymous_namespace")
    if text.startswith("void "):
        text = text[5:]
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0 and i > 0:
            return text[:i]
    return text


@lru_cache(maxsize=8192)
def classify(name: str) -> KernelClass:
    head = _head(name)
    for pattern in PATTERNS:
        if pattern.regex.search(head):
            return pattern.kernel_class
    return KernelClass.OTHER


# The collective a communication kernel runs, from its name.
_NCCL_COLLECTIVE = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")
_SYMM_MEM_COLLECTIVE = re.compile(r"_all_(reduce|gather)")
_NCCL_COLLECTIVES = {
    "AllReduce": "allreduce",
    "AllGather": "allgather",
    "AllGatherV": "allgather",
    "ReduceScatter": "reducescatter",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
    "SendRecv": "sendrecv",
    "AllToAllPivot": "alltoall",  # RCCL
    "AllToAll": "alltoall",
}


def collective_of(kernel_name: str) -> str | None:
    """allreduce | allgather | reducescatter | broadcast | reduce | alltoall | sendrecv, or None.

    None for non-communication kernels and for NCCL's `ncclDevKernel_Generic`, which runs
    whatever collective it is handed (the CPU-side record_param_comms op names it).
    NCCL runs all-to-all, gather and scatter as grouped SendRecv, so their kernels say sendrecv.
    """
    head = _head(kernel_name)
    match = _NCCL_COLLECTIVE.match(head)
    if match:
        return _NCCL_COLLECTIVES.get(match.group(1))
    if classify(kernel_name) is not KernelClass.COMM:
        return None
    if "cross_device_reduce" in head:
        return "allreduce"
    if "deep_ep::" in head:
        return "alltoall"
    symm = _SYMM_MEM_COLLECTIVE.search(head)
    return f"all{symm.group(1)}" if symm else None


# NCCL's algorithm and protocol names (src/device/generate.py: all_algos, all_protos).
_ALGO_PROTO = re.compile(
    r"_(COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|TREE|RING|PAT)_(LL128|LL|SIMPLE)(?=_|$)"
)


def nccl_algo_proto(name: str) -> tuple[str | None, str | None]:
    """(algorithm, protocol) as written in an NCCL kernel name, e.g. ("RING", "LL").

    Caution: the name is the kernel's *specialization*, not always what ran. NCCL compiles
    specialized kernels only for a few cases (generate.py's best_kernel: RING or TREE with LL)
    and runs every other algorithm/protocol through them, so an NVLS or LL128 all-reduce still
    shows `..._RING_LL`. NCCL_DEBUG=INFO or the NCCL profiler plugin says what really ran.
    """
    match = _ALGO_PROTO.search(_head(name))
    return (match.group(1), match.group(2)) if match else (None, None)


def unclassified_report(names: list[str]) -> list[str]:
    """The distinct names among `names` that fall to `other`, sorted: what PATTERNS does not name."""
    return sorted({n for n in names if classify(n) is KernelClass.OTHER})
