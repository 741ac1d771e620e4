"""Pipeline schedules beyond 1F1B, read from the schedule's own actions, and each one's ideal bubble.

Where a rank's trace names its actions (torch.distributed.pipelining's `PP:` record_functions,
pipeline_actions.py), they give the schedule outright: which stages each rank holds, whether the
backward is split into an input-gradient pass I and a weight-gradient pass W, and the F, I, W times.

- Placement. One stage per rank: GPipe, 1F1B, ZB-H1/H2. v stages per rank in a loop (rank r holds
  r, r+p, …): interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters", §2.2.2) or interleaved zero-bubble (ScheduleInterleavedZeroBubble).
  Two per rank in a V (rank r holds r and 2p−1−r): ZB-V (Qi et al. 2023, "Zero Bubble Pipeline
  Parallelism", arXiv 2401.10241, §6; ScheduleZBVZeroBubble) or DualPipeV (DeepSeek's DualPipe
  repository; ScheduleDualPipeV), which runs a forward and a backward overlapped (`OVERLAP_F_B`).
- Zero-bubble, one stage per rank: ZB-H1 keeps 1F1B's warm-up (at most p forwards before the first
  backward on stage 0) and moves W passes into the cool-down; ZB-H2 warms up with more forwards
  (up to 2p−1) to fill the rest (Qi et al. §3, Figure 3).

Ideal bubbles per step, with F, B, W the forward, full-backward and weight-gradient times of one
chunk (one stage on one microbatch), B = I + W (the DualPipe README and DeepSeek-V3 §3.2.1 Table 2
use B for the full backward; Qi et al. write B for I, so their 1F1B (p−1)(F+B+W) is this (p−1)(F+B)):
- GPipe, 1F1B: (p−1)(F+B), which over the step is (p−1)/(m+p−1); interleaved: ÷ v (Narayanan et al.).
- ZB-H1: (p−1)(F+B−2W) = (p−1)(F+I−W) (Qi et al. §3.1; DeepSeek-V3 Table 2, "ZB1P"); interleaved
  zero-bubble: the same over one chunk's times (W of each chunk fills the cool-down the same way).
- ZB-H2, ZB-V: ≈ 0, when F ≈ I ≈ W (Qi et al. §3.2, §6); what is measured above it is imbalance.
- DualPipe: (PP/2−1)(F&B+B−3W) for PP stages, F&B a forward and a backward chunk run overlapped
  (DeepSeek-V3 Table 2); DualPipeV folds the PP stages onto PP/2 ranks, so p ranks give (p−1)(…).
The fraction of the step is that time over itself plus the rank's work, m·v·(F+B).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable

import msgspec

from diag.timeline.pipeline_actions import (
    FORWARD,
    FULL_BACKWARD,
    INPUT_GRAD,
    OVERLAPPED,
    WEIGHT_GRAD,
    PipeAction,
)

GPIPE, ONE_F_ONE_B, INTERLEAVED, UNKNOWN = "gpipe", "1f1b", "interleaved", "unknown"
ZB_H1, ZB_H2, ZB_V, INTERLEAVED_ZB = "zb-h1", "zb-h2", "zb-v", "interleaved-zb"
DUALPIPE, DUALPIPE_V = "dualpipe", "dualpipe-v"
NAMES = {GPIPE: "GPipe", ONE_F_ONE_B: "1F1B", INTERLEAVED: "interleaved 1F1B", UNKNOWN: "schedule unknown",
         ZB_H1: "zero-bubble ZB-H1", ZB_H2: "zero-bubble ZB-H2", ZB_V: "zero-bubble ZB-V",
         INTERLEAVED_ZB: "interleaved zero-bubble", DUALPIPE: "DualPipe", DUALPIPE_V: "DualPipeV"}
# The schedules whose ideal bubble is a time from the chunk times, not a count of microbatches.
TIMED = frozenset({ZB_H1, ZB_H2, ZB_V, INTERLEAVED_ZB, DUALPIPE, DUALPIPE_V})
FORMULAS = {ZB_H1: "(p-1)(F+B-2W)", INTERLEAVED_ZB: "(p-1)(F+B-2W)", ZB_H2: "0 (when F = I = W)",
            ZB_V: "0 (when F = I = W)", DUALPIPE_V: "(p-1)(F&B+B-3W)", DUALPIPE: "(p/2-1)(F&B+B-3W)"}


class ChunkTimes(msgspec.Struct, frozen=True):
    """Median GPU time of one chunk's passes, seconds; B = I + W where the backward is split."""

    F: float
    B: float
    I: float | None = None    # noqa: E741 (the papers' letter)
    W: float | None = None
    FB: float | None = None   # a forward and a backward chunk overlapped (DualPipe's F&B)

    def as_dict(self) -> dict[str, float]:
        names = {"F": self.F, "B": self.B, "I": self.I, "W": self.W, "F&B": self.FB}
        return {k: v for k, v in names.items() if v is not None}


