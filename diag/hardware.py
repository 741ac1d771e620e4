"""Peak FLOP/s, memory and link figures by GPU part, and identifying the part from a trace.

Every figure is the vendor datasheet's, cited beside it. Datasheets print tensor-core peaks
"with sparsity" (2:4 structured sparsity, Ampere and later) and footnote that dense is half;
MFU is always against the *dense* figure, so this table stores dense peaks and derives the
sparse ones (`sparse_peak_tflops`). Using the sparse figure as the denominator halves the
reported MFU: that is the MFU007 finding, and `sparse_peak_matches` is its check.

Units: TFLOP/s (TOP/s for int8), GB/s (10^9 bytes/s), GiB of device memory (the datasheet's
"80GB" is 80 GiB of HBM; the driver reports slightly less as `totalGlobalMem`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# Tensor-core dtypes whose datasheet figure doubles with 2:4 structured sparsity.
SPARSE_DTYPES = frozenset({"bf16", "fp16", "fp8", "fp4", "tf32", "int8"})


@dataclass(frozen=True)
class Part:
    key: str  # the CLI name: --gpu h100-sxm
    name: str  # human name, as the datasheet spells it
    sms: int
    mem_gib: int  # nominal device memory
    hbm_gbps: float  # HBM bandwidth
    nvlink_gbps: float  # NVLink bandwidth per GPU, one direction (datasheets quote both directions)
    dense_tflops: Mapping[str, float] = field(hash=False)  # dtype -> dense peak
    source: str  # the datasheet the figures come from
    has_sparsity: bool = True  # 2:4 structured sparsity (Ampere and later)


def _part(
    key: str,
    name: str,
    *,
    sms: int,
    mem_gib: int,
    hbm_gbps: float,
    nvlink_gbps: float,
    dense_tflops: dict[str, float],
    source: str,
    has_sparsity: bool = True,
) -> Part:
    return Part(
        key=key,
        name=name,
        sms=sms,
        mem_gib=mem_gib,
        hbm_gbps=hbm_gbps,
        nvlink_gbps=nvlink_gbps,
        dense_tflops=MappingProxyType(dense_tflops),
        source=source,
        has_sparsity=has_sparsity,
    )


_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (SXM / PCIe / NVL columns)"
_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (SXM / NVL columns)"
_A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (40GB / 80GB, SXM / PCIe)"

# Hopper SXM compute (H100 SXM, H200, H800, GH200 share the GH100 die at the SXM clocks).
# Datasheet, with sparsity: TF32 989, BF16/FP16 1,979, FP8/INT8 3,958; FP32 67; FP64 TC 67.
# Dense = half: DESIGN.md fixes bf16/fp16 989, fp8 1979, tf32 495.
_HOPPER_SXM = {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "int8": 1979.0, "tf32": 495.0, "fp32": 67.0}

# Hopper at NVL (PCIe card, 350-400 W) clocks. With sparsity: TF32 835, BF16/FP16 1,671,
# FP8/INT8 3,341; FP32 60; FP64 TC 60. Dense halves: DESIGN.md fixes H100 NVL bf16 835.
_HOPPER_NVL = {
    "bf16": 835.0,
    "fp16": 835.0,
    "fp8": 1671.0,
    "int8": 1671.0,
    "tf32": 417.5,
    "fp32": 60.0,
    "fp64": 60.0,
}

# Ampere A100 (SXM and PCIe, 40 and 80 GB: same clocks). Datasheet dense | sparse:
# TF32 156 | 312, BF16/FP16 312 | 624, INT8 624 | 1,248 TOPS; FP32 19.5; FP64 TC 19.5. No FP8.
_AMPERE_A100 = {"bf16": 312.0, "fp16": 312.0, "int8": 624.0, "tf32": 156.0, "fp32": 19.5, "fp64": 19.5}

_PART_LIST = (
    _part(
        "h100-sxm",
        "H100 SXM",
        sms=132,
        mem_gib=80,
        hbm_gbps=3350,  # HBM3 3.35 TB/s
        nvlink_gbps=450,  # NVLink 4: 900 GB/s bidirectional
        dense_tflops={**_HOPPER_SXM, "fp64": 67.0},
        source=_H100_DATASHEET + ", H100 SXM",
    ),
    _part(
        "h100-pcie",
        "H100 PCIe",
        sms=114,
        mem_gib=80,
        hbm_gbps=2000,  # HBM2e 2 TB/s
        nvlink_gbps=300,  # NVLink bridge between a pair: 600 GB/s bidirectional
        # With sparsity: TF32 756, BF16/FP16 1,513, FP8/INT8 3,026; FP32 51; FP64 TC 51.
        # DESIGN.md fixes bf16 756.
        dense_tflops={
            "bf16": 756.0,
            "fp16": 756.0,
            "fp8": 1513.0,
            "int8": 1513.0,
            "tf32": 378.0,
            "fp32": 51.0,
            "fp64": 51.0,
        },
        source=_H100_DATASHEET + ", H100 PCIe",
    ),
    _part(
        "h100-nvl",
        "H100 NVL",
        sms=132,
        mem_gib=94,
        hbm_gbps=3900,  # HBM3 3.9 TB/s
        nvlink_gbps=300,  # NVLink bridge between a pair: 600 GB/s bidirectional
        dense_tflops=_HOPPER_NVL,
        source=_H100_DATASHEET + ", H100 NVL",
    ),
    _part(
        "h200",
        "H200 SXM",
        sms=132,
        mem_gib=141,
        hbm_gbps=4800,  # HBM3e 4.8 TB/s
        nvlink_gbps=450,  # 900 GB/s bidirectional
        dense_tflops={**_HOPPER_SXM, "fp64": 67.0},  # same compute as H100 SXM
        source=_H200_DATASHEET + ", H200 SXM",
    ),
    _part(
        "h200-nvl",
        "H200 NVL",
        sms=132,
        mem_gib=141,
        hbm_gbps=4800,
        nvlink_gbps=450,  # 2- or 4-way NVLink bridge, 900 GB/s bidirectional
        dense_tflops=_HOPPER_NVL,  # same figures as H100 NVL
        source=_H200_DATASHEET + ", H200 NVL",
    ),
    _part(
        "h800",
        "H800 SXM",
        sms=132,
        mem_gib=80,
        hbm_gbps=3350,
        nvlink_gbps=200,  # export variant: NVLink cut to 400 GB/s bidirectional
        # Same tensor/FP32 figures as H100 SXM; FP64 is cut on this variant, so none is listed.
        dense_tflops=_HOPPER_SXM,
        source="NVIDIA H800 Tensor Core GPU datasheet, H800 SXM",
    ),
    _part(
        "gh200",
        "GH200 (96 GB HBM3)",
        sms=132,
        mem_gib=96,
        hbm_gbps=4000,  # HBM3 4 TB/s
        nvlink_gbps=450,
        dense_tflops={**_HOPPER_SXM, "fp64": 67.0},  # the H100 SXM GPU, with Grace
        source="NVIDIA GH200 Grace Hopper Superchip datasheet, 96GB HBM3",
    ),
    _part(
        "gh200-144gb",
        "GH200 (144 GB HBM3e)",
        sms=132,
        mem_gib=144,
        hbm_gbps=4900,  # HBM3e 4.9 TB/s
        nvlink_gbps=450,
        dense_tflops={**_HOPPER_SXM, "fp64": 67.0},
        source="NVIDIA GH200 Grace Hopper Superchip datasheet, 144GB HBM3e",
    ),
    _part(
        "a100-40gb",
        "A100 40GB",
        sms=108,
        mem_gib=40,
        hbm_gbps=1555,  # HBM2 1,555 GB/s (SXM and PCIe)
        nvlink_gbps=300,  # NVLink 3: 600 GB/s bidirectional
        dense_tflops=_AMPERE_A100,
        source=_A100_DATASHEET + ", A100 40GB",
    ),
    _part(
        "a100-80gb",
        "A100 80GB SXM",
        sms=108,
        mem_gib=80,
        hbm_gbps=2039,  # HBM2e 2,039 GB/s
        nvlink_gbps=300,
        dense_tflops=_AMPERE_A100,
        source=_A100_DATASHEET + ", A100 80GB SXM",
    ),
    _part(
        "a100-80gb-pcie",
        "A100 80GB PCIe",
        sms=108,
        mem_gib=80,
        hbm_gbps=1935,  # HBM2e 1,935 GB/s
        nvlink_gbps=300,  # NVLink bridge between a pair: 600 GB/s bidirectional
        dense_tflops=_AMPERE_A100,
        source=_A100_DATASHEET + ", A100 80GB PCIe",
    ),
    _part(
        "b200",
        "B200",
        sms=148,
        mem_gib=180,  # HGX/DGX B200: 1,440 GB for 8 GPUs
        hbm_gbps=8000,  # HBM3e 8 TB/s
        nvlink_gbps=900,  # NVLink 5: 1.8 TB/s bidirectional
        # HGX B200 (1,000 W), dense | sparse: TF32 1,100 | 2,200, BF16/FP16 2,250 | 4,500,
        # FP8/INT8 4,500 | 9,000, FP4 9,000 | 18,000; FP32 80; FP64 40.
        dense_tflops={
            "bf16": 2250.0,
            "fp16": 2250.0,
            "fp8": 4500.0,
            "fp4": 9000.0,
            "int8": 4500.0,
            "tf32": 1100.0,
            "fp32": 80.0,
            "fp64": 40.0,
        },
        source="NVIDIA Blackwell architecture technical brief / HGX B200 datasheet (1,000 W)",
    ),
    _part(
        "v100",
        "V100 SXM2",
        sms=80,
        mem_gib=32,  # 16 GB and 32 GB variants share every other figure
        hbm_gbps=900,  # HBM2 900 GB/s
        nvlink_gbps=150,  # NVLink 2: 300 GB/s bidirectional
        # Tensor cores are FP16 only (125 TFLOP/s); no bf16, tf32, fp8 or sparsity.
        dense_tflops={"fp16": 125.0, "fp32": 15.7, "fp64": 7.8},
        source="NVIDIA Tesla V100 GPU datasheet, V100 SXM2",
        has_sparsity=False,
    ),
)

_BY_KEY = {p.key: p for p in _PART_LIST}

# Every CLI name. `a100` is an alias: the 80 GB SXM part most training clusters run.
PARTS: Mapping[str, Part] = MappingProxyType({**_BY_KEY, "a100": _BY_KEY["a100-80gb"]})


def part_by_key(key: str) -> Part:
    try:
        return PARTS[key.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown GPU {key!r}; valid: {', '.join(sorted(PARTS))}") from None


def dense_peak_tflops(part: Part, dtype: str) -> float:
    try:
        return part.dense_tflops[dtype]
    except KeyError:
        known = ", ".join(sorted(part.dense_tflops))
        raise ValueError(f"{part.name} has no {dtype} peak in its datasheet; known: {known}") from None


def sparse_peak_tflops(part: Part, dtype: str) -> float | None:
    """The datasheet's "with sparsity" figure: 2x dense, for tensor dtypes on parts that have it."""
    if not part.has_sparsity or dtype not in SPARSE_DTYPES or dtype not in part.dense_tflops:
        return None
    return 2.0 * part.dense_tflops[dtype]


