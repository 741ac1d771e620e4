"""Collectives across ranks (the reduce step): one row per call per rank, matched into instances,
with each rank's wait for the last arrival, and the clock offset of every rank.

- A call's process group, Seq, sizes and peer come from its kernel's own args (newer Kineto copies
  some) merged with the `record_param_comms` CPU op that launched it (around the launch on its
  thread, else the kernel's External id): whichever carries a field gives it, and the CPU op wins
  for Seq and the peer, which Kineto does not copy to the kernel (DESIGN.md); without either, the
  collective comes from the kernel name.
- Instances match by (capture window, process group, Seq), else by the call's ordinal within its
  process group on each rank.
- The last rank to arrive has the shortest kernel; every other rank's extra duration is waiting
  for it (DESIGN.md). This needs no clock alignment.
- Clock offsets are solved from the matched instances in clocks.py.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import duckdb
import msgspec
import numpy as np

from diag.knowledge.links import bus_factor, normalize_collective
from diag.timeline.rank import RankTimeline

# Bytes per element of the dtypes record_param_comms writes ("Float", "BFloat16", ...).
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "bfloat16": 2, "half": 2, "float16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "byte": 1, "uint8": 1,
    "char": 1, "int8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


class Call(msgspec.Struct, frozen=True):
    """One collective call on one rank."""

    rank: int
    file_id: int
    window: int
    act: int                 # index of the kernel in the rank's timeline
    step: int | None
    pg_name: str
    pg_desc: str | None
    collective: str
    seq: int | None
    group_size: int | None
    group_ranks: str | None
    msg_bytes: int | None
    dtype: str | None
    ts_ns: int
    end_ns: int
    direction: str | None = None   # 'send' | 'recv' for point-to-point
    peer: int | None = None        # the other side's global rank, for point-to-point


class Matched(msgspec.Struct, frozen=True):
    call: Call
    ordinal: int
    instance: str
    wait_ns: int
    last_rank: int | None
    n_matched: int


def calls_of(con: duckdb.DuckDBPyConnection, tl: RankTimeline) -> list[Call]:
    comm = np.nonzero(tl.kclass == "comm")[0]
    if not len(comm):
        return []
    args = con.execute(
        """
        SELECT source, tid, ts_ns, ts_ns + dur_ns, correlation, collective, pg_name, pg_desc, seq,
               group_size, pg_ranks, in_nelems, out_nelems, dtype, peer_rank, external_id
        FROM collective_args WHERE file_id = ? ORDER BY tid, ts_ns
        """,
        [tl.file_id],
    ).fetchall()
    # Every call keeps its args for the reduce: one str object per distinct text, not per call
    # (a 128-rank group's rank list alone is ~470 characters, on every call of the group).
    texts: dict[str, str] = {}
    groups: dict[tuple[int, ...], str] = {}
    args = [tuple(texts.setdefault(v, v) if isinstance(v, str) else v for v in a) for a in args]
    by_corr = {a[4]: a for a in args if a[0] == "kernel" and a[4] is not None}
    ops = _CpuOps([a for a in args if a[0] == "cpu_op"])
    calls = []
    launch = tl.acts.take(comm)
    for i, corr, ext, tid, launch_ts, step_i, ts, end in zip(
        comm.tolist(), launch.column("correlation").to_pylist(), launch.column("ext").to_pylist(),
        launch.column("launch_tid").to_pylist(), launch.column("launch_ts").to_pylist(),
        tl.step_of[comm].tolist(), tl.ts_ns[comm].tolist(), tl.end_ns[comm].tolist(), strict=True,
    ):
        a = _merged(by_corr.get(corr), ops.launching(tid, launch_ts, ext))
        kname = tl.collective[i] or "unknown"
        step = tl.steps.step[step_i] if step_i >= 0 else -1   # the ProfilerStep number
        if a is None:
            if kname == "sendrecv" and not tl.host_timeline:
                # NCCL runs all-to-all as grouped send/recv: without the CPU-side op we cannot
                # tell a pipeline transfer from an all-to-all, so it is not called a bubble.
                kname = "alltoall|sendrecv"
            calls.append(Call(tl.rank, tl.file_id, tl.capture_window, i, step if step >= 0 else None,
                              "unknown", None, kname, None, None, None, None, None, ts, end))
            continue
        coll = normalize_collective(a[5] or "") or kname
        raw = (a[5] or "").lower()
        direction = "send" if "send" in raw else "recv" if "recv" in raw else None
        ranks = None if a[10] is None else tuple(a[10])
        if ranks is not None and ranks not in groups:
            groups[ranks] = ",".join(map(str, ranks))
        size = _DTYPE_BYTES.get((a[13] or "").lower().removeprefix("c10::"))
        nelems = max(a[11] or 0, a[12] or 0)
        calls.append(Call(
            tl.rank, tl.file_id, tl.capture_window, i, step if step >= 0 else None, a[6] or "unknown", a[7],
            coll, a[8], a[9], None if ranks is None else groups[ranks],
            nelems * size if size and nelems else None, a[13], ts, end, direction, a[14],
        ))
    return calls


# Fields of a collective_args row (calls_of's SELECT) that the CPU op gives before the kernel:
# Seq and the peer are written on record_param_comms only (torch's profiler; Kineto copies the
# name, sizes, dtype and process group to the kernel, not these).
_SEQ, _PEER = 8, 14
_FIELDS = range(5, 15)
# record_param_comms spans nest at most a few deep (a coalesced group around its ops): looking
# this many spans back from the last that began before a launch finds the one around it.
_NESTING = 8

Row = tuple[Any, ...]


class _CpuOps:
    """A rank's record_param_comms rows, found by the launch they contain or by External id."""

    def __init__(self, rows: list[Row]) -> None:
        self.by_tid: dict[int, list[Row]] = defaultdict(list)
        for row in rows:   # sorted by (tid, ts): calls_of's ORDER BY
            self.by_tid[row[1]].append(row)
        self.starts = {tid: [r[2] for r in rs] for tid, rs in self.by_tid.items()}
        self.by_ext = {r[15]: r for r in rows if r[15] is not None}

    def launching(self, tid: int | None, ts: int | None, ext: int | None) -> Row | None:
        """The innermost span on the launching thread that contains the launch, else the op with
        the kernel's External id (a launch with no runtime call recorded)."""
        if tid is not None and ts is not None and tid in self.by_tid:
            rows, last = self.by_tid[tid], bisect_right(self.starts[tid], ts) - 1
            for row in rows[max(0, last - _NESTING + 1):last + 1][::-1]:
                if row[3] >= ts:
                    return row
        return self.by_ext.get(ext) if ext is not None else None


