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
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from diag import kernels, store
from diag.analysis import RunContext
from diag.collectives import Matched
from diag.digest import RankDigest
from diag.timeline import numpy_of

KINDS = ("compute", "comm", "wait", "copy", "idle", "host")

# Segments kept per step in the report: the longest, in time order; the rest are summed. A step of
# a large run can cross thousands of state runs; the report has to stay readable and small.
MAX_SEGMENTS = 40


@dataclass(frozen=True, slots=True)
class Segment:
    rank: int
    kind: str          # KINDS
    start_ns: int      # aligned clock (clock_offsets)
    end_ns: int
    what: str | None   # collective instance, 'dataloader' or 'launch' (host), else the kernel or copy
                       # that ran longest in it (None: none the step launched)


@dataclass(frozen=True)
class StepPath:
    step: int
    segments: list[Segment]     # in time order, merged, all of them (the store keeps them all)

    @property
    def length_ns(self) -> int:
        return sum(s.end_ns - s.start_ns for s in self.segments)

    def share(self, key: str) -> dict[str, float]:
        """Share of the path's length per `kind` or per `rank`."""
        total = self.length_ns or 1
        out: dict[str, float] = defaultdict(float)
        for s in self.segments:
            out[str(getattr(s, key))] += (s.end_ns - s.start_ns) / total
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@dataclass(frozen=True, slots=True)
class _Join:
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
    todo = [(k, j, p.step, s) for k, p in enumerate(paths) for j, s in enumerate(p.segments)
            if s.what is None and s.kind in ("compute", "comm", "copy") and s.rank in file_of[p.step]]
    if not todo:
        return paths
    con.register("path_segments", pa.table({   # on each rank's own clock, as the activities are
        "i": range(len(todo)), "step": [step for _, _, step, _ in todo],
        "f": [file_of[step][s.rank] for _, _, step, s in todo], "kind": [s.kind for *_, s in todo],
        "s": [s.start_ns - offsets.get(s.rank, 0) for *_, s in todo],
        "e": [s.end_ns - offsets.get(s.rank, 0) for *_, s in todo],
    }))
    try:
        segments = store.arrow_table(con, _GROUP_SEGMENTS)
        acts = store.arrow_table(con, _GROUP_ACTIVITIES)
    finally:
        con.unregister("path_segments")
    seg, act = _longest_in(*(numpy_of(segments.column(c), np.int64) for c in ("gid", "s", "e")),
                           *(numpy_of(acts.column(c), np.int64) for c in ("gid", "ts_ns", "end_ns")))
    names = acts.column("name").take(pa.array(act)).to_pylist()
    segs = [list(p.segments) for p in paths]
    for i, name in zip(numpy_of(segments.column("i"), np.int64)[seg].tolist(), names, strict=True):
        k, j, _, s = todo[i]
        segs[k][j] = Segment(s.rank, s.kind, s.start_ns, s.end_ns, kernels.head(name).strip()[:NAME_CHARS])
    return [StepPath(p.step, v) for p, v in zip(paths, segs, strict=True)]


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
        self.cache: dict[int, list[tuple[int, int, str, str | None]]] = {}

    def of(self, file_id: int) -> list[tuple[int, int, str, str | None]]:
        if file_id not in self.cache:
            self.cache[file_id] = list(self._read(file_id))
        return self.cache[file_id]

    def _read(self, file_id: int) -> Iterator[tuple[int, int, str, str | None]]:
        r = self.files[file_id]
        off = self.offsets.get(r.rank, 0)
        steps = r.steps.step
        if self.step not in steps:
            return
        i = steps.index(self.step)
        # The next activity by start after an idle run: the GPU waited for its launch call until it
        # returned (states._host_bound, the ledger's host_bound). Windows tile the timeline, so it
        # starts before the next window ends.
        hi = int(r.steps.end_ns[i + 1]) if i + 1 < len(steps) else None
        rows = self.con.execute(
            """
            SELECT g.start_ns, g.end_ns, g.state, a.launch_end_ns
            FROM (SELECT * FROM gpu_segments WHERE file_id = $f AND step = $s) g
            ASOF LEFT JOIN (SELECT ts_ns, launch_end_ns FROM activities
                            WHERE file_id = $f AND ts_ns >= $lo AND ($hi IS NULL OR ts_ns < $hi)) a
              ON a.ts_ns >= g.end_ns
            ORDER BY g.start_ns
            """,
            {"f": file_id, "s": self.step, "lo": int(r.steps.start_ns[i]), "hi": hi},
        ).fetchall()
        ds, de = r.dataloader_spans
        loader = sorted(zip(ds.tolist(), de.tolist(), strict=True))
        for s, e, state, le in rows:
            if state != "idle":
                yield s + off, e + off, state, None
                continue
            cut = s if le is None else min(max(le, s), e)
            for a, b, kind, what in ((s, cut, "host", "launch"), (cut, e, "idle", None)):
                for pa_, pb, in_loader in _split(a, b, loader):
                    if pb > pa_:
                        yield pa_ + off, pb + off, "host" if in_loader else kind, "dataloader" if in_loader else what


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
          files: dict[int, RankDigest]) -> list[Segment]:
    if not windows:
        return []
    f = max(windows, key=lambda k: (windows[k][1], -k))
    t = windows[f][1]
    used: set[tuple[int, str]] = set()
    out: list[Segment] = []
    while True:
        start = windows[f][0]
        rank = files[f].rank
        j = next((j for j in reversed(joins.get(f, ())) if j.wait_start_ns < t and j.arrive_ns > start
                  and (f, j.instance) not in used), None)
        if j is None:
            out.extend(_segments(runs.of(f), rank, start, t))
            break
        used.add((f, j.instance))
        arrive = min(j.arrive_ns, t)
        out.extend(_segments(runs.of(f), rank, arrive, t))
        if out and out[-1].kind == "comm" and out[-1].start_ns == arrive:
            out[-1] = Segment(rank, "comm", arrive, out[-1].end_ns, j.instance)   # the joined instance's transfer
        if j.to_file is None or j.to_file not in windows:
            # The late rank left no trace of this step: its wait is all the path can show.
            out.append(Segment(rank, "wait", max(j.wait_start_ns, start), arrive, j.instance))
            t = max(j.wait_start_ns, start)
            continue
        f, t = j.to_file, arrive
    out.reverse()
    return out


