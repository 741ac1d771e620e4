"""The cross-rank critical path of every step (docs/critical_path.md).

The graph: on each rank the GPU's state runs of the step (the map step's `gpu_segments`: what ran
on the GPU, any stream, with idle gaps) follow one another; a matched collective joins its ranks
(no rank's instance ends before its last rank arrived) and a send/recv pair joins its two sides
(neither ends before the later one started). The path is walked back from the latest aligned
step end over all ranks: along a rank's runs, until a join where this rank waited; there it
continues on the rank it waited for, from the moment that rank arrived. The wait itself is not on
the path: what made it (the late rank's work) is. Idle runs are split as the ledger splits them:
the data loader's span and the time before the next launch call returned are `host`, the rest
`idle`. A wait whose late rank left no trace stays on the path as `wait`.

The per-rank work (the state runs, the host split) is done by the map step and read back from the
store one rank at a time; only the ranks the path visits are read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import duckdb
import msgspec
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from diag.attribution.analysis import RunContext
from diag.attribution.digest import RankDigest
from diag.knowledge import kernels
from diag.runtime import store
from diag.timeline.collectives import Matched
from diag.timeline.columns import numpy_of
from diag.timeline.nesting import overlapped

KINDS = ("compute", "comm", "wait", "copy", "idle", "host")

# Segments kept per step in the report: the longest, in time order; the rest are summed. A step of
# a large run can cross thousands of state runs; the report has to stay readable and small.
MAX_SEGMENTS = 40

I64 = npt.NDArray[np.int64]
Objects = npt.NDArray[np.object_]


class Segments(msgspec.Struct, frozen=True):
    """Segments as columns, one row each (a step of a large run crosses tens of thousands of state
    runs: the control trace's 6 steps 19k, merged into 12k segments, which cost 0.1 s of its
    analyze as one Python object each). Times are on the aligned clock (clock_offsets)."""

    rank: I64
    kind: Objects     # KINDS
    start_ns: I64
    end_ns: I64
    what: Objects     # collective instance, 'dataloader' or 'launch' (host), else the kernel or copy
                      # that ran longest in it (None: none the step launched)

    def __len__(self) -> int:
        return len(self.start_ns)

    def rows(self, i: slice | npt.NDArray[Any]) -> Segments:
        return Segments(self.rank[i], self.kind[i], self.start_ns[i], self.end_ns[i], self.what[i])

    @staticmethod
    def of(rank: Any, kind: Any, start_ns: Any, end_ns: Any, what: Any) -> Segments:
        n = len(start_ns)
        return Segments(np.broadcast_to(np.asarray(rank, np.int64), n).copy(), _objects(kind, n),
                        np.asarray(start_ns, np.int64), np.asarray(end_ns, np.int64), _objects(what, n))

    @staticmethod
    def joined(parts: list[Segments]) -> Segments:
        if not parts:
            return Segments.of([], [], [], [], [])
        return Segments(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


_FIELDS = ("rank", "kind", "start_ns", "end_ns", "what")


def _objects(values: Any, n: int) -> Objects:
    """An object column of `n` rows: `values` one per row, or one value (None, a str) for all."""
    out = np.empty(n, dtype=object)
    if isinstance(values, (str, type(None))):
        out[:] = values
    else:
        out[:] = list(values)
    return out


class StepPath(msgspec.Struct, frozen=True):
    step: int
    segments: Segments     # in time order, merged, all of them (the store keeps them all)

    @property
    def length_ns(self) -> int:
        return int((self.segments.end_ns - self.segments.start_ns).sum())

    def share(self, key: str) -> dict[str, float]:
        """Share of the path's length per `kind` or per `rank`."""
        seg = self.segments
        return dict(sorted(_sums(getattr(seg, key), seg.end_ns - seg.start_ns, self.length_ns or 1).items(),
                           key=lambda kv: -kv[1]))


