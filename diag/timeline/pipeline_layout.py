"""The pipeline layout, read from the send/recv pattern: stages, microbatches per step, schedule.

- Stages p: the ranks joined by point-to-point transfers form one chain per pipeline replica
  (stage s sends activations to s+1 and gradients back); p is the chain's length. When a chain's
  ends were not traced, p is the size of the process group the transfers ran in (Megatron and
  torchtitan send within the pipeline group), if all transfers name the same one.
- Microbatches m: each microbatch crosses every stage boundary once forward and once backward, so
  every directed channel carries m transfers per step; m is the most common count.
- Schedule: the first stage is the chain end whose first transfer of a step is a send. GPipe runs
  all m forwards before any backward, so the last stage receives m activations before it sends its
  first gradient; 1F1B alternates there (one, or two where a combined send_backward_recv_forward
  is launched receive first, as Megatron's _p2p_ops does).
- Interleaved (v model chunks per rank): the last rank sends activations on to the first, so the
  chain closes into a ring; the wrap-around channel carries (v−1)·m transfers per step and the
  others v·m, which gives m and v.
- Bidirectional (DeepSeek's DualPipe): microbatches enter from both ends, so both chain ends' first
  transfer of a step is a send.
- Ideal bubble (DESIGN.md): (p−1)/(m+p−1) of the step; interleaved ÷ v.
- Where the ranks name their schedule's actions (torch.distributed.pipelining's `PP:` annotations),
  the schedule, its placement and the F, I, W times come from them (pipeline_schedules.py), and
  zero-bubble and DualPipe schedules get their own ideal bubble.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable

import msgspec

from diag.timeline.collectives import Call
from diag.timeline.pipeline_actions import PipeAction
from diag.timeline.pipeline_schedules import (
    DUALPIPE,
    GPIPE,
    INTERLEAVED,
    ONE_F_ONE_B,
    TIMED,
    UNKNOWN,
    ChunkTimes,
    ideal_bubble_s,
    schedule_from_actions,
)

__all__ = ["GPIPE", "INTERLEAVED", "ONE_F_ONE_B", "UNKNOWN", "PipelineLayout", "detect_layout"]
# 1F1B's last stage holds at most this many activations before sending a gradient back: one, or two
# when the combined op posts its receive before its send.
_ONE_F_ONE_B_IN_FLIGHT = 2


class PipelineLayout(msgspec.Struct, frozen=True):
    stages: int | None
    microbatches: int | None
    schedule: str                  # pipeline_schedules.NAMES: gpipe | 1f1b | interleaved | zb-h1 | ... | unknown
    virtual_stages: int            # v: model chunks per rank (1 unless interleaved or V-placed)
    replicas: int                  # pipelines seen (data/tensor-parallel copies of the chain)
    how: str                       # one line: what the figures were read from
    times: ChunkTimes | None = None   # measured chunk times, where the trace names the actions
    bubble_s: float | None = None     # the schedule's ideal bubble per step, seconds (TIMED schedules)

    @property
    def theoretical_bubble(self) -> float | None:
        """(p−1)/(m+p−1) of the step, ÷ v when interleaved (DESIGN.md); for zero-bubble and DualPipe
        schedules their ideal time over itself plus the rank's work m·v·(F+B) (pipeline_schedules.py)."""
        return self.bubble_with(self.microbatches) if self.microbatches else None

    def bubble_with(self, microbatches: int) -> float | None:
        p = self.stages
        if self.schedule in TIMED:
            if self.bubble_s is None or self.times is None:
                return None
            work = microbatches * self.virtual_stages * (self.times.F + self.times.B)
            return self.bubble_s / (self.bubble_s + work) if self.bubble_s + work > 0 else None
        return None if not p else (p - 1) / (microbatches + p - 1) / self.virtual_stages


def detect_layout(calls: Iterable[Call], actions: dict[int, list[PipeAction]] | None = None) -> PipelineLayout | None:
    """None when the run has no point-to-point transfer with a known direction and peer, nor a
    rank that names its schedule's actions (`actions`: rank → its `PP:` actions). The actions,
    where any rank has them, name the schedule; the send/recv pattern gives p where they cannot
    (the last stages not traced)."""
    from_p2p = _from_p2p(calls)
    named = schedule_from_actions(actions or {}, from_p2p.stages if from_p2p else None)
    if named is None:
        return from_p2p
    bubble = ideal_bubble_s(named.schedule, named.stages, named.times) if named.times else None
    return PipelineLayout(named.stages, named.microbatches, named.schedule, named.virtual_stages,
                          named.replicas, named.how, named.times, bubble)


def _from_p2p(calls: Iterable[Call]) -> PipelineLayout | None:
    p2p = sorted((c for c in calls if "sendrecv" in c.collective and c.direction and c.peer is not None),
                 key=lambda c: (c.rank, c.window, c.ts_ns))
    if not p2p:
        return None
    traced = {c.rank for c in p2p}
    # Transfers per directed channel per step, each counted on the side that was traced (the larger
    # count where both were).
    seen: dict[str, Counter[tuple[int, int, int, int]]] = {"send": Counter(), "recv": Counter()}
    neighbours: dict[int, set[int]] = defaultdict(set)
    for c in p2p:
        assert c.peer is not None and c.direction is not None
        src, dst = (c.rank, c.peer) if c.direction == "send" else (c.peer, c.rank)
        neighbours[src].add(dst)
        neighbours[dst].add(src)
        if c.step is not None:
            seen[c.direction][(src, dst, c.window, c.step)] += 1
    per_step = {k: max(seen["send"][k], seen["recv"][k]) for k in seen["send"].keys() | seen["recv"].keys()}
    components = _components(neighbours)
    shapes = {_shape(comp, neighbours) for comp in components}
    complete = all(comp <= traced for comp in components)
    if shapes == {"chain"} and complete:
        return _chain(p2p, components, neighbours, per_step)
    if shapes == {"ring"} and complete:
        return _ring(components, neighbours, per_step)
    sizes = {c.group_size for c in p2p}
    stages = sizes.pop() if len(sizes) == 1 and None not in sizes else None
    m = _mode(per_step.values())
    return PipelineLayout(stages, m, UNKNOWN, 1, len(components),
                          "stages from the send/recv process group's size (not every stage traced)"
                          if stages else "send/recv pattern not recognized as a pipeline")


