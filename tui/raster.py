"""Spans → one label per terminal column: what the timeline draws at any zoom."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from tui.queries import Spans


def _coverage(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], edges: npt.NDArray[np.float64]
              ) -> npt.NDArray[np.float64]:
    """Time covered by disjoint spans (sorted by start) before each edge."""
    if len(start) == 0:
        return np.zeros(len(edges))
    dur = (end - start).astype(np.float64)
    before = np.concatenate(([0.0], np.cumsum(dur)))
    k = np.searchsorted(start, edges, side="right")      # spans that start before each edge
    last = np.maximum(k - 1, 0)
    partial = np.where(k > 0, np.clip(edges - start[last], 0.0, dur[last]), 0.0)
    return before[np.maximum(k - 1, 0)] * (k > 0) + partial


def rasterize(spans: Spans | None, t0_ns: float, t1_ns: float, width: int) -> list[str | None]:
    """The label covering most of each of `width` columns over [t0, t1); None where nothing is.

    Spans of one label must not overlap each other (GPU-state runs tile the window; host phase
    runs follow each other), so the coverage of a label is a cumulative sum, exact at any zoom.
    """
    if spans is None or width <= 0 or t1_ns <= t0_ns:
        return [None] * max(width, 0)
    edges = np.linspace(t0_ns, t1_ns, width + 1)
    labels = sorted(set(spans.label))
    lab = np.array(spans.label, dtype=object)
    cover = np.zeros((len(labels), width))
    for i, name in enumerate(labels):
        m = lab == name
        c = _coverage(spans.start_ns[m], spans.end_ns[m], edges)
        cover[i] = np.diff(c)
    best = cover.argmax(axis=0)
    filled = cover.max(axis=0) > 0
    return [labels[b] if f else None for b, f in zip(best.tolist(), filled.tolist(), strict=True)]


def nice_step(span: float, columns: int, min_gap: int = 12) -> float:
    """A 1-2-5 × 10^k tick interval leaving at least `min_gap` columns between ticks."""
    if span <= 0 or columns <= 0:
        return 1.0
    raw = span * min_gap / columns
    base = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * base >= raw:
            return m * base
    return 10 * base
