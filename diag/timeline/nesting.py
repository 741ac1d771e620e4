"""Span nesting on each thread, in numpy: the span that contains each span or instant.

CPU ops of one thread, sorted by (ts, -end), nest: the innermost op containing op i is the
nearest earlier op of the thread whose end is at or after i's end, and the innermost op
containing an instant t is the nearest op starting at or before t whose end is at or after t.
(A monotonic stack finds the same, one op at a time in Python: 0.09 s for the 41k ops of the
control trace, more than half of a rank's timeline; this is ~100 numpy passes over the queries.)
A span that starts inside another but outlives it (clock jitter) is not its child, as the
stack would pop it.

`nearest_at_least` is the search: a sparse table of maxima over blocks of BLOCK values finds
the block, a scan of at most BLOCK steps the value; memory stays O(n).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

BLOCK = 64


def nearest_at_least(values: I64, lo: I64, hi: I64, threshold: I64) -> I64:
    """For each query q, the largest j with lo[q] <= j < hi[q] and values[j] >= threshold[q]; -1 if none."""
    values = np.asarray(values, np.int64)
    lo, hi, threshold = (np.asarray(a, np.int64) for a in (lo, hi, threshold))
    out = np.full(len(lo), -1, np.int64)
    if len(values) == 0 or len(lo) == 0:
        return out
    # 1. The top block, partly: hi-1 down to the start of its block (not below lo).
    top = hi - 1
    top_block_start = np.where(top >= 0, top // BLOCK * BLOCK, 0)
    _scan_down(values, top, np.maximum(lo, top_block_start), threshold, out)
    # 2. Whole blocks below it, down to the first block that starts at or after lo.
    blocks = _block_maxima(values)
    first_whole = -(-lo // BLOCK)
    left = (out < 0) & (top >= 0)
    b = np.full(len(lo), -1, np.int64)
    b[left] = _table_search(blocks, first_whole[left], top_block_start[left] // BLOCK, threshold[left])
    found = b >= 0
    _scan_down(values, np.where(found, b * BLOCK + BLOCK - 1, -1), np.where(found, b * BLOCK, 0), threshold, out)
    # 3. Else the partial block at the bottom: lo up to the first whole block (or the top block).
    rest = (out < 0) & (top >= 0) & ~found
    bottom_top = np.minimum(first_whole * BLOCK, top_block_start) - 1
    _scan_down(values, np.where(rest, bottom_top, -1), lo, threshold, out)
    return out


def _scan_down(values: I64, start: I64, stop: I64, threshold: I64, out: I64) -> None:
    """Where out < 0: the first j from start down to stop (inclusive) with values[j] >= threshold.
    Works on the queries still looking only: most find their value within a few steps."""
    q = np.nonzero((out < 0) & (start >= stop) & (start >= 0))[0]
    j = np.minimum(start[q], len(values) - 1)
    q, j = q[j >= stop[q]], j[j >= stop[q]]
    for _ in range(BLOCK):
        if not len(q):
            return
        hit = values[j] >= threshold[q]
        out[q[hit]] = j[hit]
        j = j - 1
        more = ~hit & (j >= stop[q])
        q, j = q[more], j[more]


def _block_maxima(values: I64) -> list[I64]:
    """Sparse table over the maxima of blocks: level k, entry b = max of blocks b-2^k+1 .. b."""
    pad = -len(values) % BLOCK
    padded = np.concatenate([values, np.full(pad, np.iinfo(np.int64).min, np.int64)])
    level = padded.reshape(-1, BLOCK).max(axis=1)
    table = [level]
    width = 1
    while width * 2 <= len(level):
        prev = table[-1]
        nxt = prev.copy()
        nxt[width:] = np.maximum(prev[width:], prev[:-width])
        table.append(nxt)
        width *= 2
    return table


def _table_search(table: list[I64], lo: I64, hi: I64, threshold: I64) -> I64:
    """The largest block b in [lo, hi) whose maximum is >= threshold, or -1 (binary lifting)."""
    pos = hi - 1
    for k in range(len(table) - 1, -1, -1):
        width = 1 << k
        # Skip the 2^k blocks ending at pos when none of them reaches the threshold.
        can = (pos - width + 1 >= lo) & (pos >= 0)
        skip = can & (table[k][np.clip(pos, 0, None)] < threshold)
        pos = np.where(skip, pos - width, pos)
    ok = (pos >= lo) & (pos >= 0)
    ok &= table[0][np.clip(pos, 0, None)] >= threshold
    return np.where(ok, pos, -1)


def thread_starts(tid: I64) -> I64:
    """For ops sorted by thread: the index of the first op of each op's thread."""
    if len(tid) == 0:
        return np.zeros(0, np.int64)
    new = np.ones(len(tid), bool)
    new[1:] = tid[1:] != tid[:-1]
    return np.maximum.accumulate(np.where(new, np.arange(len(tid)), 0))