def sparse_peak_matches(
    tflops: float, tol: float = 0.005, dtype: str | None = None
) -> list[tuple[Part, str]]:
    """Parts and dtypes whose "with sparsity" peak equals `tflops` within `tol` (relative).

    The MFU007 check on a user-given `--peak-tflops`. Pass the run's `dtype` where known: 1979
    is H100 SXM's bf16 sparse figure but also its fp8 *dense* one, which is right for an fp8 run.
    The tolerance absorbs the datasheet's rounding (1,979 printed vs 2 x 989 stored).
    """
    matches = []
    for part in _PART_LIST:
        for dt in part.dense_tflops:
            if dtype is not None and dt != dtype:
                continue
            sparse = sparse_peak_tflops(part, dt)
            if sparse is not None and abs(tflops - sparse) <= tol * sparse:
                matches.append((part, dt))
    return matches


def ridge_flop_per_byte(part: Part, dtype: str) -> float:
    """Arithmetic intensity at which the roofline turns: dense peak / HBM bandwidth.

    H100 SXM bf16: 989e12 / 3350e9 = 295 FLOP/byte. A kernel below it is memory-bound.
    """
    return dense_peak_tflops(part, dtype) * 1e12 / (part.hbm_gbps * 1e9)


@dataclass(frozen=True)
class Identification:
    part: Part
    reason: str  # which deviceProperties matched, in one line