def _segments(runs: list[tuple[int, int, str, str | None]], rank: int, a: int, b: int) -> Iterator[Segment]:
    """Runs clipped to [a, b), latest first (the walk goes back in time)."""
    for s, e, kind, what in reversed(runs):
        if e <= a:
            break
        if s < b:
            yield Segment(rank, kind, max(s, a), min(e, b), what)


def _merge(segs: list[Segment]) -> list[Segment]:
    """Adjacent segments of one rank, kind and `what` as one."""
    out: list[Segment] = []
    for s in segs:
        if s.end_ns <= s.start_ns:
            continue
        p = out[-1] if out else None
        if p is not None and (p.rank, p.kind, p.what) == (s.rank, s.kind, s.what) and p.end_ns == s.start_ns:
            out[-1] = Segment(p.rank, p.kind, p.start_ns, s.end_ns, p.what)
        else:
            out.append(s)
    return out


def report_entry(p: StepPath) -> dict[str, Any]:
    """The report's `critical_path` item: at most MAX_SEGMENTS segments (the longest, in time order)
    and the rest summed under `omitted`; the summary counts every segment."""
    keep = sorted(sorted(p.segments, key=lambda s: -(s.end_ns - s.start_ns))[:MAX_SEGMENTS],
                  key=lambda s: s.start_ns)
    kept = set(map(id, keep))
    left = [s for s in p.segments if id(s) not in kept]
    omitted: dict[str, float] = defaultdict(float)
    for s in left:
        omitted[s.kind] += (s.end_ns - s.start_ns) / 1000
    return {
        "step": p.step,
        "segments": [{"rank": s.rank, "kind": s.kind, "start_us": s.start_ns / 1000, "end_us": s.end_ns / 1000,
                      "what": s.what} for s in keep],
        "omitted": {"segments": len(left), "us_by_kind": dict(omitted)},
        "summary": {"length_us": p.length_ns / 1000, "by_kind": p.share("kind"), "by_rank": p.share("rank")},
    }


def write(con: duckdb.DuckDBPyConnection, paths: list[StepPath]) -> None:
    store.insert_rows(con, "critical_path", [
        (p.step, i, s.rank, s.kind, s.start_ns, s.end_ns, s.what) for p in paths for i, s in enumerate(p.segments)
    ])