def ideal_bubble_s(schedule: str, p: int, t: ChunkTimes) -> float | None:
    """The schedule's ideal bubble per step, seconds (the module's formulas); None when its inputs
    were not measured."""
    w = t.W or 0.0
    if schedule in (ZB_H1, INTERLEAVED_ZB):
        return max(0.0, (p - 1) * (t.F + t.B - 2 * w))
    if schedule in (ZB_H2, ZB_V):
        return 0.0
    if schedule == DUALPIPE_V and t.FB is not None:
        return max(0.0, (p - 1) * (t.FB + t.B - 3 * w))
    return None


class ActionSchedule(msgspec.Struct, frozen=True):
    stages: int                # p: ranks per pipeline
    microbatches: int | None
    schedule: str
    virtual_stages: int        # v: stages per rank
    replicas: int
    times: ChunkTimes | None
    how: str


def schedule_from_actions(by_rank: dict[int, list[PipeAction]], ranks_hint: int | None = None) -> ActionSchedule | None:
    """The schedule the ranks' `PP:` actions show; None when no rank names one. `ranks_hint`: the
    pipeline's ranks as the send/recv pattern gives them, for a capture that missed the last stages."""
    held = {r: sorted({s for a in acts for s in a.stages}) for r, acts in by_rank.items() if acts}
    if not held:
        return None
    v = _mode(len(s) for s in held.values()) or 1
    n_stages = max(max(s[-1] for s in held.values()) + 1, (ranks_hint or 0) * v)
    p = n_stages // v
    replicas = sum(1 for s in held.values() if 0 in s)
    placement = ("loop" if all(s == list(range(s[0], n_stages, p)) for s in held.values())
                 else "v" if v == 2 and all(s[0] + s[1] == 2 * p - 1 for s in held.values()) else "other")
    if n_stages % v or (v > 1 and placement == "other"):
        return ActionSchedule(p, None, UNKNOWN, v, replicas, None,
                              f"PP: actions on {len(held)} rank(s) hold stages in no known placement")
    kinds = {a.kind for acts in by_rank.values() for a in acts}
    m = _microbatches(by_rank)
    first = next((by_rank[r] for r, s in sorted(held.items()) if 0 in s), [])
    last = next((by_rank[r] for r, s in sorted(held.items()) if n_stages - 1 in s), [])
    if OVERLAPPED in kinds:
        schedule = DUALPIPE_V
    elif kinds & {INPUT_GRAD, WEIGHT_GRAD}:
        schedule = (ZB_V if placement == "v" else INTERLEAVED_ZB if v > 1
                    else ZB_H2 if _forwards_before(first, INPUT_GRAD) > p else ZB_H1)
    elif v > 1:
        schedule = INTERLEAVED if placement == "loop" else UNKNOWN
    else:
        ahead = _forwards_before(last, FULL_BACKWARD)
        schedule = (GPIPE if m == 1 or (m and m > 2 and ahead >= m) else ONE_F_ONE_B if m and ahead <= 2
                    else UNKNOWN)
    how = (f"torch.distributed.pipelining's PP: actions on {len(held)} rank(s): {n_stages} stages, "
           f"{v} per rank" + (f" ({'loop' if placement == 'loop' else 'V'}-placed)" if v > 1 else ""))
    return ActionSchedule(p, m, schedule, v, replicas, _times(by_rank), how)


def _microbatches(by_rank: dict[int, list[PipeAction]]) -> int | None:
    """Distinct forward microbatches per stage per step, the most common count."""
    seen: dict[tuple[int, int | None, int], set[int]] = defaultdict(set)
    for r, acts in by_rank.items():
        for a in acts:
            if a.kind in (FORWARD, OVERLAPPED) and a.step is not None:
                seen[(r, a.step, a.stages[0])].add(a.microbatch)
    return _mode(len(mbs) for mbs in seen.values())


def _forwards_before(acts: list[PipeAction], kind: str) -> int:
    """Forwards a rank ran in its first step before its first action of `kind`."""
    steps = [a.step for a in acts if a.step is not None]
    if not steps:
        return 0
    own = [a for a in acts if a.step == min(steps)]
    stop = next((i for i, a in enumerate(own) if a.kind == kind), len(own))
    return sum(1 for a in own[:stop] if a.kind == FORWARD)


def _times(by_rank: dict[int, list[PipeAction]]) -> ChunkTimes | None:
    ns: dict[str, list[int]] = defaultdict(list)
    for acts in by_rank.values():
        for a in acts:
            if a.step is not None:
                ns[a.kind].append(a.gpu_ns)
    med = {k: statistics.median(v) * 1e-9 for k, v in ns.items() if v}
    if FORWARD not in med:
        return None
    i, w = med.get(INPUT_GRAD), med.get(WEIGHT_GRAD)
    b = med.get(FULL_BACKWARD, (i or 0.0) + (w or 0.0) if i is not None or w is not None else None)
    if b is None:
        return None
    return ChunkTimes(med[FORWARD], b, i, w, med.get(OVERLAPPED))


def _mode(values: Iterable[int]) -> int | None:
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v)) if counts else None