# deviceProperties `name` patterns per part (case-insensitive). A name may match several parts
# ("NVIDIA H100" fits SXM and NVL); numSms, then memory, must leave exactly one.
_NAME_PATTERNS: Mapping[str, str] = {
    "h100-sxm": r"\bH100\b(?!.*(PCIe|NVL))",  # "NVIDIA H100 80GB HBM3"
    "h100-pcie": r"\bH100\b(?!.*(NVL|HBM3))",  # "NVIDIA H100 PCIe" (HBM2e); 114 SMs tells it from SXM
    "h100-nvl": r"\bH100\b(?!.*(PCIe|80GB))",  # "NVIDIA H100 NVL", or "NVIDIA H100" with 94 GB
    "h200": r"\bH200\b(?!.*NVL)",  # "NVIDIA H200"
    "h200-nvl": r"\bH200\b.*NVL",  # "NVIDIA H200 NVL"
    "h800": r"\bH800\b(?!.*PCIe)",  # "NVIDIA H800"; the PCIe card (114 SMs) is not listed
    "gh200": r"\bGH200\b",  # "NVIDIA GH200 480GB": memory tells 96 from 144 GB
    "gh200-144gb": r"\bGH200\b",
    "a100-40gb": r"\bA100\b(?!.*80GB)",  # "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PG509-200" (40 GB)
    "a100-80gb": r"\bA100\b(?!.*(40GB|PCIe))",  # "NVIDIA A100-SXM4-80GB"
    "a100-80gb-pcie": r"\bA100\b.*(80GB.*PCIe|PCIe.*80GB)",  # "NVIDIA A100 80GB PCIe"
    "b200": r"\bB200\b",  # "NVIDIA B200"; GB200 (1,200 W, other peaks) is not listed
    "v100": r"\bV100\b.*SXM",  # "Tesla V100-SXM2-32GB"; the PCIe card (112 TFLOP/s) is not listed
}