def _merged(kernel: Row | None, cpu: Row | None) -> Row | None:
    """The kernel's row with each field it lacks taken from the CPU op's; Seq and the peer from
    the CPU op's where it has them."""
    if kernel is None or cpu is None:
        return kernel or cpu
    out = list(kernel)
    for f in _FIELDS:
        if cpu[f] is not None and (out[f] is None or f in (_SEQ, _PEER)):
            out[f] = cpu[f]
    return tuple(out)


def match(calls: Iterable[Call]) -> list[Matched]:
    ordered = sorted(calls, key=lambda c: (c.rank, c.window, c.ts_ns))
    ordinal: dict[tuple[object, ...], int] = defaultdict(int)
    keyed: list[tuple[Call, int, str]] = []
    instances: dict[str, str] = {}
    for c in ordered:
        if c.direction is not None and c.peer is not None:
            # Point-to-point Seq is each rank's own counter (ProcessGroupNCCL seqP2P_): the two
            # sides need not agree. The k-th send a→b pairs with the k-th recv on b from a.
            src, dst = (c.rank, c.peer) if c.direction == "send" else (c.peer, c.rank)
            k: tuple[object, ...] = (c.rank, c.window, c.pg_name, src, dst)
            key = f"w{c.window}|{c.pg_name}|p2p {src}->{dst}|#{ordinal[k]}"
        else:
            k = (c.rank, c.window, c.pg_name)
            key = f"w{c.window}|{c.pg_name}|seq{c.seq}" if c.seq is not None else f"w{c.window}|{c.pg_name}|#{ordinal[k]}"
        o = ordinal[k]
        ordinal[k] += 1
        keyed.append((c, o, instances.setdefault(key, key)))   # one str per instance, shared by its calls
    # One pass per instance (not per member): cost linear in calls, whatever the group size.
    groups: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)   # (key, collective) → rank → dur
    for c, _, key in keyed:
        groups[(key, c.collective)][c.rank] = c.end_ns - c.ts_ns
    last_of = {g: min(durs, key=lambda r: (durs[r], r)) for g, durs in groups.items()}
    out = []
    for c, o, key in keyed:
        g = (key, c.collective)
        durs = groups[g]
        if len(durs) < 2 or c.collective == "sendrecv":
            # Point-to-point waits are pipeline bubble, not stragglers (docs/ledger.md).
            out.append(Matched(c, o, key, 0, None, len(durs)))
            continue
        last = last_of[g]
        out.append(Matched(c, o, key, max(0, durs[c.rank] - durs[last]), last, len(durs)))
    return out


def collective_rows(matched: list[Matched], offsets_ns: Mapping[int, int]) -> Iterator[tuple]:  # type: ignore[type-arg]
    """The collectives table's rows, one per call, made as they are consumed; times aligned by each
    rank's clock offset (clocks.py)."""
    for m in matched:
        c = m.call
        off = offsets_ns.get(c.rank, 0)
        dur = c.end_ns - c.ts_ns
        transfer = max(dur - m.wait_ns, 0)
        algbw = c.msg_bytes / transfer if c.msg_bytes and transfer > 0 else None  # bytes/ns = GB/s
        n = c.group_size or m.n_matched
        known = normalize_collective(c.collective) is not None
        busbw = algbw * bus_factor(c.collective, n) if algbw is not None and n and known else None
        yield (
            c.file_id, c.rank, c.step, c.pg_name, c.pg_desc, c.collective, c.seq, m.ordinal, m.instance,
            c.group_size, c.group_ranks, c.msg_bytes, c.dtype, c.ts_ns, c.end_ns, c.ts_ns + off, c.end_ns + off,
            m.wait_ns, transfer, m.last_rank, m.n_matched, algbw, busbw,
        )


def wait_intervals(matched: list[Matched]) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """Per (rank, capture window): [start, start + wait) of each call, the time spent waiting for the last rank."""
    by_window: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for m in matched:
        if m.wait_ns > 0:
            by_window[(m.call.rank, m.call.window)].append((m.call.ts_ns, m.call.ts_ns + m.wait_ns))
    return {k: (np.asarray([s for s, _ in v], np.int64), np.asarray([e for _, e in v], np.int64))
            for k, v in by_window.items()}
