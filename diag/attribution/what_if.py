"""What-ifs re-timed on the critical path's graph (docs/critical_path.md "What-ifs").

One re-timer for every time cause: a cause says which intervals of which rank's step get shorter
(`Saving`) and which collective transfers no longer hold their rank (`hidden`); the re-timer moves
each rank's work earlier by what it saved, re-times every collective and send/recv pair in the
order they ended (a call starts earlier by what its rank saved before it, or by what the call it
was queued behind gained; an instance ends when its last member arrives plus its transfer), and
where a rank's GPU waited on a call (only communication ran until the call's end) its work after
the call goes no earlier than the call's new end allows. So the next bottleneck takes over: a
rank that saved nothing still ends where it did, and a collective still waits for its last rank.

The bubble is not a saving on this graph: it is made by the joins themselves (a stage waits for
its neighbour), and shrinking it means more microbatches, another graph. Its what-if is the
closed form: each rank's time outside the bubble with the bubble at the schedule's floor.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property

import duckdb
import msgspec
import numpy as np
from msgspec.structs import replace

from diag.attribution.analysis import Finding, RunContext
from diag.attribution.critical_path import aligned_offsets
from diag.runtime import store
from diag.timeline.collectives import Call
from diag.timeline.rank import read_batches
from diag.timeline.states import union

# A call starting within this of an earlier call's end on its rank was queued behind it (ns).
QUEUED_NS = 1000


class Saving(msgspec.Struct, frozen=True):
    """[start, end) of one rank's step (aligned) runs `saved_ns` shorter, spread evenly over it."""

    start_ns: int
    end_ns: int
    saved_ns: float


class _Call(msgspec.Struct, frozen=True):
    """One step's matched call, aligned, as the re-timer walks it."""

    file_id: int
    act: int        # the kernel's index in its rank's timeline
    start_ns: int   # aligned
    end_ns: int
    blocked_ns: int | None   # where the communication-only run holding its end began (Retimer.blocked)


class Change(msgspec.Struct):
    """What a cause shortens: per step number, per file, its savings (disjoint, any order); and
    per collective call (file, activity index), the transfer time it no longer holds its rank for.
    Point-to-point transfers are never hidden: their communication-only time is the bubble."""

    savings: dict[int, dict[int, list[Saving]]]
    hidden: Mapping[tuple[int, int], int]


def retimed(con: duckdb.DuckDBPyConnection, run: RunContext, findings: list[Finding]) -> list[Finding]:
    """Each finding with `what_if_mfu_naive` (its bucket-removal estimate) and `what_if_mfu`
    re-timed where diag builds a re-timed what-if for its code (CHANGES, and MFU002's floor), the
    naive value elsewhere."""
    graph = Retimer(con, run) if any(f.code in CHANGES for f in findings) else None
    out = []
    for f in findings:
        value = None
        if run.mfu is not None and run.peak.flops_per_s is not None:
            if graph is not None and f.code in CHANGES:
                value = graph.mfu(CHANGES[f.code](graph, f))
            elif f.code == "MFU002":
                value = _mfu(run, bubble_at_floor(run, f.details.get("theoretical_bubble") or 0.0))
        out.append(replace(f, what_if_mfu=f.what_if_mfu if value is None else value, what_if_mfu_naive=f.what_if_mfu))
    return out