# Reported totalGlobalMem sits within a few percent of the nominal size (80 GB -> 79.2 GiB,
# 94 GB -> 95.1 GiB); 10% separates every pair of sizes that share a name and an SM count.
_MEM_TOLERANCE = 0.10


def identify(device_props: Mapping[str, Any]) -> Identification | None:
    """The part a Kineto `deviceProperties` entry describes, or None when it is not exactly one.

    Never falls back to a similar GPU: an unknown name, an SM count no listed variant has, or
    memory that leaves two candidates all give None, and the caller must ask for `--gpu`.
    """
    name = device_props.get("name")
    if not isinstance(name, str):
        return None
    candidates = [_BY_KEY[k] for k, pat in _NAME_PATTERNS.items() if re.search(pat, name, re.IGNORECASE)]
    evidence = [f"name {name!r}"]

    sms = device_props.get("numSms")
    if isinstance(sms, int) and not isinstance(sms, bool):
        candidates = [p for p in candidates if p.sms == sms]
        evidence.append(f"numSms {sms}")

    mem = device_props.get("totalGlobalMem")
    if len(candidates) > 1 and isinstance(mem, int | float) and not isinstance(mem, bool) and mem > 0:
        mem_gib = mem / 2**30
        candidates = [p for p in candidates if abs(mem_gib - p.mem_gib) <= _MEM_TOLERANCE * p.mem_gib]
        evidence.append(f"totalGlobalMem {mem_gib:.1f} GiB")

    if len(candidates) != 1:
        return None
    part = candidates[0]
    return Identification(part, f"{', '.join(evidence)} -> {part.name} ({part.key})")


# Kineto "Input type" strings (c10 scalar type names as the profiler prints them) -> dtype keys.
_TRACE_DTYPES: Mapping[str, str] = {
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "float": "fp32",  # whether a GEMM ran on TF32 tensor cores is not in the dtype
    "double": "fp64",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",  # AMD's FP8 encodings
    "c10::Float8_e5m2fnuz": "fp8",
    "c10::Float4_e2m1fn_x2": "fp4",
    "signed char": "int8",  # torch.int8; "unsigned char" (uint8) also carries packed fp8, so no guess
}


def dtype_from_trace(input_type: str) -> str | None:
    return _TRACE_DTYPES.get(input_type.strip())
