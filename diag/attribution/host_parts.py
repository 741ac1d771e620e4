"""What the launching thread did during each idle gap's host-bound part (MFU010's details.parts):
the innermost span there at each instant — a sync call, a launch call, an op outside its children
and launches (dispatch), a Python frame or an annotation (Python), data-loading frames, or nothing.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from diag.timeline.columns import numpy_of
from diag.timeline.host_spans import SPAN_ANNOTATION, SPAN_FRAME, SPAN_OP, frame_label, program_annotation
from diag.timeline.nesting import distinct, innermost_pieces
from diag.timeline.rank import RankTimeline
from diag.timeline.states import IdleGaps, union

# A host-bound gap this long is a block of host work (preprocessing, a decode), not the per-op
# cost of eager execution: 1 ms is the host time of ~100 launches at 5-10 µs each.
LONG_GAP_NS = 1_000_000
# Span kinds past host_spans.py's SPAN_OP, SPAN_ANNOTATION, SPAN_FRAME: launch calls and sync calls.
_LAUNCH, _SYNC = 3, 4
_DATA_FRAME = "torch/utils/data/"
_STEP_NUMBER = re.compile(r"#\d+$")
NO_SPAN = ""


class HostParts(msgspec.Struct):
    """One rank's host-bound time by part and the name that held it, per step (index)."""

    ns: list[dict[tuple[str, str], int]]
    python_long_ns: list[int]             # python time in gaps of LONG_GAP_NS or more
    launches: list[int]                   # launch calls of activities in each step
    frames: bool                          # the launching threads recorded Python frames


def _thread_spans(tl: RankTimeline, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Thread t's ops, annotations, frames, launch calls and sync calls, sorted by (ts, -end), each
    with its kind and the name its part lists it by."""
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]] = []
    hs = tl.host_spans
    if hs is not None:
        lo, hi = np.searchsorted(hs.tid, t, "left"), np.searchsorted(hs.tid, t, "right")
        kind = hs.kind[lo:hi]
        names = [frame_label(nm) if k == SPAN_FRAME else "between ops in " + _STEP_NUMBER.sub("", nm)
                 if k == SPAN_ANNOTATION else nm for nm, k in zip(hs.name[lo:hi], kind.tolist(), strict=True)]
        parts.append((hs.start_ns[lo:hi], hs.end_ns[lo:hi], kind, names))
    lt = numpy_of(tl.acts.column("launch_tid").fill_null(-1), np.int64)
    ls = numpy_of(tl.acts.column("launch_ts").fill_null(-1), np.int64)
    le = numpy_of(tl.acts.column("launch_end").fill_null(-1), np.int64)
    on = np.flatnonzero((lt == t) & (ls >= 0) & (le > ls))
    # A launch call is listed by the op that made it.
    parts.append((ls[on], le[on], np.full(len(on), _LAUNCH, np.int64),
                  [tl.op_name[i] or tl.name[i] for i in on.tolist()]))
    m = tl.host_marks
    if m is not None and len(m.tid):
        sync = np.flatnonzero((m.tid == t) & (np.array(m.kind, dtype=object) == "sync"))
        parts.append((m.start_ns[sync], m.end_ns[sync], np.full(len(sync), _SYNC, np.int64),
                      [_sync_name(m.name[i], m.op[i], m.caller[i]) for i in sync.tolist()]))
    ts, end, kind = (np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(3))
    names = [nm for p in parts for nm in p[3]]
    order = np.lexsort((-end, ts))
    return ts[order], end[order], kind[order], [names[i] for i in order.tolist()]


def _sync_name(call: str, op: str | None, caller: str | None) -> str:
    return call + (f" in {op}" if op and op != call and not program_annotation(op) else "") + (f" from {frame_label(caller)}" if caller else "")


def _part_of(kind: int, name: str) -> str:
    if kind == _SYNC:
        return "sync_wait"
    if kind == _LAUNCH:
        return "launch"
    if kind == SPAN_OP:
        return "dispatch"
    if kind == SPAN_FRAME and _DATA_FRAME in name:
        return "dataloader"
    return "python"   # a frame, or an annotation with no op inside: the program's own code


def host_parts(tl: RankTimeline, g: IdleGaps) -> HostParts:
    """Each step's host-bound gap time on the thread that launched the activity after the gap, cut
    where the innermost span there changes (diag.timeline.nesting.innermost_pieces), by part. The
    data loader's spans are left out, as the ledger leaves them out of the bucket, so the parts of a
    gap add up to its host_ns.

    A sync call that returns inside a gap opened it, and is its cause for as long as the call
    lasted: without it the host would have run on that long while the GPU drained. The part of
    the call before the gap is taken from the gap's first pieces after the call returned."""
    n = len(tl.steps.step)
    out = HostParts([{} for _ in range(n)], [0] * n, [0] * n,
                    tl.host_spans is not None and bool((tl.host_spans.kind == SPAN_FRAME).any()))
    launched = (tl.step_of >= 0) & numpy_of(tl.acts.column("launch_ts").is_valid(), bool)
    out.launches = np.bincount(tl.step_of[launched], minlength=n).astype(np.int64).tolist()
    lt = numpy_of(tl.acts.column("launch_tid").fill_null(-1), np.int64)
    j = np.flatnonzero((g.host_ns > 0) & (g.next_act >= 0))
    thread = lt[g.next_act[j]]
    xs, xe = union(*tl.dataloader_spans)
    for t in distinct(thread[thread >= 0]).tolist():
        k = j[thread == t]
        a, b = g.start_ns[k], g.host_end_ns[k]
        ts, end, kind, names = _thread_spans(tl, t)
        opener, credit = _sync_credit(ts, end, kind, a, b)
        start, length, idx = innermost_pieces(ts, end, a, b, xs, xe)
        gap = np.searchsorted(a, start, side="right") - 1
        long = (b - a)[gap] >= LONG_GAP_NS
        for s, t0, ns, i, gi, lg in zip(g.step[k][gap].tolist(), start.tolist(), length.tolist(), idx.tolist(),
                                        gap.tolist(), long.tolist(), strict=True):
            by = out.ns[s]
            if credit[gi] > 0 and t0 >= end[opener[gi]]:
                take = min(int(credit[gi]), ns)
                credit[gi] -= take
                ns -= take
                key = ("sync_wait", names[opener[gi]])
                by[key] = by.get(key, 0) + take
            part, name = ("other", NO_SPAN) if i < 0 else (_part_of(int(kind[i]), names[i]), names[i])
            by[(part, name)] = by.get((part, name), 0) + ns
            if lg and part == "python":
                out.python_long_ns[s] += ns
    return out


def _sync_credit(ts: np.ndarray, end: np.ndarray, kind: np.ndarray, a: np.ndarray,
                 b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each gap [a, b): the last sync call that returned in it (-1: none), and how long that
    call ran before the gap began (the host waited while the GPU still had work)."""
    sync = np.flatnonzero(kind == _SYNC)
    if not len(sync):
        return np.full(len(a), -1, np.int64), np.zeros(len(a), np.int64)
    by_end = sync[np.argsort(end[sync], kind="stable")]
    last = np.searchsorted(end[by_end], b, side="right") - 1
    opener = np.where(last >= 0, by_end[np.maximum(last, 0)], -1)
    opener = np.where((opener >= 0) & (end[opener] >= a), opener, -1)
    credit = np.where(opener >= 0, np.maximum(a - ts[opener], 0), 0)
    return opener, credit.astype(np.int64)