class Retimer:
    """The run's joins per step, read once; `mfu(change)` re-times every step under a change.

    The matched calls are kept as flat arrays sorted by step (a 128-rank run has about a million):
    one step's calls become `_Call`s only while that step is re-timed."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run: RunContext):
        self.con, self.run = con, run
        self.offsets = aligned_offsets(run)
        self.files = {r.file_id: r for r in run.ranks}
        self.keys: dict[int, list[tuple[int, int]]] = defaultdict(list)   # step → (file, step index)
        for k, st in run.states.items():
            self.keys[st.step].append(k)
        ms = sorted((m for m in run.matched if m.call.step is not None), key=lambda m: m.call.step or 0)
        self.matched = ms
        off = np.asarray([self.offsets.get(m.call.rank, 0) for m in ms], np.int64)
        self.file = np.asarray([m.call.file_id for m in ms], np.int64)
        self.start = np.asarray([m.call.ts_ns for m in ms], np.int64) + off
        self.end = np.asarray([m.call.end_ns for m in ms], np.int64) + off
        self.act = np.asarray([m.call.act for m in ms], np.int64)
        steps, first = np.unique(np.asarray([m.call.step for m in ms], np.int64), return_index=True)
        last = np.append(first[1:], len(ms)) if len(ms) else first   # a run with no matched call: none
        self.bounds = {int(s): (int(a), int(b)) for s, a, b in zip(steps, first, last, strict=True)}

    @cached_property
    def blocked(self) -> np.ndarray:
        """Per matched call, where the GPU's communication-only run holding the call's end began
        (aligned), −1 where compute ran beside its end: from there its rank had nothing but the
        communication to do, so its work after the call waited on it."""
        out = np.full(len(self.matched), -1, np.int64)
        rows = self.con.execute(
            "SELECT file_id, start_ns, end_ns FROM gpu_segments WHERE state = 'comm' ORDER BY file_id, end_ns"
        ).fetchnumpy()
        fid, rs, re_ = (np.asarray(rows[k], np.int64) for k in ("file_id", "start_ns", "end_ns"))
        for f, r in self.files.items():
            lo, hi = np.searchsorted(fid, [f, f + 1])
            mine = np.nonzero(self.file == f)[0]
            if hi == lo or not len(mine):
                continue
            off = self.offsets.get(r.rank, 0)
            starts, ends = rs[lo:hi] + off, re_[lo:hi] + off
            i = np.searchsorted(ends, self.end[mine], side="left")
            inside = i < len(ends)
            i = np.minimum(i, len(ends) - 1)
            inside &= starts[i] < self.end[mine]
            out[mine[inside]] = starts[i[inside]]
        return out

    def window(self, file_id: int, i: int) -> tuple[int, int]:
        r = self.files[file_id]
        off = self.offsets.get(r.rank, 0)
        return int(r.steps.start_ns[i]) + off, int(r.steps.end_ns[i]) + off

    @cached_property
    def indices(self) -> dict[int, list[int]]:
        """file → the indices of its analyzed steps."""
        out: dict[int, list[int]] = defaultdict(list)
        for fid, i in sorted(self.run.states):
            out[fid].append(i)
        return out

    def state_runs(self, file_ids: list[int], state: str) -> Iterator[tuple[int, list[tuple[int, int]]]]:
        """Each file with its GPU runs of one state over all its steps, aligned, in time order. Read
        a batch of files a query (timeline.read_batches: ~100k events, a big file alone): a query per
        file costs ~1 ms, 9 s over 10,000 ranks, and one for all would hold every rank's runs at once."""
        for batch in read_batches(self.con, file_ids):
            rows = self.con.execute(
                f"SELECT file_id, start_ns, end_ns FROM gpu_segments WHERE state = $s "
                f"AND file_id IN ({store.id_set(batch)}) ORDER BY file_id, start_ns",
                {"s": state}).fetchnumpy()
            fid, rs, re_ = (np.asarray(rows[k], np.int64) for k in ("file_id", "start_ns", "end_ns"))
            for f in batch:
                lo, hi = np.searchsorted(fid, [f, f + 1])
                off = self.offsets.get(self.files[f].rank, 0)
                yield f, list(zip((rs[lo:hi] + off).tolist(), (re_[lo:hi] + off).tolist(), strict=True))

    def in_window(self, spans: list[tuple[int, int]], file_id: int, i: int, fraction: float) -> list[Saving]:
        """Sorted disjoint spans cut to the file's step window i, each saving `fraction` of its length."""
        ws, we = self.window(file_id, i)
        k = max(bisect.bisect_right(spans, (ws, ws)) - 1, 0)
        out = []
        while k < len(spans) and spans[k][0] < we:
            a, b = max(spans[k][0], ws), min(spans[k][1], we)
            if b > a:
                out.append(Saving(a, b, (b - a) * fraction))
            k += 1
        return out

    def mfu(self, change: Change) -> float | None:
        return _mfu(self.run, {step: self.ratio(step, change) for step in self.keys})

    def _members(self, step: int, windows: Mapping[int, tuple[int, int]]) -> dict[str, list[tuple[_Call, bool]]]:
        """The step's instances: their calls on the ranks whose step is analyzed, and whether each is point-to-point."""
        lo, hi = self.bounds.get(step, (0, 0))
        blocked = self.blocked
        out: dict[str, list[tuple[_Call, bool]]] = defaultdict(list)
        for k in range(lo, hi):
            m = self.matched[k]
            if m.call.file_id in windows:
                b = int(blocked[k])
                out[m.instance].append((_Call(m.call.file_id, m.call.act, int(self.start[k]), int(self.end[k]),
                                              None if b < 0 else b), _p2p(m.call)))
        return out

    def ratio(self, step: int, change: Change) -> float:
        """The step's re-timed length over its length: last window end less the first window start."""
        windows = {fid: self.window(fid, i) for fid, i in self.keys[step]}
        savings = change.savings.get(step, {})
        chains = {fid: _Chain(savings.get(fid, [])) for fid in windows}
        members = self._members(step, windows)
        gained: dict[_Call, float] = {}
        done_on: dict[int, list[_Call]] = defaultdict(list)   # file → its calls re-timed so far
        for inst in sorted(members, key=lambda k: max(c.end_ns for c, _ in members[k])):
            ms = members[inst]
            new_start = {}
            for c, _ in ms:
                queued = [gained[p] for p in done_on[c.file_id] if abs(c.start_ns - p.end_ns) <= QUEUED_NS]
                new_start[c] = c.start_ns - max([chains[c.file_id].shift(c.start_ns), *queued])
            transfer = min(c.end_ns - c.start_ns for c, _ in ms)   # the time it took once all had arrived
            end = max(c.start_ns for c, _ in ms) + transfer
            arrived = max(new_start.values())
            for c, p2p in ms:
                hidden = 0 if p2p else change.hidden.get((c.file_id, c.act), 0)
                gained[c] = max(end - (arrived + max(transfer - hidden, 0)), 0.0)
                done_on[c.file_id].append(c)
                if c.blocked_ns is not None:
                    # Its work after the call ran once both were done: what ran before the GPU
                    # started waiting (moved by its own shift) and the call (moved by what it gained).
                    chain = chains[c.file_id]
                    chain.join(c.end_ns, min(chain.shift(c.blocked_ns) + (c.end_ns - c.blocked_ns), gained[c]))
        start = min(w[0] for w in windows.values())
        old = max(w[1] for w in windows.values()) - start
        new = max(w[1] - chains[fid].shift(w[1]) for fid, w in windows.items()) - start
        return new / old if old > 0 else 1.0


