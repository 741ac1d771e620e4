"""Durations and shares as people read them: the unit that keeps a duration at 1 or more (s, ms, µs,
ns); a share to one decimal of a percent, or to two significant digits when that would read 0.0%."""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """3.2e-6 → "3.20 µs", 0.07677 → "76.77 ms", 2.5 → "2.50 s"; "0.00 ms" never comes out."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.2f} {unit}"
    return f"{seconds * 1e9:.0f} ns"


def percent(share: float | None, unknown: str = "unknown") -> str:
    """0.312 → "31.2%"; 5.84e-07 → "0.000058%" (a tiny MFU is not 0.0%); None → `unknown`."""
    if share is None:
        return unknown
    points = share * 100
    if points == 0 or abs(points) >= 0.05:
        return f"{points:.1f}%"
    digits = 1 - math.floor(math.log10(abs(points)))
    return f"{points:.{digits}f}%"
