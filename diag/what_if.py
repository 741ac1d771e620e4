"""What-ifs re-timed on the critical path's graph (docs/critical_path.md "What-ifs").

The straggler's: the late ranks' compute at the median rank's speed, then every collective and
send/recv pair re-timed in the order they ended: a call starts earlier by the compute its rank no
longer spends before it, or by what the call queued right behind it gained; an instance ends when
its last member arrives plus its transfer (its shortest member's duration); each rank's step ends
its tail after its last call later. So another rank takes over the path where it would.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace

import duckdb

from diag.analysis import Finding, RunContext
from diag.collectives import Matched
from diag.critical_path import RunCache, aligned_offsets

# A call starting within this of an earlier call's end on its rank was queued behind it (ns).
QUEUED_NS = 1000


@dataclass(frozen=True, slots=True)
class _Call:
    file_id: int
    start_ns: int   # aligned
    end_ns: int
    instance: str


def retimed(con: duckdb.DuckDBPyConnection, run: RunContext, findings: list[Finding]) -> list[Finding]:
    """Each finding with `what_if_mfu_naive` (its bucket-removal estimate) and `what_if_mfu`
    re-timed where diag can (MFU005), the naive value elsewhere."""
    out = []
    for f in findings:
        graph = straggler_what_if(con, run, set(f.ranks)) if f.code == "MFU005" else None
        out.append(replace(f, what_if_mfu=f.what_if_mfu if graph is None else graph, what_if_mfu_naive=f.what_if_mfu))
    return out


def straggler_what_if(con: duckdb.DuckDBPyConnection, run: RunContext, slow: set[int]) -> float | None:
    """The MFU with the `slow` ranks' compute at the median rank's speed, re-timed."""
    if run.mfu is None or run.peak.flops_per_s is None:
        return None
    offsets = aligned_offsets(run)
    files = {r.file_id: r for r in run.ranks}
    by_step: dict[int, list[tuple[int, int]]] = defaultdict(list)   # step → (file, index)
    for fid, i in run.states:
        by_step[run.states[(fid, i)].step].append((fid, i))
    calls = _calls(run.matched, offsets)
    ratio: dict[int, float] = {}
    for step, keys in by_step.items():
        runs = RunCache(con, files, offsets, step)
        median = statistics.median(run.states[k].compute_ns for k in keys)
        saved: dict[int, tuple[float, list[tuple[int, int, float]]]] = {}   # file → (fraction saved, its compute runs)
        for fid, i in keys:
            st = run.states[(fid, i)]
            if _rank(run, fid) in slow and st.compute_ns > median:
                frac = 1 - median / st.compute_ns
                saved[fid] = (frac, _savings(runs, fid, frac, _window(run, offsets, fid, i)))
        old, new = _retime(run, offsets, keys, calls.get(step, []), saved)
        ratio[step] = new / old if old > 0 else 1.0
    vals = [(st.model_flops or 0.0) / (st.window_ns * 1e-9 * ratio[st.step] * run.peak.flops_per_s)
            for st in run.states.values() if st.window_ns > 0]
    return statistics.fmean(vals) if vals else None


def _rank(run: RunContext, file_id: int) -> int:
    return next(r.rank for r in run.ranks if r.file_id == file_id)


def _window(run: RunContext, offsets: dict[int, int], file_id: int, i: int) -> tuple[int, int]:
    r = next(r for r in run.ranks if r.file_id == file_id)
    off = offsets.get(r.rank, 0)
    return int(r.steps.start_ns[i]) + off, int(r.steps.end_ns[i]) + off


def _calls(matched: list[Matched], offsets: dict[int, int]) -> dict[int, list[_Call]]:
    out: dict[int, list[_Call]] = defaultdict(list)
    for m in matched:
        c = m.call
        if c.step is not None:
            off = offsets.get(c.rank, 0)
            out[c.step].append(_Call(c.file_id, c.ts_ns + off, c.end_ns + off, m.instance))
    return out


def _savings(runs: RunCache, file_id: int, fraction: float, window: tuple[int, int]) -> list[tuple[int, int, float]]:
    """(start, end, saving before it) of each compute run in the window, saving `fraction` of each."""
    out, total = [], 0.0
    for s, e, kind, _ in runs.of(file_id):
        if kind == "compute" and e > window[0] and s < window[1]:
            a, b = max(s, window[0]), min(e, window[1])
            out.append((a, b, total))
            total += (b - a) * fraction
    return out


def _saved_by(fraction: float, saved: list[tuple[int, int, float]], t: int) -> float:
    """Compute time saved before t: whole runs before it, and the part of a run t cuts."""
    i = bisect.bisect_right(saved, (t, t, float("inf"))) - 1
    if i < 0:
        return 0.0
    s, e, before = saved[i]
    return before + (min(t, e) - s) * fraction


def _retime(run: RunContext, offsets: dict[int, int], keys: list[tuple[int, int]], calls: list[_Call],
            saved: dict[int, tuple[float, list[tuple[int, int, float]]]]) -> tuple[float, float]:
    """(step length, re-timed step length): last window end less the first window start."""
    windows = {fid: _window(run, offsets, fid, i) for fid, i in keys}
    start = min(w[0] for w in windows.values())
    members: dict[str, list[_Call]] = defaultdict(list)
    for c in calls:
        if c.file_id in windows:
            members[c.instance].append(c)
    gained: dict[_Call, float] = {}
    ends_on: dict[int, list[_Call]] = defaultdict(list)   # file → its calls re-timed so far
    for inst in sorted(members, key=lambda k: max(c.end_ns for c in members[k])):
        ms = members[inst]
        new_start = {}
        for c in ms:
            frac, runs_ = saved.get(c.file_id, (0.0, []))
            shift = _saved_by(frac, runs_, c.start_ns)
            queued = [gained[p] for p in ends_on[c.file_id] if abs(c.start_ns - p.end_ns) <= QUEUED_NS]
            new_start[c] = c.start_ns - max([shift, *queued])
        transfer = min(c.end_ns - c.start_ns for c in ms)
        end = max(new_start.values()) + transfer
        orig_end = max(c.start_ns for c in ms) + transfer
        for c in ms:
            gained[c] = max(orig_end - end, 0.0)
            ends_on[c.file_id].append(c)
    new_ends = []
    for fid, (_, w_end) in windows.items():
        last = max(ends_on.get(fid, []), key=lambda c: c.end_ns, default=None)
        frac, s = saved.get(fid, (0.0, []))
        if last is None:
            new_ends.append(w_end - _saved_by(frac, s, w_end))
            continue
        # The work after the last call follows it (the chain the path walks), less its own saving.
        new_ends.append(w_end - gained[last] - (_saved_by(frac, s, w_end) - _saved_by(frac, s, last.end_ns)))
    return max(w[1] for w in windows.values()) - start, max(new_ends) - start