def _sums(keys: npt.NDArray[Any], lengths: I64, divisor: int) -> dict[str, float]:
    """Sum of lengths / divisor per key (as str), keys in order of first appearance, each sum added
    up in time order, as a running `+=` over the segments would."""
    if not len(keys):
        return {}
    parts = lengths / divisor
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")   # each key's rows together, in time order
    groups = np.split(order, np.flatnonzero(np.diff(inverse[order])) + 1)
    return {str(uniq[u]): sum(parts[groups[u]].tolist()) for u in np.argsort(first, kind="stable").tolist()}


class _Join(msgspec.Struct, frozen=True):
    wait_start_ns: int   # aligned: this rank is in the call, the other not yet
    arrive_ns: int       # aligned: the other rank arrived (the wait ends)
    to_file: int | None  # the late rank's trace file (None: not in the traces)
    instance: str


def critical_paths(con: duckdb.DuckDBPyConnection, run: RunContext) -> list[StepPath]:
    """The path of every step number present on any rank."""
    offsets = aligned_offsets(run)
    files = {r.file_id: r for r in run.ranks}
    joins = _joins(run.matched, offsets)
    windows: dict[int, dict[int, tuple[int, int]]] = defaultdict(dict)   # step → file → aligned window
    for r in run.ranks:
        off = offsets.get(r.rank, 0)
        for i, step in enumerate(r.steps.step):
            windows[step][r.file_id] = (int(r.steps.start_ns[i]) + off, int(r.steps.end_ns[i]) + off)
    # One step's runs at a time: memory holds the ranks one step's path visits, whatever the run's length.
    paths = [StepPath(step, _merge(_walk(step, windows[step], joins, RunCache(con, files, offsets, step), files)))
             for step in sorted(windows)]
    return _named(con, paths, {step: {files[f].rank: f for f in w} for step, w in windows.items()}, offsets)


# What each GPU segment of the path is named after: the activity of its kind, launched in the
# segment's step, that ran longest in it. The segments and the activities by group (file, step,
# kind), each group's segments disjoint in time (one path, walked back); the overlaps are found by
# a sweep (_longest_in), not by a join of every segment with every activity of its group, which
# grew with their product: 0.12 s of the control trace's analyze for 12k segments and 9k activities.
_GROUPS = """
    WITH g AS (SELECT f, step, kind, row_number() OVER (ORDER BY f, step, kind) - 1 AS gid
               FROM (SELECT DISTINCT f, step, kind FROM path_segments))
"""
_GROUP_SEGMENTS = _GROUPS + """
    SELECT s.i, g.gid, s.s, s.e FROM path_segments s JOIN g USING (f, step, kind) ORDER BY g.gid, s.s
"""
_GROUP_ACTIVITIES = _GROUPS + """
    SELECT g.gid, a.ts_ns, a.end_ns, a.name
    FROM activities a JOIN g ON a.file_id = g.f AND a.step = g.step AND g.kind =
        CASE WHEN a.kclass = 'comm' THEN 'comm' WHEN a.source <> 'kernel' THEN 'copy' ELSE 'compute' END
    ORDER BY g.gid, a.ts_ns, a.end_ns, a.name
"""
NAME_CHARS = 100


