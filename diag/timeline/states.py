"""Per rank and step: the four GPU states and the measures each ledger bucket claims from.

docs/ledger.md is the specification; each measure below names the bucket it feeds.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec.structs import replace

from diag.timeline.columns import numpy_of
from diag.timeline.rank import MATMUL_CLASSES, RankTimeline
from diag.timeline.sweep import Segments, sweep, window_index

I64 = npt.NDArray[np.int64]
STATES = ("compute", "comm", "copy", "idle")


class StepStates(msgspec.Struct, frozen=True):
    step: int
    window_ns: int
    compute_ns: int
    comm_ns: int
    copy_ns: int
    idle_ns: int
    matmul_ns: int         # → model_compute, recompute, thin_gemm, gemm_inefficiency
    non_matmul_ns: int     # → non_matmul
    p2p_only_ns: int       # → pipeline_bubble
    wait_ns: int           # → straggler
    dataloader_ns: int     # → dataloader
    host_bound_ns: int     # → host_bound
    recompute_ns: int      # compute while recomputed forward work runs (→ recompute when no peak)
    model_flops: float | None   # None: unknown (no model description and too few op shapes)
    exec_flops: float
    recompute_flops: float
    fwd_flops: float
    # The recomputed FLOPs of GEMM kernels (linear layers), not attention: selective recomputation
    # re-runs attention alone, full recomputation whole layers (MFU004 tells them apart by it).
    recompute_gemm_flops: float = 0.0


class StateRuns(msgspec.Struct, frozen=True):
    """Merged runs of one state, for drawing lanes: (step, start, end, state index into STATES)."""

    step: I64
    start_ns: I64
    end_ns: I64
    state: npt.NDArray[np.int8]


class Waitable(msgspec.Struct, frozen=True):
    """The time a wait for a late rank can fall in: communication only, not point-to-point only
    (those are the bubble), as disjoint runs inside step windows. The waits come from matching
    across ranks (the reduce), so the map step keeps this, not the timeline."""

    step: I64          # index into the rank's steps
    start_ns: I64
    end_ns: I64


def rank_states(tl: RankTimeline) -> tuple[list[StepStates], StateRuns, Waitable]:
    """The step states of one rank with `wait_ns` 0 (filled by `with_waits` once the ranks are
    matched), the state runs for the lanes, and the time the waits are measured on."""
    seg, m, host, win = _sweep_states(tl)
    compute, comm, copy, idle = m["compute"], m["comm"], m["copy"], m["idle"]
    p2p_only, dataloader, a = m["p2p_only"], m["dataloader"], seg.active
    dur = seg.end_ns - seg.start_ns
    wstart, wend = tl.steps.start_ns, tl.steps.end_ns

    def per_window(mask: npt.NDArray[np.bool_] | None, values: I64 | None = None) -> I64:
        v = dur if values is None else values
        keep = (win >= 0) if mask is None else ((win >= 0) & mask)
        return np.bincount(win[keep], weights=v[keep], minlength=len(wstart)).astype(np.int64)

    sums = {
        "compute": per_window(compute), "comm": per_window(comm), "copy": per_window(copy),
        "idle": per_window(idle), "matmul": per_window(compute & (a["matmul"] > 0)),
        "p2p": per_window(p2p_only), "dl": per_window(dataloader),
        "host": per_window(None, host), "recompute": per_window(compute & (a["recompute"] > 0)),
    }
    flops = _step_flops(tl)
    out = []
    for i, step in enumerate(tl.steps.step):
        out.append(StepStates(
            step=step, window_ns=int(wend[i] - wstart[i]), compute_ns=int(sums["compute"][i]),
            comm_ns=int(sums["comm"][i]), copy_ns=int(sums["copy"][i]), idle_ns=int(sums["idle"][i]),
            matmul_ns=int(sums["matmul"][i]), non_matmul_ns=int(sums["compute"][i] - sums["matmul"][i]),
            p2p_only_ns=int(sums["p2p"][i]), wait_ns=0, dataloader_ns=int(sums["dl"][i]),
            host_bound_ns=int(sums["host"][i]), recompute_ns=int(sums["recompute"][i]), model_flops=0.0, exec_flops=flops["exec"][i],
            recompute_flops=flops["recompute"][i], fwd_flops=flops["forward"][i],
            recompute_gemm_flops=flops["recompute_gemm"][i],
        ))
    state_idx = np.select([compute, comm, copy], [0, 1, 2], default=3).astype(np.int8)
    waitable = _runs(seg, win, (comm & ~p2p_only).astype(np.int8))
    keep = waitable.state == 1
    return out, _runs(seg, win, state_idx), Waitable(waitable.step[keep], waitable.start_ns[keep], waitable.end_ns[keep])



def _sweep_states(tl: RankTimeline, waits: tuple[I64, I64] | None = None) -> tuple[
        Segments, dict[str, npt.NDArray[np.bool_]], I64, I64]:
    """The sweep behind both the step sums and the ledger lanes: segments, each segment's state
    masks, its host-bound ns (from its start) and its step window (-1: outside every step).
    `waits` adds the intervals waiting for the last rank as one more kind (`wait`)."""
    kcl = tl.kclass
    is_kernel = tl.kernel
    is_comm = is_kernel & (kcl == "comm")
    is_p2p = is_comm & (np.array(tl.collective, dtype=object) == "sendrecv")
    ts, end = tl.ts_ns, tl.end_ns

    def pick(mask: npt.NDArray[np.bool_]) -> tuple[I64, I64]:
        return ts[mask], end[mask]

    wstart, wend = tl.steps.start_ns, tl.steps.end_ns
    kinds = {
        "compute": pick(is_kernel & ~is_comm),
        "comm": pick(is_comm),
        "copy": pick(~is_kernel),
        "matmul": pick(is_kernel & np.isin(kcl, list(MATMUL_CLASSES))),
        "p2p": pick(is_p2p),
        "coll": pick(is_comm & ~is_p2p),
        "dataloader": tl.dataloader_spans,
        "recompute": pick(is_kernel & ~is_comm & (tl.phase == "recompute")),
    }
    if waits is not None:
        kinds["wait"] = waits
    seg = sweep(kinds, cuts=np.concatenate([wstart, wend]))
    a = seg.active
    compute = a["compute"] > 0
    comm = ~compute & (a["comm"] > 0)
    copy = ~compute & ~comm & (a["copy"] > 0)
    idle = ~compute & ~comm & ~copy
    dataloader = idle & (a["dataloader"] > 0)
    masks = {"compute": compute, "comm": comm, "copy": copy, "idle": idle, "dataloader": dataloader,
             "p2p_only": comm & (a["coll"] == 0) & (a["p2p"] > 0)}
    host = np.where(idle & ~dataloader, _host_bound(seg, tl), 0)
    return seg, masks, host, window_index(seg, wstart, wend)


# The ledger buckets that are time intervals on the GPU (docs/export.md), and `compute` for the
# compute pool, which the ledger splits per step by FLOPs, not by instant.
LANES = ("compute", "exposed_comm", "straggler", "pipeline_bubble", "memcpy", "dataloader", "host_bound", "idle_other")


def ledger_runs(tl: RankTimeline, waits: tuple[I64, I64]) -> StateRuns:
    """Each instant of the rank's steps labelled with its ledger bucket (`state` indexes LANES),
    by the measures the claims take (engine._ledger, rules/): send/recv only → pipeline_bubble,
    other communication inside a wait for the last rank → straggler (with_waits), the rest of
    communication → exposed_comm; idle in the data loader → dataloader, idle before the next
    launch returned → host_bound (from the idle run's start, as _host_bound measures it), the rest
    → idle_other; copies → memcpy."""
    seg, m, host, win = _sweep_states(tl, waits)
    waiting = m["comm"] & ~m["p2p_only"] & (seg.active["wait"] > 0)
    lane = np.select(
        [m["compute"], m["p2p_only"], waiting, m["comm"], m["copy"], m["dataloader"]],
        [LANES.index(b) for b in ("compute", "pipeline_bubble", "straggler", "exposed_comm", "memcpy", "dataloader")],
        default=LANES.index("idle_other"),
    ).astype(np.int8)
    # An idle segment's host-bound part is its first `host` ns: split it in two.
    split = host > 0
    cut = seg.start_ns + host
    start = np.concatenate([seg.start_ns, cut[split]])
    stop = np.concatenate([np.where(split, cut, seg.end_ns), seg.end_ns[split]])
    label = np.concatenate([np.where(split, np.int8(LANES.index("host_bound")), lane), lane[split]])
    where = np.concatenate([win, win[split]])
    order = np.argsort(start, kind="stable")
    keep = stop[order] > start[order]
    o = order[keep]
    return _runs(Segments(start[o], stop[o], {}), where[o], label[o].astype(np.int8))

def with_waits(states: list[StepStates], steps_start_ns: I64, steps_end_ns: I64, waitable: Waitable,
               waits: tuple[I64, I64]) -> list[StepStates]:
    """Each step's `wait_ns`: waiting for the last rank (`waits`, from the matched collectives)
    while the GPU does nothing but collectives, the measure the straggler bucket claims."""
    if not len(waits[0]) or not len(waitable.start_ns):
        return states
    seg = sweep({"wait": waits, "able": (waitable.start_ns, waitable.end_ns)},
                cuts=np.concatenate([steps_start_ns, steps_end_ns]))
    win = window_index(seg, steps_start_ns, steps_end_ns)
    both = (win >= 0) & (seg.active["wait"] > 0) & (seg.active["able"] > 0)
    per_step = np.bincount(win[both], weights=(seg.end_ns - seg.start_ns)[both], minlength=len(states))
    return [replace(st, wait_ns=int(per_step[i])) for i, st in enumerate(states)]


def _host_bound(seg: Segments, tl: RankTimeline) -> I64:
    """Idle time before the launch call of the next GPU activity returned (per segment)."""
    if len(tl) == 0:
        return np.zeros(len(seg), np.int64)
    launch_end = numpy_of(tl.acts.column("launch_end").fill_null(-1), np.int64)
    nxt = np.searchsorted(tl.ts_ns, seg.end_ns, side="left")
    has_next = nxt < len(tl)
    le = np.where(has_next, launch_end[np.clip(nxt, 0, len(tl) - 1)], -1)
    portion = np.clip(np.minimum(seg.end_ns, le) - seg.start_ns, 0, None)
    return np.where(has_next & (le >= 0), portion, 0).astype(np.int64)


def _step_flops(tl: RankTimeline) -> dict[str, list[float]]:
    launched = (tl.step_of >= 0) & (tl.flops > 0)

    def per_step(mask: npt.NDArray[np.bool_]) -> list[float]:
        # bincount adds in activity order, as a loop over them would: the same sums to the bit.
        return np.bincount(tl.step_of[mask], weights=tl.flops[mask], minlength=len(tl.steps.step)).tolist()

    recompute = launched & (tl.phase == "recompute")
    return {"exec": per_step(launched), "recompute": per_step(recompute),
            "recompute_gemm": per_step(recompute & (tl.kclass == "gemm")),
            "forward": per_step(launched & (tl.phase == "forward"))}


def _runs(seg: Segments, win: I64, state: npt.NDArray[np.int8]) -> StateRuns:
    keep = win >= 0
    s, e, w, st = seg.start_ns[keep], seg.end_ns[keep], win[keep], state[keep]
    if len(s) == 0:
        return StateRuns(w, s, e, st)
    new_run = np.ones(len(s), bool)
    new_run[1:] = (st[1:] != st[:-1]) | (w[1:] != w[:-1]) | (s[1:] != e[:-1])
    starts = np.nonzero(new_run)[0]
    ends = np.append(starts[1:], len(s)) - 1
    return StateRuns(w[starts], s[starts], e[ends], st[starts])


def exposed_comm_ns(tl: RankTimeline) -> dict[int, int]:
    """For each communication kernel (by activity index): its time with no compute kernel beside it."""
    kernel = tl.kernel
    comm = kernel & (tl.kclass == "comm")
    if not comm.any():
        return {}
    cs, ce = union(tl.ts_ns[kernel & ~comm], tl.end_ns[kernel & ~comm])
    idx = np.nonzero(comm)[0]
    s, e = tl.ts_ns[idx], tl.end_ns[idx]
    return {int(i): int(v) for i, v in zip(idx, (e - s) - covered_ns(s, e, cs, ce), strict=True)}


def covered_ns(s: I64, e: I64, us: I64, ue: I64) -> I64:
    """How much of each [s, e) the sorted disjoint intervals [us, ue) cover."""
    return covered(us, ue, e) - covered(us, ue, s)


def union(s: I64, e: I64) -> tuple[I64, I64]:
    """Merge intervals into a sorted disjoint union."""
    if len(s) == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    starts = np.nonzero(new)[0]
    ends = np.append(starts[1:], len(s)) - 1
    return s[starts], reach[ends]


class IdleGaps(msgspec.Struct, frozen=True):
    """Each stretch of a step window with nothing running on the GPU, split as the ledger splits
    idle time: the part before the next activity's launch call returned (host_bound, less the data
    loader) and the rest (idle_other, less the data loader). MFU010 and MFU013 tell these apart by
    cause; their shares of gap time divide the ledger's buckets."""

    step: I64             # index into the rank's steps
    start_ns: I64
    end_ns: I64
    host_ns: I64          # host-bound part (launch not yet returned), data loader excluded
    other_ns: I64         # the rest, data loader excluded
    at_window_end: npt.NDArray[np.bool_]   # the gap runs to the end of its step window
    before_ns: I64        # duration of the activity that ended where the gap starts (-1: none)
    # Where the host-bound part ends (its start is start_ns; the data loader's spans inside it are
    # not host-bound), and the activity after the gap (-1: none): its launch call's thread is the
    # thread MFU010 reads the host's time from.
    host_end_ns: I64 = msgspec.field(default_factory=lambda: np.zeros(0, np.int64))
    next_act: I64 = msgspec.field(default_factory=lambda: np.zeros(0, np.int64))


