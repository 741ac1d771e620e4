"""The AMD part family a trace ran on when it has no deviceProperties: the ISA (gfx target) that
Tensile/hipBLASLt write into their kernel names (`..._ISA942_...` is gfx942), looked up in
data/isa.toml. It names a family and its parts, not one part: MFU stays unknown until --gpu."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from functools import cache
from importlib import resources

import msgspec

from diag.knowledge import hardware

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

TABLE = "data/isa.toml"
# Tensile's solution names carry `_ISA<major><minor><stepping>_` (ISA90a, ISA942, ISA950).
_ISA = re.compile(r"_ISA([0-9]{2}[0-9a-f])(?=_|$)")


class Family(msgspec.Struct, frozen=True):
    isa: str
    family: str
    parts: list[str]
    source: str
    example: str


@cache
def families() -> dict[str, Family]:
    rows = tomllib.loads(resources.files("diag.knowledge").joinpath(TABLE).read_text(encoding="utf-8"))["isa"]
    return {r["isa"]: msgspec.convert(r, Family) for r in rows}


def isa_of(kernel_name: str) -> str | None:
    """The gfx target a kernel name carries ('gfx942'), or None."""
    m = _ISA.search(kernel_name)
    return f"gfx{m.group(1)}" if m else None


def most_common_isa(names: Iterable[str]) -> str | None:
    seen: dict[str, int] = {}
    for name in names:
        if (isa := isa_of(name)) is not None:
            seen[isa] = seen.get(isa, 0) + 1
    return max(seen, key=lambda k: seen[k]) if seen else None


def describe(isa: str, dtype: str) -> str | None:
    """'kernel names say gfx942 (AMD MI300 (CDNA3)): dense bf16 peak 1307.4–1307.4 TFLOP/s by part
    (mi300x, mi325x); pin it with --gpu mi300x', or None for an ISA the table lacks."""
    fam = families().get(isa)
    if fam is None:
        return None
    peaks = sorted(p for k in fam.parts if (p := hardware.PARTS[k].dense_tflops.get(dtype)) is not None)
    span = (f"dense {dtype} peak {peaks[0]:g} TFLOP/s" if peaks and peaks[0] == peaks[-1] else
            f"dense {dtype} peak {peaks[0]:g}–{peaks[-1]:g} TFLOP/s" if peaks else f"no {dtype} peak in the table")
    return (f"kernel names say {isa} (AMD {fam.family}): {span} by part ({', '.join(fam.parts)}); "
            f"pin the part with --gpu {fam.parts[0]}")