def parents(tid: I64, end: I64) -> I64:
    """Each op's innermost enclosing op on its thread, or -1; ops sorted by (tid, ts, -end).

    nearest_at_least(end, thread start, i, end[i]) for every op i, by pointer jumping: each op's
    candidate starts at the op before it; while the candidate ends before the op, the op takes
    the candidate's own candidate. Every op skipped ends before the op (the ones between the
    candidate and its candidate end before the candidate), so the first candidate that does not
    end before it is the parent. About log2(n) passes over the ops still looking (18 for the
    control trace's 41k ops: 3.7 ms, where nearest_at_least takes 12 ms)."""
    end = np.asarray(end, np.int64)
    first = thread_starts(tid)
    cand = np.arange(len(end), dtype=np.int64) - 1
    todo = np.nonzero(cand >= first)[0]
    while len(todo):
        c = cand[todo]
        short = end[c] < end[todo]
        todo, c = todo[short], c[short]
        cand[todo] = cand[c]
        todo = todo[cand[todo] >= first[todo]]
    return np.where(cand >= first, cand, -1)


def containing(tid: I64, ts: I64, end: I64, q_tid: I64, q_ts: I64) -> I64:
    """For each query instant (thread, time): the innermost op on that thread containing it, or -1."""
    out = np.full(len(q_ts), -1, np.int64)
    if len(tid) == 0 or len(q_ts) == 0:
        return out
    first = np.searchsorted(tid, q_tid, side="left")
    last = np.searchsorted(tid, q_tid, side="right")
    hi = np.empty(len(q_ts), np.int64)
    for t in distinct(q_tid):
        # One thread at a time: its ops are one sorted slice of ts.
        q = q_tid == t
        a, b = first[q][0], last[q][0]
        hi[q] = a + np.searchsorted(ts[a:b], q_ts[q], side="right")
    return nearest_at_least(end, first, hi, q_ts)


def distinct(values: I64) -> I64:
    """np.unique(values) by a sort: numpy 2.4's np.unique hashes, ~15× slower on arrays of 8k."""
    s = np.sort(values)
    return s[np.append(True, s[1:] != s[:-1])] if len(s) else s


def overlapped(s: I64, e: I64, a: I64, b: I64) -> npt.NDArray[np.bool_]:
    """For each interval [a, b): whether any span [s, e) overlaps it (s < b and e > a). Among the
    spans that start before b, the one that reaches furthest decides: a prefix maximum of ends in
    order of start, one binary search an interval (a loop of NumPy calls per idle gap was 0.07 s of
    the control trace's analyze, MFU013)."""
    if not len(s):
        return np.zeros(len(a), dtype=bool)
    order = np.argsort(s, kind="stable")
    reach = np.maximum.accumulate(e[order])
    before = np.searchsorted(s[order], b, side="left")    # spans starting before b
    return (before > 0) & (reach[np.maximum(before - 1, 0)] > a)


def points_within(t: I64, a: I64, b: I64) -> npt.NDArray[np.bool_]:
    """For each interval [a, b], ends included: whether any of the instants `t` falls in it."""
    t = np.sort(t)
    return np.searchsorted(t, b, side="right") > np.searchsorted(t, a, side="left")


def innermost_pieces(ts: I64, end: I64, a: I64, b: I64, xs: I64, xe: I64) -> tuple[I64, I64, I64]:
    """The intervals [a, b), less the intervals [xs, xe) (each list disjoint and sorted), cut into
    pieces within which the innermost of the spans of one thread (sorted by (ts, -end)) does not
    change: each piece's start, length and innermost span (-1: none), the one that holds its
    first instant (a span holds t when ts <= t < end)."""
    pts = distinct(np.concatenate([ts, end, a, b, xs, xe]).astype(np.int64))
    s, e = pts[:-1], pts[1:]
    keep = _within(a, b, s) & ~_within(xs, xe, s)
    s, e = s[keep], e[keep]
    return s, e - s, containing(np.zeros(len(ts), np.int64), ts, end - 1, np.zeros(len(s), np.int64), s)


def _within(a: I64, b: I64, t: I64) -> npt.NDArray[np.bool_]:
    """For each instant t: whether it falls in one of the disjoint sorted intervals [a, b)."""
    if not len(a):
        return np.zeros(len(t), dtype=bool)
    j = np.searchsorted(a, t, side="right") - 1
    return (j >= 0) & (t < b[np.maximum(j, 0)])
