"""The vectorized span nesting (diag/timeline/nesting.py) against the one-op-at-a-time stack it replaced,
on random threads of spans with ties, zero-length spans and broken nesting. (The phases and
launching ops it gives on real traces are test_timeline_real's.)"""

from __future__ import annotations

import numpy as np
import pytest

from diag.timeline.nesting import containing, distinct, innermost_pieces, nearest_at_least, parents


def stack_parents(tid: list[int], ts: list[int], end: list[int]) -> list[int]:
    out: list[int] = []
    stack: list[int] = []
    cur: int | None = None
    for i in range(len(ts)):
        if tid[i] != cur:
            stack, cur = [], tid[i]
        while stack and end[stack[-1]] <= ts[i] and not (end[stack[-1]] == ts[i] == end[i]):
            stack.pop()
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        out.append(stack[-1] if stack else -1)
        stack.append(i)
    return out


def stack_containing(tid: list[int], ts: list[int], end: list[int], q_tid: list[int], q_ts: list[int]) -> list[int]:
    out = []
    for qt, qs in zip(q_tid, q_ts, strict=True):
        stack: list[int] = []
        for j in range(len(ts)):
            if tid[j] != qt or ts[j] > qs:
                continue
            while stack and end[stack[-1]] <= ts[j]:
                stack.pop()
            stack.append(j)
        while stack and end[stack[-1]] < qs:
            stack.pop()
        out.append(stack[-1] if stack else -1)
    return out


def random_spans(rng: np.random.Generator, n: int) -> tuple[list[int], list[int], list[int]]:
    """Spans on 3 threads, coarse times (many ties), some zero-length, sorted by (tid, ts, -end)."""
    tid = rng.integers(0, 3, n)
    ts = rng.integers(0, 60, n)
    dur = np.where(rng.random(n) < 0.15, 0, rng.integers(1, 40, n))
    order = np.lexsort((-(ts + dur), ts, tid))
    return tid[order].tolist(), ts[order].tolist(), (ts + dur)[order].tolist()


@pytest.mark.parametrize("seed", range(40))
def test_parents_and_containing_match_the_stack(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    tid, ts, end = random_spans(rng, n)
    got = parents(np.array(tid), np.array(end)).tolist()
    assert got == stack_parents(tid, ts, end)
    q_tid = rng.integers(0, 4, 50).tolist()      # thread 3 has no spans
    q_ts = rng.integers(-5, 110, 50).tolist()
    got_q = containing(np.array(tid), np.array(ts), np.array(end), np.array(q_tid), np.array(q_ts)).tolist()
    assert got_q == stack_containing(tid, ts, end, q_tid, q_ts)


def test_nearest_at_least_across_blocks() -> None:
    """Long ranges cross many 64-value blocks: the block table, then the scans, find the value."""
    rng = np.random.default_rng(7)
    values = rng.integers(0, 1000, 5000)
    lo = rng.integers(0, 5000, 400)
    hi = np.minimum(lo + rng.integers(0, 5000, 400), 5000)
    thr = rng.integers(900, 1001, 400)
    want = [max((j for j in range(a, b) if values[j] >= t), default=-1) for a, b, t in zip(lo, hi, thr, strict=True)]
    assert nearest_at_least(values, lo, hi, thr).tolist() == want


def test_parents_of_long_runs() -> None:
    """Thousands of siblings under one span, and thousands of top-level spans each ending after
    the last: each op's candidate parent jumps back over many ops, in many passes."""
    rng = np.random.default_rng(11)
    ts = np.sort(rng.integers(1, 900_000, 3000))
    inner = np.minimum(ts + rng.integers(0, 400, 3000), 999_999)
    tid = [0] * 3001 + [1] * 2000
    starts = [0, *ts.tolist(), *range(0, 4_000_000, 2000)]
    ends = [1_000_000, *inner.tolist(), *range(2500, 4_002_500, 2000)]
    order = np.lexsort((-np.array(ends), np.array(starts), np.array(tid)))
    t, s, e = (np.array(x)[order].tolist() for x in (tid, starts, ends))
    assert parents(np.array(t), np.array(e)).tolist() == stack_parents(t, s, e)


def test_distinct_is_np_unique() -> None:
    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 5000):
        x = rng.integers(-50, 50, n)
        assert distinct(x).tolist() == np.unique(x).tolist()


def disjoint(rng: np.random.Generator, n: int) -> tuple[list[int], list[int]]:
    """Up to n disjoint sorted intervals [a, b) in 0..120."""
    edges = sorted(set(rng.integers(0, 120, 2 * n).tolist()))
    edges = edges[: len(edges) // 2 * 2]
    return edges[0::2], edges[1::2]


@pytest.mark.parametrize("seed", range(20))
def test_innermost_pieces_count_each_instant(seed: int) -> None:
    """Instant by instant: each ns of [a, b) outside [xs, xe) counts for the last span (in the
    spans' order) with ts <= t < end, or for none (MFU013's Python frames of a CPU-only run)."""
    rng = np.random.default_rng(seed)
    _, ts3, end3 = random_spans(rng, int(rng.integers(0, 60)))
    spans = sorted(zip(ts3, end3, strict=True), key=lambda s: (s[0], -s[1]))   # one thread of them
    ts, end = [s for s, _ in spans], [e for _, e in spans]
    a, b = disjoint(rng, 6)
    xs, xe = disjoint(rng, 3)
    want = [0] * (len(ts) + 1)
    for t in range(130):
        if any(lo <= t < hi for lo, hi in zip(a, b, strict=True)) and not any(
                lo <= t < hi for lo, hi in zip(xs, xe, strict=True)):
            holding = [j for j in range(len(ts)) if ts[j] <= t < end[j]]
            want[holding[-1] + 1 if holding else 0] += 1
    _, length, span = innermost_pieces(*(np.array(v, np.int64) for v in (ts, end, a, b, xs, xe)))
    assert np.bincount(span + 1, weights=length, minlength=len(ts) + 1).tolist() == want