class _Chain:
    """One rank's work in a step: how much earlier what ran at time t runs under a change."""

    def __init__(self, savings: list[Saving]):
        ordered = sorted(savings, key=lambda s: s.start_ns)
        self.savings = ordered
        self.starts = [s.start_ns for s in ordered]
        self.before: list[float] = []   # saved before each saving
        total = 0.0
        for s in ordered:
            self.before.append(total)
            total += s.saved_ns
        self.joins: list[tuple[int, float]] = []   # (time, shift there): the call's end it waited on

    def saved(self, t: int) -> float:
        """Time saved before t: whole savings before it, and the part of one t cuts."""
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return 0.0
        s = self.savings[i]
        return self.before[i] + s.saved_ns * (min(t, s.end_ns) - s.start_ns) / max(s.end_ns - s.start_ns, 1)

    def shift(self, t: int) -> float:
        i = bisect.bisect_right(self.joins, (t, float("inf"))) - 1
        if i < 0:
            return self.saved(t)
        at, base = self.joins[i]
        return base + self.saved(t) - self.saved(at)

    def join(self, t: int, shift: float) -> None:
        bisect.insort(self.joins, (t, shift))


def _mfu(run: RunContext, ratio: dict[int, float]) -> float | None:
    """The MFU as the report computes it (Σ model FLOPs ÷ (Σ windows × peak) over ranks and steps)
    with each step's windows scaled by its ratio."""
    if run.peak.flops_per_s is None:
        return None
    vals = [st for st in run.states.values() if st.window_ns > 0]
    at_peak = sum(st.window_ns * 1e-9 * ratio.get(st.step, 1.0) for st in vals) * run.peak.flops_per_s
    return sum(st.model_flops or 0.0 for st in vals) / at_peak if vals else None


# ---- the causes ----------------------------------------------------------------------------------

