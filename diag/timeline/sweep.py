"""The GPU-state sweep: cut a rank's timeline at every interval boundary and label each piece.

Every interval kind (compute kernels, communication kernels, copies, GEMMs, point-to-point
kernels, collective waits, data-loader spans, step windows) adds +1 at its start and -1 at its
end. Sorting the boundaries and taking running sums gives, for each elementary segment between
two consecutive boundaries, how many of each kind are active. Overlaps across streams are then
counted once by construction. numpy throughout: one sort, one cumsum per kind.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


class Segments(msgspec.Struct, frozen=True):
    start_ns: I64
    end_ns: I64
    active: Mapping[str, I64]   # kind → number of intervals of that kind active in the segment

    def __len__(self) -> int:
        return len(self.start_ns)


def sweep(intervals: Mapping[str, tuple[I64, I64]], cuts: I64 | None = None) -> Segments:
    """Segments between all boundaries of `intervals` ({kind: (starts, ends)}) and `cuts`.

    Zero-length and inverted intervals contribute nothing.
    """
    kinds = list(intervals)
    times: list[I64] = []
    deltas: list[npt.NDArray[np.int32]] = []
    kind_idx: list[npt.NDArray[np.int32]] = []
    for k, (s, e) in enumerate(intervals.values()):
        s = np.asarray(s, dtype=np.int64)
        e = np.asarray(e, dtype=np.int64)
        ok = e > s
        s, e = s[ok], e[ok]
        times += [s, e]
        deltas += [np.ones(len(s), np.int32), -np.ones(len(e), np.int32)]
        kind_idx += [np.full(len(s), k, np.int32), np.full(len(e), k, np.int32)]
    if cuts is not None and len(cuts):
        c = np.asarray(cuts, dtype=np.int64)
        times.append(c)
        deltas.append(np.zeros(len(c), np.int32))
        kind_idx.append(np.zeros(len(c), np.int32))
    if not times or sum(len(t) for t in times) == 0:
        empty = np.zeros(0, np.int64)
        return Segments(empty, empty, {k: empty for k in kinds})
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    ki = np.concatenate(kind_idx)
    order = np.argsort(t, kind="stable")
    t, d, ki = t[order], d[order], ki[order]
    # Boundaries at the same instant collapse into one: counts are taken after all of them apply.
    # t is sorted: the first of each run of equal times is what np.unique(t, return_index=True)
    # gives, without its hash table (numpy 2.4), ~10× slower here.
    first = np.flatnonzero(np.append(True, t[1:] != t[:-1]))
    uniq = t[first]
    last = np.append(first[1:], len(t)) - 1
    active: dict[str, I64] = {}
    for k, name in enumerate(kinds):
        running = np.cumsum(np.where(ki == k, d, 0), dtype=np.int64)
        active[name] = running[last][:-1]
    return Segments(uniq[:-1], uniq[1:], active)


def window_index(seg: Segments, window_start_ns: I64, window_end_ns: I64) -> npt.NDArray[np.int64]:
    """For each segment, the index of the window it lies in, or -1 (windows tile, sorted)."""
    if len(window_start_ns) == 0:
        return np.full(len(seg), -1, np.int64)
    idx = np.searchsorted(window_start_ns, seg.start_ns, side="right") - 1
    inside = (idx >= 0) & (seg.end_ns <= window_end_ns[np.clip(idx, 0, None)])
    return np.where(inside, idx, -1).astype(np.int64)
