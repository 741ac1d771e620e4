"""Numbers as people read them: the unit that keeps a duration at 1 or more (s, ms, µs, ns); a share
to one decimal of a percent, or to two significant digits when that would read 0.0%; a byte count in
kB, MB, GB; and a magnitude no one would type (1e30 TFLOP/s, an MFU of 1e-28 %) in powers of ten
(1×10³⁰) rather than as thirty digits."""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """3.2e-6 → "3.20 µs", 0.07677 → "76.77 ms", 2.5 → "2.50 s"; "0.00 ms" never comes out."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.2f} {unit}"
    return f"{seconds * 1e9:.0f} ns"


def percent(share: float | None, unknown: str = "unknown") -> str:
    """0.312 → "31.2%"; 5.84e-07 → "0.000058%" (a tiny MFU is not 0.0%); 4.5e-30 → "4.5×10⁻²⁸%"
    (not 27 zeros); -0.0 → "0.0%"; None → `unknown`."""
    if share is None:
        return unknown
    points = share * 100
    if points == 0 or abs(points) >= 0.05:
        return f"{points + 0.0:.1f}%".replace("-0.0%", "0.0%")
    if abs(points) < _TINY_POINTS:
        return f"{powers_of_ten(points)}%"
    digits = 1 - math.floor(math.log10(abs(points)))
    return f"{points:.{digits}f}%"


def signed_percent(change: float) -> str:
    """A change against a reference, to one decimal: +0.7%, −2.1%, and 0.0% for any that rounds to
    nothing (never "-0.0%")."""
    points = round(change * 100, 1)
    if points == 0:
        return "0.0%"
    return f"+{points:.1f}%" if points > 0 else f"−{-points:.1f}%"


# Under this many points, a share's decimals would be mostly zeros: 1×10⁻⁷% rather than 0.00000010%.
_TINY_POINTS = 1e-5

# Between these, `:g` writes a number as people do (989, 494.7, 0.0125); outside, it would be 1e+30
# or 30 digits after a rounding, and powers of ten read better.
_SMALL, _LARGE = 1e-4, 1e6


def number(x: float) -> str:
    """989 → "989", 494.7 → "494.7"; 1e30 → "1×10³⁰", 3.2e-9 → "3.2×10⁻⁹"."""
    if x == 0 or not math.isfinite(x) or _SMALL <= abs(x) < _LARGE:
        return f"{x:g}"
    return powers_of_ten(x)


def significant(x: float, digits: int = 3) -> str:
    """`digits` significant digits: 0.498 → "0.498", 4.027e8 → "4.027×10⁸" (digits 4), 6.07e-13 →
    "6.07×10⁻¹³": powers of ten outside [10⁻⁴, 10⁶), where `:g` would write 1e+30 or 4.027e+08."""
    if x == 0 or not math.isfinite(x) or _SMALL <= abs(x) < _LARGE:
        return f"{x:.{digits}g}"
    return powers_of_ten(x, digits)


def flop_count(x: float) -> str:
    """A FLOP count to four significant digits in the unit that keeps it at 1 or more:
    6.259e6 → "6.259 MFLOP", 7.85e11 → "785 GFLOP"."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {unit}FLOP"
    return f"{x:.4g} FLOP"


def times(ratio: float) -> str:
    """How many times: 2.345 → "2.3×"; 7.4e26 → "7.4×10²⁶×"."""
    return f"{ratio:.1f}×" if abs(ratio) < _LARGE else f"{powers_of_ten(ratio)}×"


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def powers_of_ten(x: float, digits: int = 2) -> str:
    """x to `digits` significant digits times a power of ten: 4.5e-28 → "4.5×10⁻²⁸", 1e30 → "1×10³⁰"."""
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{mantissa}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def data_size(n_bytes: int) -> str:
    """512 → "512 B", 12_345 → "12.3 kB", 3_400_000 → "3.4 MB" (SI units, as ls -h --si and file managers)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"


def ranks_traced(traced: int, world_size: int) -> str:
    """"8 ranks", or "2 of 128 ranks traced" where the traces are of some ranks of a larger run: every
    header (analyze's, the gate's) says it alike."""
    return f"{traced} ranks" if traced == world_size else f"{traced} of {world_size} ranks traced"