def _named(con: duckdb.DuckDBPyConnection, paths: list[StepPath], file_of: dict[int, dict[int, int]],
           offsets: dict[int, int]) -> list[StepPath]:
    """Compute, copy and unnamed comm segments named after the kernel or copy that ran longest in
    them (a segment is a merged run of its state: it may cover many), among the activities its
    step launched."""
    todo = [np.flatnonzero(_is_none(p.segments.what) & np.isin(p.segments.kind, ("compute", "comm", "copy"))
                           & np.isin(p.segments.rank, list(file_of[p.step]))) for p in paths]
    n = sum(map(len, todo))
    if not n:
        return paths
    seg = Segments.joined([p.segments.rows(i) for p, i in zip(paths, todo, strict=True)])
    rank = seg.rank.tolist()
    step = np.repeat([p.step for p in paths], list(map(len, todo)))
    off = np.array([offsets.get(r, 0) for r in rank], np.int64)
    with store.registered(con, "path_segments", pa.table({   # on each rank's own clock, as the activities are
        "i": np.arange(n), "step": step, "f": [file_of[st][r] for st, r in zip(step.tolist(), rank, strict=True)],
        "kind": seg.kind, "s": seg.start_ns - off, "e": seg.end_ns - off,
    })):
        segments = store.arrow_table(con, _GROUP_SEGMENTS)
        acts = store.arrow_table(con, _GROUP_ACTIVITIES)
    found, act = _longest_in(*(numpy_of(segments.column(c), np.int64) for c in ("gid", "s", "e")),
                             *(numpy_of(acts.column(c), np.int64) for c in ("gid", "ts_ns", "end_ns")))
    # Each distinct name shortened once (a run repeats a few hundred kernels over thousands of segments).
    names = acts.column("name").take(pa.array(act)).combine_chunks().dictionary_encode()
    short = np.array([None] + [kernels.head(x).strip()[:NAME_CHARS] for x in names.dictionary.to_pylist()], object)
    what = np.empty(n, dtype=object)
    what[numpy_of(segments.column("i"), np.int64)[found]] = short[numpy_of(names.indices.fill_null(-1), np.int64) + 1]
    out, at = [], 0
    for p, i in zip(paths, todo, strict=True):
        if len(i):
            w = p.segments.what.copy()
            named = what[at : at + len(i)]
            w[i] = np.where(_is_none(named), w[i], named)
            p = StepPath(p.step, Segments(p.segments.rank, p.segments.kind, p.segments.start_ns, p.segments.end_ns, w))
        out.append(p)
        at += len(i)
    return out


def _is_none(a: Objects) -> npt.NDArray[np.bool_]:
    return np.fromiter((x is None for x in a), dtype=bool, count=len(a))