def _chain(p2p: list[Call], components: list[set[int]], neighbours: dict[int, set[int]],
           per_step: dict[tuple[int, int, int, int], int]) -> PipelineLayout:
    lengths = {len(comp) for comp in components}
    p = max(lengths)
    m = _mode(per_step.values())
    by_rank: dict[int, list[Call]] = defaultdict(list)
    for c in p2p:
        if c.step is not None:   # transfers outside a step may be the tail of one not captured
            by_rank[c.rank].append(c)
    held = []
    for comp in components:
        _, last = _oriented(comp, neighbours, by_rank)
        if last is not None:
            held += _held_before_first_gradient(by_rank[last])
    if all(_bidirectional(comp, neighbours, by_rank) for comp in components):
        return PipelineLayout(p, m, DUALPIPE, 1, len(components),
                              f"{len(components)} chain(s) of send/recv peers whose ends both send first "
                              "(microbatches enter from both ends); microbatches: transfers per channel")
    schedule = UNKNOWN
    if held and m and m > _ONE_F_ONE_B_IN_FLIGHT:
        f = statistics.median(held)
        schedule = GPIPE if f >= m else ONE_F_ONE_B if f <= _ONE_F_ONE_B_IN_FLIGHT else UNKNOWN
    elif held and m == 1:
        schedule = GPIPE   # one microbatch: every schedule runs as GPipe
    how = f"{len(components)} chain(s) of send/recv peers" + ("" if len(lengths) == 1 else " of unequal length")
    return PipelineLayout(p, m, schedule, 1, len(components), how)


def _ring(components: list[set[int]], neighbours: dict[int, set[int]],
          per_step: dict[tuple[int, int, int, int], int]) -> PipelineLayout:
    """Interleaved: every channel carries v·m per step except the wrap-around, (v−1)·m."""
    p = max(len(comp) for comp in components)
    by_channel: dict[tuple[int, int], list[int]] = defaultdict(list)
    for (src, dst, _, _), n in per_step.items():
        by_channel[(src, dst)].append(n)
    counts = sorted({_mode(v) or 0 for v in by_channel.values()})
    if len(counts) == 2 and counts[0] > 0 and counts[1] > counts[0]:
        m = counts[1] - counts[0]
        if counts[1] % m == 0:
            return PipelineLayout(p, m, INTERLEAVED, counts[1] // m, len(components),
                                  f"{len(components)} ring(s) of send/recv peers (the last stage sends on to the first)")
    return PipelineLayout(p, None, UNKNOWN, 1, len(components), "ring of send/recv peers with uneven traffic")


def _oriented(comp: set[int], neighbours: dict[int, set[int]],
              by_rank: dict[int, list[Call]]) -> tuple[int | None, int | None]:
    """(first, last) stage of a chain: the first stage's first transfer is a send, the last's a receive."""
    ends = [r for r in comp if len(neighbours[r]) == 1]
    starts = [r for r in ends if by_rank[r] and by_rank[r][0].direction == "send"]
    if len(ends) == 2 and len(starts) == 1:
        first = starts[0]
        return first, next(r for r in ends if r != first)
    return None, None


def _bidirectional(comp: set[int], neighbours: dict[int, set[int]], by_rank: dict[int, list[Call]]) -> bool:
    """Both ends of the chain send first: DualPipe feeds microbatches in from both ends."""
    ends = [r for r in comp if len(neighbours[r]) == 1]
    return len(comp) > 2 and len(ends) == 2 and all(by_rank[r] and by_rank[r][0].direction == "send" for r in ends)


def _held_before_first_gradient(calls: list[Call]) -> list[int]:
    """Per step on the last stage: activations received before it sent its first gradient back."""
    out = []
    by_step: dict[tuple[int, int | None], list[Call]] = defaultdict(list)
    for c in calls:
        by_step[(c.window, c.step)].append(c)
    for cs in by_step.values():
        first_send = next((i for i, c in enumerate(cs) if c.direction == "send"), None)
        if first_send is not None:
            out.append(first_send)
    return out


def _components(neighbours: dict[int, set[int]]) -> list[set[int]]:
    seen: set[int] = set()
    out = []
    for start in sorted(neighbours):
        if start in seen:
            continue
        comp, todo = set(), [start]
        while todo:
            r = todo.pop()
            if r not in comp:
                comp.add(r)
                todo.extend(neighbours[r] - comp)
        seen |= comp
        out.append(comp)
    return out


def _shape(comp: set[int], neighbours: dict[int, set[int]]) -> str:
    degrees = Counter(len(neighbours[r]) for r in comp)
    if len(comp) >= 2 and degrees[1] == 2 and degrees[1] + degrees[2] == len(comp):
        return "chain"
    if len(comp) >= 3 and degrees[2] == len(comp):
        return "ring"
    return "other"


def _mode(values: Iterable[int]) -> int | None:
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v)) if counts else None
