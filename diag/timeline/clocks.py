"""Clock alignment: each rank's offset onto the reference rank's clock, from work that ends together.

- Every member of a collective instance finishes within microseconds of the others (DESIGN.md), and
  both sides of a send/recv pair finish when its last byte lands: each shared instance gives one
  estimate of `end_a - end_b` for each pair of its ranks.
- A send pairs with its recv by channel and order (the k-th send a→b in a capture window with the
  k-th recv on b from a, collectives.match), and only when both sides name the same byte count. A
  send/recv without a direction and peer (a coalesced batch_isend_irecv, a kernel without its
  record_param_comms) is not used: its order among a rank's calls says nothing about which
  transfer it carries, and pairing it by that order is what put pipeline-only clocks off by ms.
- Each pair of ranks keeps the median of its estimates and their spread (median absolute
  deviation). The offsets follow a spanning tree from the lowest rank, most trustworthy pairs
  first: the smallest spread over the root of the count, at least `_FLOOR_NS`.
- The check: every estimate, tree or not, against the offsets the tree implies. Its residual is
  what the solution cannot explain (a wrong pairing, a clock that drifts over the capture); each
  rank reports the median and the largest over the estimates that involve it. A send that ends
  before its receive is no inconsistency (NCCL stages a message that fits its buffer at the peer
  and ends the send, NVIDIA/nccl#544); one that ends after it is. The median of a pair stays
  right while most of its receivers were already waiting, as a pipeline's are (they are posted
  ahead); were most sends to end early, the offset would lean toward the sender.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable

import msgspec

from diag.timeline.collectives import Call, Matched

# Above this median residual a rank's offset does not explain its own estimates: collective ends agree
# to microseconds, so tens of them mean a wrong pairing or a clock drifting during the capture.
INCONSISTENT_NS = 50_000
# One microsecond: Kineto's timestamps are µs with three decimals, and collective ends agree across
# ranks to about that; a spread below it says nothing more about a pair than its count does.
_FLOOR_NS = 1_000


class ClockOffset(msgspec.Struct, frozen=True):
    rank: int
    offset_ns: int
    n_matches: int             # estimates on the pair that linked this rank into the tree
    spread_ns: int             # their median absolute deviation
    linked: bool = True        # False: no collective or send/recv connects this rank to the reference
    residual_ns: int = 0       # median |estimate − solution| over every estimate involving this rank
    residual_max_ns: int = 0   # the largest of them
    n_estimates: int = 0       # how many estimates involve this rank


class _Pair(msgspec.Struct, frozen=True):
    estimates_ns: list[int]    # end_a − end_b, one per shared instance
    senders: list[int | None]  # per estimate: the sending rank of a send/recv pair, None for a collective
    median_ns: int
    spread_ns: int

    @property
    def uncertainty(self) -> float:
        return max(self.spread_ns, _FLOOR_NS) / math.sqrt(len(self.estimates_ns))


def clock_offsets(matched: list[Matched], ranks: Iterable[int]) -> dict[int, ClockOffset]:
    pairs = _pairs(matched)
    all_ranks = sorted(set(ranks))
    neighbours: dict[int, list[int]] = defaultdict(list)
    for a, b in pairs:
        neighbours[a].append(b)
        neighbours[b].append(a)
    offset: dict[int, int] = {}
    via: dict[int, tuple[int, int]] = {}      # rank → the pair that linked it
    roots: set[int] = set()
    for root in all_ranks:
        if root in offset:
            continue
        roots.add(root)
        offset[root] = 0
        frontier: list[tuple[float, int, int]] = []
        _push(frontier, root, neighbours, pairs, offset)
        while frontier:
            _, a, b = heapq.heappop(frontier)
            if b in offset:
                continue
            offset[b] = offset[a] + _between(pairs, a, b)
            via[b] = (a, b)
            _push(frontier, b, neighbours, pairs, offset)
    residuals: dict[int, list[int]] = defaultdict(list)
    for (a, b), pair in pairs.items():
        implied = offset[b] - offset[a]
        for d, sender in zip(pair.estimates_ns, pair.senders, strict=True):
            r = _residual(d - implied, a, sender)
            residuals[a].append(r)
            residuals[b].append(r)
    out = {}
    for r in all_ranks:
        p = pairs[min(via[r]), max(via[r])] if r in via else None
        res = residuals.get(r, [])
        out[r] = ClockOffset(
            r, offset[r], len(p.estimates_ns) if p else 0, p.spread_ns if p else 0,
            linked=r not in roots or r == all_ranks[0],
            residual_ns=int(statistics.median(res)) if res else 0, residual_max_ns=max(res, default=0),
            n_estimates=len(res),
        )
    return out


def _residual(excess_ns: int, a: int, sender: int | None) -> int:
    """What the solution leaves unexplained of one estimate (excess = estimate − solution).

    A collective's members end together: any excess counts. A send may end before its receive
    (an eager send, NVIDIA/nccl#544) but not after it: for a send from a (the lower rank),
    end_a − end_b may fall below the solution, not above it; from b, the reverse."""
    if sender is None:
        return abs(excess_ns)
    return max(excess_ns, 0) if sender == a else max(-excess_ns, 0)


def _between(pairs: dict[tuple[int, int], _Pair], a: int, b: int) -> int:
    """offset_b − offset_a: what b's clock must add to read a's (end_a − end_b for a pair a < b)."""
    return pairs[(a, b)].median_ns if a < b else -pairs[(b, a)].median_ns


def _push(frontier: list[tuple[float, int, int]], a: int, neighbours: dict[int, list[int]],
          pairs: dict[tuple[int, int], _Pair], placed: dict[int, int]) -> None:
    for b in neighbours[a]:
        if b not in placed:
            heapq.heappush(frontier, (pairs[(min(a, b), max(a, b))].uncertainty, a, b))


def _pairs(matched: list[Matched]) -> dict[tuple[int, int], _Pair]:
    """(a, b) with a < b → the estimates of end_a − end_b from the instances both took part in."""
    by_instance: dict[str, list[Call]] = defaultdict(list)
    for m in matched:
        if m.n_matched >= 2 and _trusted(m.call):
            by_instance[m.instance].append(m.call)
    estimates: dict[tuple[int, int], list[int]] = defaultdict(list)
    senders: dict[tuple[int, int], list[int | None]] = defaultdict(list)
    for members in by_instance.values():
        if len(members) < 2 or not _same_transfer(members):
            continue
        ends = {c.rank: c.end_ns for c in members}
        sender = next((c.rank for c in members if c.direction == "send"), None)
        ref = min(ends)
        for r, e in ends.items():
            if r != ref:
                estimates[(ref, r)].append(ends[ref] - e)
                senders[(ref, r)].append(sender)
    out = {}
    for k, d in estimates.items():
        med = int(statistics.median(d))
        out[k] = _Pair(d, senders[k], med, int(statistics.median([abs(x - med) for x in d])))
    return out


def _trusted(c: Call) -> bool:
    """Whether the call's instance says which work it shares with the other ranks."""
    if "sendrecv" in c.collective:
        return c.direction is not None and c.peer is not None
    return True


def _same_transfer(members: list[Call]) -> bool:
    """A send/recv pair carries one message: both sides must name the same size where they name one."""
    if len(members) != 2 or members[0].direction is None:
        return True
    a, b = members[0].msg_bytes, members[1].msg_bytes
    return a is None or b is None or a == b


def clock_notes(offsets: dict[int, ClockOffset], matched: Iterable[Matched] = ()) -> list[str]:
    """Notes for the ranks left on their own clock and those whose offset their estimates disagree with.

    A rank left alone may still share matched instances with the others (a straggler's waits are read
    from them): send/recv without a named peer, as an all-to-all or a coalesced batch runs, which the
    alignment does not trust (_trusted). The note then says so, instead of "no collective", which the
    stragglers finding, naming the same instances, would contradict."""
    notes = []
    alone = sorted(o.rank for o in offsets.values() if not o.linked)
    if alone:
        shown = ", ".join(map(str, alone[:8])) + (" …" if len(alone) > 8 else "")
        shared = _shared_instances(matched, set(alone))
        if shared:
            notes.append(f"clock of rank(s) {shown} not aligned to rank {min(offsets)}: the {shared} collective "
                         "instance(s) they share with other ranks are send/recv that name no peer (all-to-all, "
                         "batched send/recv) or differ in size on their two sides, whose ends need not coincide; "
                         "their times stay on their own clocks, "
                         "while who arrived last is still read from each instance's kernel durations")
        else:
            notes.append(f"clock of rank(s) {shown} not aligned: no collective, and no send/recv naming its peer, "
                         f"links them to rank {min(offsets)}; their times stay on their own clocks")
    bad = sorted((o for o in offsets.values() if o.residual_ns > INCONSISTENT_NS), key=lambda o: -o.residual_ns)
    if bad:
        worst = bad[0]
        notes.append(f"clock alignment inconsistent on {len(bad)} rank(s): rank {worst.rank}'s {worst.n_estimates} "
                     f"estimates differ from its offset by {worst.residual_ns / 1e3:.0f} µs (median; up to "
                     f"{worst.residual_max_ns / 1e3:.0f} µs), so cross-rank times may be off by that much")
    return notes


def _shared_instances(matched: Iterable[Matched], ranks: set[int]) -> int:
    """How many instances matched on two or more ranks, one of them in `ranks`."""
    return len({m.instance for m in matched if m.n_matched >= 2 and m.call.rank in ranks})
