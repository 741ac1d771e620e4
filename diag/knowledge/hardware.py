"""Peak FLOP/s, memory and link figures by GPU part, and identifying the part from a trace.

The table is data: diag/knowledge/data/parts.toml, one row per part with its datasheet.
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
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

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
    name_pattern: re.Pattern[str]  # searched in deviceProperties.name
    example: str  # a deviceProperties.name the driver reports for this part
    vendor: str = "nvidia"  # a key of VENDORS
    has_sparsity: bool = True  # 2:4 structured sparsity (Ampere and later)
    default_dtype: str = "bf16"  # what a run is assumed to compute in when nothing records it


@dataclass(frozen=True)
class Vendor:
    """What advice names for a vendor's parts: the link inside a node, the collective library, the
    tool that shows clocks and throttling (parts.toml [vendor.*])."""

    key: str
    link: str
    collectives: str
    smi: str
    source: str


# A run whose part is not known: both vendors' names, never one vendor's alone.
UNKNOWN_VENDOR = Vendor("unknown", "NVLink or xGMI", "NCCL or RCCL",
                        "nvidia-smi -q -d PERFORMANCE or amd-smi metric", "no part identified")
# deviceProperties names of AMD GPUs the table may not list ("AMD Radeon Graphics", "AMD Instinct MI300X").
_AMD_NAME = re.compile(r"\b(AMD|Radeon|Instinct)\b|\bMI\d{3}", re.IGNORECASE)


def _load() -> tuple[Part, ...]:
    text = resources.files("diag.knowledge").joinpath(TABLE).read_text(encoding="utf-8")
    return tuple(
        Part(key=r["key"], name=r["name"], sms=r["sms"], mem_gib=r["mem_gib"], hbm_gbps=float(r["hbm_gbps"]),
             vendor=r["vendor"],
             nvlink_gbps=float(r["nvlink_gbps"]), dense_tflops=MappingProxyType(dict(r["dense_tflops"])),
             source=r["source"], has_sparsity=r.get("has_sparsity", True), default_dtype=r.get("default_dtype", "bf16"),
             name_pattern=re.compile(r["name_pattern"], re.IGNORECASE), example=r["example"])
        for r in tomllib.loads(text)["part"]
    )


def _load_vendors() -> Mapping[str, Vendor]:
    text = resources.files("diag.knowledge").joinpath(TABLE).read_text(encoding="utf-8")
    return MappingProxyType({k: Vendor(k, **v) for k, v in tomllib.loads(text)["vendor"].items()})


TABLE = "data/parts.toml"
_PART_LIST = _load()
VENDORS = _load_vendors()
_BY_KEY = {p.key: p for p in _PART_LIST}

# Short names several parts share, and the part each means: the one training fleets mostly run
# (the 80 GB SXM A100; the SXM H100, 132 SMs, of DGX/HGX H100 systems). `--gpu h100` takes it and
# says so; any other part is named in full.
ALIASES: Mapping[str, str] = MappingProxyType({"a100": "a100-80gb", "h100": "h100-sxm"})

# Every CLI name: each part's key, and the aliases.
PARTS: Mapping[str, Part] = MappingProxyType({**_BY_KEY, **{a: _BY_KEY[k] for a, k in ALIASES.items()}})


@dataclass(frozen=True)
class Resolved:
    part: Part
    note: str | None  # said when a name several parts share was taken to mean one


def resolve_part(text: str) -> Resolved:
    """The part a user means by `--gpu TEXT`: a key or alias in any case and spacing (`h100`,
    `H100 SXM`, `h100_pcie`), a datasheet name, or the trace's own device name (`NVIDIA H100 80GB
    HBM3`, matched by the same patterns `identify` uses). Everything comes from the part table, so
    a part added there resolves too. An ambiguous name takes its alias's part with a note, or
    lists the candidates; an unknown one lists the valid names (ValueError)."""
    norm = _normal(text)
    if norm in _BY_KEY:
        return Resolved(_BY_KEY[norm], None)
    by_name = {_normal(p.name): p for p in _PART_LIST}
    if norm in by_name:
        return Resolved(by_name[norm], None)
    candidates = [k for k in _BY_KEY if k.startswith(f"{norm}-")] if norm in ALIASES else \
        [p.key for p in _PART_LIST if p.name_pattern.search(text)]
    if len(candidates) == 1:
        return Resolved(_BY_KEY[candidates[0]], None)
    common = [ALIASES[a] for a in ALIASES if ALIASES[a] in candidates]
    if norm in ALIASES or common:
        part = _BY_KEY[ALIASES[norm]] if norm in ALIASES else _BY_KEY[common[0]]
        others = ", ".join(k for k in candidates if k != part.key)
        return Resolved(part, f"--gpu {text!r} could be several parts: taking {part.name} ({part.key}), the common "
                              f"one; name another to mean it ({others})")
    if candidates:
        raise ValueError(f"GPU {text!r} could be any of {', '.join(candidates)}; name one")
    raise ValueError(f"unknown GPU {text!r}; valid: {', '.join(sorted(PARTS))}, or the device name the trace "
                     "shows (e.g. 'NVIDIA H100 80GB HBM3')")


def _normal(text: str) -> str:
    """`NVIDIA H100_SXM` → `h100-sxm`: lower case, the vendor dropped, words joined by '-'."""
    words = re.split(r"[\s_-]+", text.strip().lower())
    return "-".join(w for w in words if w and w != "nvidia")


def dense_peak_tflops(part: Part, dtype: str) -> float:
    try:
        return part.dense_tflops[dtype]
    except KeyError:
        known = ", ".join(sorted(part.dense_tflops))
        raise ValueError(f"{part.name} has no {dtype} peak in its datasheet; known: {known}") from None


def default_dtype(part: Part | None) -> str:
    """What a GEMM whose dtype nothing records is assumed to run in: the part's `default_dtype`
    (bf16; fp16 on Volta and Turing, which have fp16 tensor cores and no bf16; fp32 on Pascal)."""
    return part.default_dtype if part is not None else "bf16"


def effective_peak_tflops(part: Part, shares: Mapping[str, float]) -> float:
    """1 ÷ Σ share_d ÷ peak_d: the peak at which a dtype mix's FLOPs (shares summing to 1) take their
    ideal time Σ FLOPs_d ÷ peak_d (diag/attribution/dtype_mix.py)."""
    if len(shares) == 1:
        return dense_peak_tflops(part, next(iter(shares)))  # exactly the datasheet's figure
    return 1.0 / sum(s / dense_peak_tflops(part, d) for d, s in shares.items())


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
    candidates = [p for p in _PART_LIST if p.name_pattern.search(name)]
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


def vendor_of(part_key: str | None, device_name: str | None) -> Vendor:
    """The vendor of the identified part; else the one the device's name says (an AMD name), else
    unknown: never one vendor's link or tool for a GPU nobody identified."""
    part = _BY_KEY.get(part_key) if part_key else None
    if part is not None:
        return VENDORS[part.vendor]
    if device_name and _AMD_NAME.search(device_name):
        return VENDORS["amd"]
    if device_name and "NVIDIA" in device_name.upper():
        return VENDORS["nvidia"]
    return UNKNOWN_VENDOR
