"""What a GPU kernel is, from its name: the table the timeline sweep and the rules share.

Classes:

- `gemm`: matrix multiplies, and convolutions, which cuDNN runs as (implicit) GEMMs, with the
  helper kernels of those algorithms (split-K reductions, epilogues, Winograd/FFT transforms):
  their time is time spent doing model FLOPs.
- `attention`: fused attention (FlashAttention, memory-efficient/xformers, cuDNN SDPA).
- `comm`: collectives and point-to-point transfers (NCCL, RCCL, MSCCL, symmetric memory,
  DeepEP expert-parallel all-to-all); `collective_of` says which (sendrecv: point-to-point).
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

The patterns are data: diag/knowledge/data/kernels.toml, one row per kernel family with a real example
name and its source (tests/test_kernels.py checks each). The same file says which dtype a GEMM's
name implies (`gemm_dtype`: nvjet_qqtst is fp8, sm90_xmma_gemm_bf16bf16 bf16). A name no row
matches is `other` and `unknown`: the report counts such kernels and lists the top ones.

Memcpy/memset *events* are typed by ingest (`copies.kind`); `classify` also accepts their names
("Memcpy HtoD (Pageable -> Device)", "Memset (Device)") so one function covers every GPU event.
"""

from __future__ import annotations

import re
import sys
from enum import Enum
from functools import lru_cache
from importlib import resources
from typing import Any

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


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


class KernelPattern(msgspec.Struct, frozen=True):
    """One [[kernel]] row of data/kernels.toml."""

    kernel_class: KernelClass
    regex: re.Pattern[str]
    example: str  # a real kernel name this row names
    source: str  # the library or trace the name comes from
    collective: str | None = None  # what a communication kernel of this name runs, when fixed


class DtypePattern(msgspec.Struct, frozen=True):
    """One [[gemm_dtype]] row of data/kernels.toml: the dtype a matmul kernel's name says."""

    dtype: str
    regex: re.Pattern[str]
    example: str
    source: str


TABLE = "data/kernels.toml"


def _regex(row: dict[str, Any]) -> re.Pattern[str]:
    return re.compile(row["pattern"], re.IGNORECASE if row.get("flags") == "i" else 0)


def _load() -> tuple[tuple[KernelPattern, ...], tuple[DtypePattern, ...]]:
    table = tomllib.loads(resources.files("diag.knowledge").joinpath(TABLE).read_text(encoding="utf-8"))
    kernels = tuple(
        KernelPattern(KernelClass(r["class"]), _regex(r), r["example"], r["source"], r.get("collective"))
        for r in table["kernel"]
    )
    dtypes = tuple(DtypePattern(r["dtype"], _regex(r), r["example"], r["source"]) for r in table["gemm_dtype"])
    return kernels, dtypes


# Ordered: the first match wins (communication first, then attention before GEMM: see the table).
PATTERNS, DTYPE_PATTERNS = _load()
_MATMUL = (KernelClass.GEMM, KernelClass.ATTENTION)


@lru_cache(maxsize=8192)
def head(name: str) -> str:
    """`void ns::f<T, g(int)>(Args...)` -> `ns::f<T, g(int)>`: drop `void ` and the parameter list.
    Cached: a run repeats a few hundred names, and the walk over a 300-character template name
    costs ~17 µs (12k critical-path segments of the control trace spent 0.2 s here)."""
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


def short(name: str, width: int = 72) -> str:
    """A kernel's name to read in a table, at most about `width` characters, cut only where C++ puts a
    boundary: `void` and the parameters go (head), then the template arguments nested deepest, then
    those of the outermost template after the last argument that fits, marked with "…". Never mid-
    identifier: `ampere_sgemm_128x64_nn` stays whole, however long."""
    text = head(name)
    for keep in (2, 1):
        if len(text) <= width:
            return text
        text = _collapsed(text, keep)
    if len(text) <= width:
        return text
    cut = max(text.rfind(", ", 0, width), text.find("<"))
    if cut <= 0:
        return text
    return text[:cut + 1] + "…>" if text[cut] == "<" else text[:cut] + ", …>"


def _collapsed(text: str, keep: int) -> str:
    """Template arguments nested deeper than `keep` levels written as "…": f<a<b<c>>> → f<a<…>> (keep 1)."""
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            depth += 1
            if depth == keep + 1:
                out.append("<…")
            elif depth <= keep:
                out.append(ch)
        elif ch == ">":
            if depth <= keep + 1 and depth > 0:
                out.append(">")
            depth = max(depth - 1, 0)
        elif depth <= keep:
            out.append(ch)
    return "".join(out)


@lru_cache(maxsize=8192)
def match(name: str) -> KernelPattern | None:
    """The first row of the table that names this kernel, or None: an unknown name."""
    text = head(name)
    return next((p for p in PATTERNS if p.regex.search(text)), None)


def classify(name: str) -> KernelClass:
    pattern = match(name)
    return KernelClass.OTHER if pattern is None else pattern.kernel_class


@lru_cache(maxsize=8192)
def gemm_dtype(name: str) -> str | None:
    """The dtype a GEMM or attention kernel computes in, where its name says (hardware.toml keys)."""
    if classify(name) not in _MATMUL:
        return None
    text = head(name)
    # The first row that matches decides; "" is a row saying the name gives no dtype.
    return next((p.dtype for p in DTYPE_PATTERNS if p.regex.search(text)), None) or None


# The collective an NCCL/RCCL kernel runs, from its name (ncclDevKernel_AllReduce_..., ncclSymkDevKernel_...).
_NCCL_COLLECTIVE = re.compile(r"^(?:nccl|rccl)(?:Symk)?(?:Dev)?Kernel_([A-Za-z]+)")
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
    nccl = _NCCL_COLLECTIVE.match(head(kernel_name))
    if nccl:
        return _NCCL_COLLECTIVES.get(nccl.group(1))
    pattern = match(kernel_name)
    return pattern.collective if pattern is not None and pattern.kernel_class is KernelClass.COMM else None


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
    match = _ALGO_PROTO.search(head(name))
    return (match.group(1), match.group(2)) if match else (None, None)


def unclassified_report(names: list[str]) -> list[str]:
    """The distinct names among `names` that fall to `other`, sorted: what PATTERNS does not name."""
    return sorted({n for n in names if classify(n) is KernelClass.OTHER})


def unknown(name: str) -> bool:
    """No row of the table names this kernel (it counts as `other`, and the report lists it)."""
    return match(name) is None
