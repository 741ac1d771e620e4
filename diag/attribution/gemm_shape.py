"""What a GEMM's shape lets it reach on a part: output tiles against SMs, arithmetic intensity
against the ridge point, and the ceiling the best kernels reach (data/gemm_ceiling.csv).

A GEMM fills an H100 SXM only when it has at least one tile per SM (132) and does at least
peak ÷ HBM bandwidth = 989e12 / 3350e9 = 295 FLOP per byte; under either it is thin (MFU003).
A well-shaped GEMM can still reach only min(ceiling × peak, intensity × HBM bandwidth): the gap
between that and what it did is what a better kernel or layout can win (MFU009).
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType

import msgspec

from diag.attribution.digest import TF32_KERNEL
from diag.attribution.workload_mix import BATCHED
from diag.knowledge import hardware


class Ceiling(msgspec.Struct, frozen=True):
    """Per part: the fraction of the dense peak the best kernels reach, and its usual GEMM tile."""

    part: str
    ceiling: float
    tile_m: int
    tile_n: int
    source: str
    example: str


def _load() -> Mapping[str, Ceiling]:
    text = resources.files("diag.knowledge").joinpath("data/gemm_ceiling.csv").read_text()
    rows = {}
    for r in csv.DictReader(text.splitlines()):
        rows[r["part"]] = Ceiling(r["part"], float(r["ceiling"]), int(r["tile_m"]), int(r["tile_n"]),
                                  r["source"], r["example"])
    return MappingProxyType(rows)


CEILINGS = _load()

# The CTA tile in cuBLAS/CUTLASS kernel names: nvjet_tst_128x256_..., ..._tilesize128x128x64_...,
# ampere_bf16_s16816gemm_bf16_128x256_ldg8_... (M × N of the tile first).
_TILE = re.compile(r"(?:tilesize|_)(\d{1,3})x(\d{1,3})(?=x|_|$)")

# Attention as plain batched matmuls: QKᵀ has K = head_dim, PV has N = head_dim.
MAX_HEAD_DIM = 256


def ceiling_of(part_key: str | None) -> Ceiling | None:
    return CEILINGS.get(part_key) if part_key else None


@functools.lru_cache(maxsize=4096)
def tile_of(kernel_name: str, part_key: str | None) -> tuple[int, int] | None:
    """The output tile the kernel name gives, else the part's usual one, else None."""
    m = _TILE.search(kernel_name)
    if m and 8 <= int(m.group(1)) <= 256 and 8 <= int(m.group(2)) <= 256:
        return int(m.group(1)), int(m.group(2))
    c = ceiling_of(part_key)
    return (c.tile_m, c.tile_n) if c else None


def output_tiles(m: int, n: int, tile: tuple[int, int], batch: int = 1) -> int:
    """256 × 4096 in 128×256 tiles: ceil(256/128) · ceil(4096/256) = 2 · 16 = 32."""
    return batch * math.ceil(m / tile[0]) * math.ceil(n / tile[1])


def intensity(flops: float, nbytes: float | None) -> float | None:
    """FLOP per byte of operands read and result written once."""
    return flops / nbytes if nbytes else None


class ShapeFit(msgspec.Struct, frozen=True):
    """How one GEMM's shape fits the part."""

    tiles: int | None            # output tiles (None: no tile known)
    sms: int
    intensity: float | None      # FLOP/byte
    ridge: float | None          # the part's peak ÷ HBM bandwidth for this dtype

    @property
    def under_one_wave(self) -> bool:
        return self.tiles is not None and self.tiles < self.sms

    @property
    def memory_bound(self) -> bool:
        return self.intensity is not None and self.ridge is not None and self.intensity < self.ridge

    @property
    def thin(self) -> bool:
        return self.under_one_wave or self.memory_bound


def fit(mnk: tuple[int, int, int], flops: float, nbytes: float | None, kernel_name: str,
        part: hardware.Part, dtype: str | None) -> ShapeFit:
    m, n, k = mnk
    tile = tile_of(kernel_name, part.key)
    # bmm: the batch is in the FLOPs (2·B·M·N·K), not in M, N, K.
    batch = max(1, round(flops / (2 * m * n * k))) if m and n and k else 1
    d = ran_as(dtype, kernel_name)
    d = d if d in part.dense_tflops else "bf16" if "bf16" in part.dense_tflops else None
    ridge = hardware.ridge_flop_per_byte(part, d) if d else None
    return ShapeFit(output_tiles(m, n, tile, batch) if tile else None, part.sms, intensity(flops, nbytes), ridge)


@functools.lru_cache(maxsize=4096)
def ran_as(dtype: str | None, kernel_name: str) -> str | None:
    """The dtype the tensor cores ran: fp32 tensors on a TF32 kernel (tensorop_s1688...) ran as tf32.
    Cached, as tile_of: a rank asks it of every GEMM it ran (4.8k on the control trace, 18 ms)."""
    return "tf32" if dtype == "fp32" and TF32_KERNEL.search(kernel_name) else dtype


def reachable_flops_per_s(peak_flops_per_s: float, ceiling: float, flop_per_byte: float | None,
                          hbm_bytes_per_s: float | None) -> float:
    """The roofline of the GEMM's intensity, capped at the ceiling the best kernels reach."""
    top = ceiling * peak_flops_per_s
    if flop_per_byte is None or not hbm_bytes_per_s:
        return top
    return min(top, flop_per_byte * hbm_bytes_per_s)


def attention_shaped(op_name: str | None, mnk: tuple[int, int, int] | None, beside_softmax: bool) -> bool:
    """A batched matmul with a head-sized inner or output dimension, one of the two around a
    softmax (attention_bmms): attention done by hand. The shape alone is not enough: a
    recommender's feature interaction is a bmm [16,27,27] too, with no softmax."""
    return beside_softmax and op_name in BATCHED and mnk is not None and min(mnk[1], mnk[2]) <= MAX_HEAD_DIM