def idle_gaps(tl: RankTimeline) -> IdleGaps:
    wstart, wend = tl.steps.start_ns, tl.steps.end_ns
    bs, be = union(tl.ts_ns, tl.end_ns)
    starts, ends, steps = [], [], []
    for i in range(len(wstart)):
        # The complement of the busy union inside window i.
        lo, hi = int(wstart[i]), int(wend[i])
        j0 = int(np.searchsorted(be, lo, side="right"))
        j1 = int(np.searchsorted(bs, hi, side="left"))
        edges_s = np.concatenate([[lo], np.clip(be[j0:j1], lo, hi)])
        edges_e = np.concatenate([np.clip(bs[j0:j1], lo, hi), [hi]])
        keep = edges_e > edges_s
        starts.append(edges_s[keep])
        ends.append(edges_e[keep])
        steps.append(np.full(int(keep.sum()), i, np.int64))
    a = np.concatenate(starts).astype(np.int64) if starts else np.zeros(0, np.int64)
    b = np.concatenate(ends).astype(np.int64) if ends else np.zeros(0, np.int64)
    step = np.concatenate(steps) if steps else np.zeros(0, np.int64)
    launch_end = numpy_of(tl.acts.column("launch_end").fill_null(-1), np.int64)
    nxt = np.searchsorted(tl.ts_ns, b, side="left")
    has = nxt < len(tl)
    le = np.where(has, launch_end[np.clip(nxt, 0, max(len(tl) - 1, 0))] if len(tl) else -1, -1)
    host_end = np.where(le >= 0, np.clip(np.minimum(b, le), a, b), a)
    ds, de = union(*tl.dataloader_spans)
    host = (host_end - a) - covered_ns(a, host_end, ds, de)
    other = (b - host_end) - covered_ns(host_end, b, ds, de)
    by_end = np.argsort(tl.end_ns, kind="stable")
    last = np.searchsorted(tl.end_ns[by_end], a, side="right") - 1
    prev = by_end[np.clip(last, 0, None)] if len(tl) else last
    before = np.where(last >= 0, (tl.end_ns - tl.ts_ns)[prev] if len(tl) else -1, -1)
    return IdleGaps(step, a, b, host.astype(np.int64), other.astype(np.int64), b == wend[step],
                    before.astype(np.int64), host_end.astype(np.int64), np.where(has, nxt, -1).astype(np.int64))


def covered(cs: I64, ce: I64, t: I64) -> I64:
    """Length of the disjoint sorted intervals (cs, ce) before each time t."""
    if len(cs) == 0:
        return np.zeros(len(t), np.int64)
    before = np.concatenate([[0], np.cumsum(ce - cs)])
    j = np.searchsorted(cs, t, side="right")
    k = np.clip(j - 1, 0, None)
    partial = np.where(j > 0, np.clip(np.minimum(t, ce[k]) - cs[k], 0, None), 0)
    return np.where(j > 0, before[k] + partial, 0).astype(np.int64)
