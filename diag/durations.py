"""Durations as people read them: the unit that keeps the figure at 1 or more (s, ms, µs, ns)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """3.2e-6 → "3.20 µs", 0.07677 → "76.77 ms", 2.5 → "2.50 s"; "0.00 ms" never comes out."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.2f} {unit}"
    return f"{seconds * 1e9:.0f} ns"