def _longest_in(seg_gid: np.ndarray, seg_s: np.ndarray, seg_e: np.ndarray,
                act_gid: np.ndarray, act_s: np.ndarray, act_e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each segment some activity of its group overlaps: (its index, the index of the activity
    that overlaps it longest; on a tie the first in the given order). Segments come sorted by
    (group, start), and a group's are disjoint (one path), so the segments an activity overlaps are
    a run of consecutive ones, found by two binary searches on one time line where the groups
    follow each other (each group's times from its own earliest, after the spans of those before).
    The search for the run's first goes by the furthest end so far: were segments to overlap, the
    run would only hold more candidates, which the overlap test drops."""
    groups = int(max(seg_gid.max(initial=-1), act_gid.max(initial=-1))) + 1
    lo = np.full(groups, np.iinfo(np.int64).max)
    hi = np.full(groups, np.iinfo(np.int64).min)
    for gid, s, e in ((seg_gid, seg_s, seg_e), (act_gid, act_s, act_e)):
        np.minimum.at(lo, gid, np.minimum(s, e))
        np.maximum.at(hi, gid, np.maximum(s, e))
    span = np.where(hi >= lo, hi - lo + 1, 0)
    base = np.concatenate([[0], np.cumsum(span)[:-1]]) - lo

    def line(gid: np.ndarray, t: np.ndarray) -> np.ndarray:
        return base[gid] + t

    ss, se, as_, ae = line(seg_gid, seg_s), line(seg_gid, seg_e), line(act_gid, act_s), line(act_gid, act_e)
    first = np.searchsorted(np.maximum.accumulate(se), as_, side="right")   # the first that may end after it starts
    count = np.maximum(np.searchsorted(ss, ae, side="left") - first, 0)   # through the last starting before it ends
    act = np.repeat(np.arange(len(as_)), count)
    seg = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count - first, count)
    overlap = np.minimum(ae[act], se[seg]) - np.maximum(as_[act], ss[seg])
    keep = overlap > 0
    act, seg, overlap = act[keep], seg[keep], overlap[keep]
    order = np.lexsort((act, -overlap, seg))
    seg, act = seg[order], act[order]
    best = np.flatnonzero(np.concatenate([[True], seg[1:] != seg[:-1]])) if len(seg) else np.zeros(0, np.int64)
    return seg[best], act[best]


def aligned_offsets(run: RunContext) -> dict[int, int]:
    """rank → ns to add to its times for the aligned clock (0 where no match links it)."""
    return {r: o.offset_ns if o.linked else 0 for r, o in run.offsets.items()}


def _joins(matched: list[Matched], offsets: dict[int, int]) -> dict[int, list[_Join]]:
    """Per file: where its rank waited for another, on the aligned clock, latest arrival last."""
    by_instance: dict[str, list[Matched]] = defaultdict(list)
    for m in matched:
        by_instance[m.instance].append(m)
    out: dict[int, list[_Join]] = defaultdict(list)
    for inst, ms in by_instance.items():
        for m in ms:
            c = m.call
            off = offsets.get(c.rank, 0)
            if m.wait_ns > 0 and m.last_rank is not None and m.last_rank != c.rank:
                # Wait from durations (collectives.match): no clock needed for its length.
                late = next((x.call.file_id for x in ms if x.call.rank == m.last_rank), None)
                out[c.file_id].append(_Join(c.ts_ns + off, c.ts_ns + off + m.wait_ns, late, inst))
            elif c.direction is not None and len(ms) == 2:
                # A send/recv side that started first waits for the other side to start.
                other = ms[1] if ms[0] is m else ms[0]
                o = other.call
                start, other_start = c.ts_ns + off, o.ts_ns + offsets.get(o.rank, 0)
                if other_start > start:
                    out[c.file_id].append(_Join(start, min(other_start, c.end_ns + off), o.file_id, inst))
    for v in out.values():
        v.sort(key=lambda j: j.arrive_ns)
    return out


class RunCache:
    """One step's state runs (aligned) of each file visited, idle split into host and idle, read once."""

    def __init__(self, con: duckdb.DuckDBPyConnection, files: dict[int, RankDigest], offsets: dict[int, int],
                 step: int):
        self.con, self.files, self.offsets, self.step = con, files, offsets, step
        self.cache: dict[int, Segments] = {}

    def of(self, file_id: int) -> Segments:
        if file_id not in self.cache:
            self.cache[file_id] = self._read(file_id)
        return self.cache[file_id]

    def _read(self, file_id: int) -> Segments:
        r = self.files[file_id]
        steps = r.steps.step
        if self.step not in steps:
            return Segments.of(r.rank, [], [], [], [])
        i = steps.index(self.step)
        # The next activity by start after an idle run: the GPU waited for its launch call until it
        # returned (states._host_bound, the ledger's host_bound). Windows tile the timeline, so it
        # starts before the next window ends. None found: the launch part is empty.
        hi = int(r.steps.end_ns[i + 1]) if i + 1 < len(steps) else None
        runs = store.arrow_table(
            self.con,
            """
            SELECT g.start_ns, g.end_ns, g.state, coalesce(a.launch_end_ns, g.start_ns) AS launch_end_ns
            FROM (SELECT * FROM gpu_segments WHERE file_id = $f AND step = $s) g
            ASOF LEFT JOIN (SELECT ts_ns, launch_end_ns FROM activities
                            WHERE file_id = $f AND ts_ns >= $lo AND ($hi IS NULL OR ts_ns < $hi)) a
              ON a.ts_ns >= g.end_ns
            ORDER BY g.start_ns
            """,
            {"f": file_id, "s": self.step, "lo": int(r.steps.start_ns[i]), "hi": hi},
        )
        s, e, le = (numpy_of(runs.column(c), np.int64) for c in ("start_ns", "end_ns", "launch_end_ns"))
        state = runs.column("state").to_numpy(zero_copy_only=False)
        # An idle run is two pieces, host ('launch') up to the call's return, then idle; each piece
        # inside the data loader's spans is host ('dataloader').
        idle = state == "idle"
        cut = np.minimum(np.maximum(le, s), e)
        first = np.arange(len(s)) + np.cumsum(idle) - idle   # where each run's first piece goes
        n = len(s) + int(idle.sum())
        ps, pe, kind, what = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, object), np.empty(n, object)
        ps[first], pe[first], kind[first] = s, np.where(idle, cut, e), state
        kind[first[idle]], what[first[idle]] = "host", "launch"
        second = first[idle] + 1
        ps[second], pe[second], kind[second], what[second] = cut[idle], e[idle], "idle", None
        from_idle = np.zeros(n, bool)
        from_idle[first[idle]] = from_idle[second] = True
        pieces = _in_loader(Segments.of(r.rank, kind, ps, pe, what), from_idle, *r.dataloader_spans)
        off = self.offsets.get(r.rank, 0)
        keep = pieces.end_ns > pieces.start_ns
        return Segments(pieces.rank[keep], pieces.kind[keep], pieces.start_ns[keep] + off, pieces.end_ns[keep] + off,
                        pieces.what[keep])


def _in_loader(pieces: Segments, split: npt.NDArray[np.bool_], ds: I64, de: I64) -> Segments:
    """The `split` pieces cut where they enter and leave the data loader's spans (ds, de), the parts
    inside as host ('dataloader'); the rest as they are. Only the pieces a span overlaps are cut."""
    if not len(ds):
        return pieces
    cut_here = split & overlapped(ds, de, pieces.start_ns, pieces.end_ns)
    if not cut_here.any():
        return pieces
    spans = sorted(zip(ds.tolist(), de.tolist(), strict=True))
    parts: list[Segments] = []
    at = 0
    for k in np.flatnonzero(cut_here).tolist():
        parts.append(pieces.rows(slice(at, k)))
        a, b, rank, kind, what = (int(pieces.start_ns[k]), int(pieces.end_ns[k]), int(pieces.rank[k]),
                                  str(pieces.kind[k]), pieces.what[k])
        cut = list(_split(a, b, spans))
        parts.append(Segments.of(rank, ["host" if inside else kind for *_, inside in cut],
                                 [x for x, _, _ in cut], [y for _, y, _ in cut],
                                 ["dataloader" if inside else what for *_, inside in cut]))
        at = k + 1
    parts.append(pieces.rows(slice(at, len(pieces))))
    return Segments.joined(parts)


def _split(a: int, b: int, spans: list[tuple[int, int]]) -> Iterator[tuple[int, int, bool]]:
    """[a, b) cut into pieces inside and outside the (sorted) spans."""
    t = a
    for s, e in spans:
        if e <= t or s >= b:
            continue
        if s > t:
            yield t, s, False
        yield max(s, t), min(e, b), True
        t = min(e, b)
    if t < b:
        yield t, b, False


def _walk(step: int, windows: dict[int, tuple[int, int]], joins: dict[int, list[_Join]], runs: RunCache,
          files: dict[int, RankDigest]) -> Segments:
    """The step's path, walked back from the latest window end: what each rank ran until the join
    where it waited, then the rank it waited for. In time order."""
    if not windows:
        return Segments.joined([])
    f = max(windows, key=lambda k: (windows[k][1], -k))
    t = windows[f][1]
    used: set[tuple[int, str]] = set()
    out: list[Segments] = []   # latest first, each part in time order
    while True:
        start = windows[f][0]
        rank = files[f].rank
        j = next((j for j in reversed(joins.get(f, ())) if j.wait_start_ns < t and j.arrive_ns > start
                  and (f, j.instance) not in used), None)
        if j is None:
            out.append(_clipped(runs.of(f), start, t))
            break
        used.add((f, j.instance))
        arrive = min(j.arrive_ns, t)
        out.append(_clipped(runs.of(f), arrive, t))
        last = next((k for k in range(len(out) - 1, -1, -1) if len(out[k])), None)
        if last is not None and out[last].kind[0] == "comm" and out[last].start_ns[0] == arrive:
            # The joined instance's transfer: the earliest segment walked so far.
            p = out[last]
            ranks, what = p.rank.copy(), p.what.copy()
            ranks[0], what[0] = rank, j.instance
            out[last] = Segments(ranks, p.kind, p.start_ns, p.end_ns, what)
        if j.to_file is None or j.to_file not in windows:
            # The late rank left no trace of this step: its wait is all the path can show.
            out.append(Segments.of(rank, "wait", [max(j.wait_start_ns, start)], [arrive], j.instance))
            t = max(j.wait_start_ns, start)
            continue
        f, t = j.to_file, arrive
    return Segments.joined(out[::-1])


def _clipped(runs: Segments, a: int, b: int) -> Segments:
    """The runs since the last one ending by `a` that start before `b`, clipped to [a, b)."""
    hi = int(np.searchsorted(runs.start_ns, b, side="left"))
    ended = np.flatnonzero(runs.end_ns[:hi] <= a)
    part = runs.rows(slice(int(ended[-1]) + 1 if len(ended) else 0, hi))
    return Segments(part.rank, part.kind, np.maximum(part.start_ns, a), np.minimum(part.end_ns, b), part.what)


def _merge(segs: Segments) -> Segments:
    """Adjacent segments of one rank, kind and `what` as one."""
    segs = segs.rows(segs.end_ns > segs.start_ns)
    if not len(segs):
        return segs
    new = np.ones(len(segs), bool)
    new[1:] = ((segs.rank[1:] != segs.rank[:-1]) | (segs.kind[1:] != segs.kind[:-1])
               | (segs.what[1:] != segs.what[:-1]) | (segs.end_ns[:-1] != segs.start_ns[1:]))
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(segs)) - 1
    return Segments(segs.rank[first], segs.kind[first], segs.start_ns[first], segs.end_ns[last], segs.what[first])