def straggler(graph: Retimer, f: Finding) -> Change:
    """MFU005: each named rank whose compute exceeds the step's median rank's has its compute runs
    shortened by 1 − median ÷ its compute (the median rank's speed)."""
    run, slow = graph.run, set(f.ranks)
    out: dict[int, dict[int, list[Saving]]] = defaultdict(dict)
    median = {step: statistics.median(run.states[k].compute_ns for k in keys) for step, keys in graph.keys.items()}
    for fid, runs in graph.state_runs([fid for fid in graph.indices if graph.files[fid].rank in slow], "compute"):
        for i in graph.indices[fid]:
            st = run.states[(fid, i)]
            if st.compute_ns > median[st.step]:
                out[st.step][fid] = graph.in_window(runs, fid, i, 1 - median[st.step] / st.compute_ns)
    return Change(dict(out), {})


def loader(graph: Retimer, f: Finding) -> Change:
    """MFU006: the GPU's idle time under the data loader's span (the path's `host` dataloader
    segments, the ledger's `dataloader` bucket) removed from every rank's step."""
    run = graph.run
    out: dict[int, dict[int, list[Saving]]] = defaultdict(dict)
    stalled = {fid: [i for i in indices if run.states[(fid, i)].dataloader_ns > 0]
               for fid, indices in graph.indices.items()}
    for fid, idle in graph.state_runs([fid for fid, steps in stalled.items() if steps], "idle"):
        off = graph.offsets.get(graph.files[fid].rank, 0)
        ls, le = union(*graph.files[fid].dataloader_spans)
        under = _intersect(idle, list(zip((ls + off).tolist(), (le + off).tolist(), strict=True)))
        for i in stalled[fid]:
            out[run.states[(fid, i)].step][fid] = graph.in_window(under, fid, i, 1.0)
    return Change(dict(out), {})


def exposed(graph: Retimer, f: Finding) -> Change:
    """MFU001: every collective's exposed transfer (its time with no compute beside it, less its
    wait for the last rank: RunContext.exposed_ns, what MFU001 counts) hidden: the call no longer
    holds its rank for it, but still ends no earlier than its last rank arrives. A call no other
    rank's matched is a plain saving on its rank, at its end."""
    run = graph.run
    present = {(fid, st.step) for (fid, _), st in run.states.items()}
    out: dict[int, dict[int, list[Saving]]] = defaultdict(lambda: defaultdict(list))
    for r in run.ranks:
        off = graph.offsets.get(r.rank, 0)
        matched = set(graph.act[graph.file == r.file_id].tolist())
        for c in r.calls:
            ns = run.exposed_ns.get((r.file_id, c.act), 0)
            if (ns > 0 and not _p2p(c) and c.step is not None and (r.file_id, c.step) in present
                    and c.act not in matched):
                out[c.step][r.file_id].append(Saving(c.end_ns + off - ns, c.end_ns + off, ns))
    return Change({s: dict(v) for s, v in out.items()}, run.exposed_ns)


def _p2p(c: Call) -> bool:
    """A send or receive: its communication-only time is the pipeline's bubble, MFU002's."""
    return c.direction is not None or "sendrecv" in c.collective


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts two sorted lists of disjoint intervals share."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def what_if_words(code: str) -> str:
    """What a finding's what_if_mfu assumes, in the words the reports put beside it: its cause gone,
    or for the bubble, at the schedule's floor (at this p and m it cannot go lower)."""
    return "with the bubble at its floor" if code == "MFU002" else "without it"


# Each re-timed cause's change, by finding code.
CHANGES: dict[str, Callable[[Retimer, Finding], Change]] = {"MFU005": straggler, "MFU006": loader, "MFU001": exposed}


def bubble_at_floor(run: RunContext, floor: float) -> dict[int, float]:
    """MFU002, per step: each rank's time outside the bubble (its window less its point-to-point
    only time) over 1 − floor is its window with the bubble at `floor` of it (the schedule's
    (p−1)/(m+p−1)/v, DESIGN.md; 0 where p and m are not detected), never longer than it was; the
    step is as long as its longest rank. Ratio: that over the longest window as measured."""
    new: dict[int, int | float] = defaultdict(float)
    old: dict[int, int] = defaultdict(int)
    for st in run.states.values():
        new[st.step] = max(new[st.step], min(st.window_ns, (st.window_ns - st.p2p_only_ns) / (1 - floor)))
        old[st.step] = max(old[st.step], st.window_ns)
    return {step: new[step] / old[step] if old[step] else 1.0 for step in old}