def report_entry(p: StepPath) -> dict[str, Any]:
    """The report's `critical_path` item: at most MAX_SEGMENTS segments (the longest, in time order)
    and the rest summed under `omitted`; the summary counts every segment."""
    seg = p.segments
    length = seg.end_ns - seg.start_ns
    keep = np.argsort(-length, kind="stable")[:MAX_SEGMENTS]
    keep = keep[np.argsort(seg.start_ns[keep], kind="stable")]
    left = np.ones(len(seg), bool)
    left[keep] = False
    kept = seg.rows(keep)
    return {
        "step": p.step,
        "segments": [{"rank": r, "kind": k, "start_us": s / 1000, "end_us": e / 1000, "what": w}
                     for r, k, s, e, w in zip(kept.rank.tolist(), kept.kind.tolist(), kept.start_ns.tolist(),
                                              kept.end_ns.tolist(), kept.what.tolist(), strict=True)],
        "omitted": {"segments": int(left.sum()), "us_by_kind": _sums(seg.kind[left], length[left], 1000)},
        "summary": {"length_us": p.length_ns / 1000, "by_kind": p.share("kind"), "by_rank": p.share("rank")},
    }


def write(con: duckdb.DuckDBPyConnection, paths: list[StepPath]) -> None:
    if not any(len(p.segments) for p in paths):
        return
    seg = Segments.joined([p.segments for p in paths])
    names = [r[0] for r in con.execute("DESCRIBE critical_path").fetchall()]
    columns = (np.repeat([p.step for p in paths], [len(p.segments) for p in paths]),
               np.concatenate([np.arange(len(p.segments)) for p in paths]),
               seg.rank, seg.kind, seg.start_ns, seg.end_ns, seg.what)
    store.insert_arrow(con, "critical_path", pa.table(
        {n: pa.array(c.tolist() if c.dtype.kind in "UO" else c) for n, c in zip(names, columns, strict=True)}))
