"""Parse one Kineto (PyTorch profiler) trace into Arrow tables shaped like diag/sql/schema.sql.

msgspec decodes the document into typed structs with each event's `args` kept as raw JSON
(DESIGN.md: 1.0–1.3 s and 0.54 GB for a 268 MB trace, 4–5× faster than orjson and exact on
integers above 2^64). The typed `args` keys diag reads are decoded per event into a second
struct; the raw text is stored verbatim beside them.

Both schemas are read: today's (cpu_op, user_annotation, python_function, cuda_runtime,
cuda_driver, kernel, gpu_memcpy, gpu_memset, gpu_user_annotation, ac2g flows) and the 2021 one
(Operator, Runtime, Kernel, Memcpy, Memset, async_gpu flows, lower-case "external id").
"""

from __future__ import annotations

import gc
import hashlib
import re
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing, contextmanager
from functools import cache, lru_cache, partial
from operator import itemgetter
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, TypeVar

import msgspec
import numpy as np
import pyarrow as pa

from diag.runtime.errors import BadInput

if TYPE_CHECKING:
    from diag.ingest.forked import Claims, Part, SecondHalf
    from diag.ingest.merged import RankMap

Number = int | float


_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` keys diag types on every event. Unknown keys are skipped by the decoder (and
    kept in raw text).

    msgspec looks a key up from the field after the one it found last, and scans every field for
    a key it does not type (most of them: "Trace name", "queued", "registers per thread"...), so
    each field here costs every event: the fields are in the order Kineto writes them (runtime
    calls: External id, cbid, correlation; kernels and copies: External id, device, stream,
    correlation, bytes, grid, block; CPU ops: External id, Input Dims, Input type, Fwd thread id,
    Sequence number), and a collective's other keys are decoded apart, for the few events that
    name one (_Collective). A 4 MB chunk of the 307 MB trace decodes in 13–16 ms so, in 16–20 ms
    with all 31 fields here (the best of 31 runs, four chunks)."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    cbid: int | None = None
    device: int | None = None
    stream: int | str | None = None   # ROCm's roctracer writes a hex string ("0x0"): _stream_or_tid
    correlation: int | None = None
    bytes: int | None = None
    grid: msgspec.Raw = _NO_RAW
    block: msgspec.Raw = _NO_RAW
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    fwd_tid: int | None = msgspec.field(default=None, name="Fwd thread id")
    seq_num: int | None = msgspec.field(default=None, name="Sequence number")
    flops: Number | None = None
    # An NCCL collective (record_param_comms, and kernels in newer Kineto): its other keys are _Collective's.
    collective: str | None = msgspec.field(default=None, name="Collective name")
    external_id_2021: int | None = msgspec.field(default=None, name="external id")
    # The rank a merge tool stamped on every event (TraceLens TraceFusion; diag/ingest/merged.py).
    rank: int | None = None


class _Collective(msgspec.Struct, frozen=True, gc=False):
    """The keys of an event's args that describe its collective, read from its raw args where
    `Collective name` is set."""

    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Process Group Ranks")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    seq: int | None = msgspec.field(default=None, name="Seq")
    # Point-to-point: "Rank" is the peer's rank within the group; "Dst Rank"/"Src Rank" its global rank.
    peer_group_rank: int | None = msgspec.field(default=None, name="Rank")
    dst_rank: int | None = msgspec.field(default=None, name="Dst Rank")
    src_rank: int | None = msgspec.field(default=None, name="Src Rank")
    rank_start: int | None = msgspec.field(default=None, name="Global rank start")
    rank_stride: int | None = msgspec.field(default=None, name="Global rank stride")
    in_split: msgspec.Raw = msgspec.field(default=_NO_RAW, name="In split size")
    out_split: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Out split size")


_EMPTY_ARGS = _Args()
_NO_COLLECTIVE = _Collective()
_Typed = TypeVar("_Typed", _Args, _Collective)


class _EventFields(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: Number | None = None
    dur: Number | None = None
    id: int | str | None = None


class _Event(_EventFields, gc=False):
    args: _Args = _EMPTY_ARGS        # typed in the same C pass as the event


class _EventLoose(_EventFields, gc=False):
    """The same event with raw args: the fallback when some args key has an unexpected type."""

    args: msgspec.Raw = _NO_RAW


class _RawArgs(msgspec.Struct, gc=False):
    """Only the args of each event, as raw JSON text: the `args` column."""

    args: msgspec.Raw = _NO_RAW


# The store's column types: a value beyond them is refused by name, not by a failed insert.
_Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Head(msgspec.Struct, gc=False):
    """The document with the events left as raw text: metadata plus where the events are."""

    traceEvents: msgspec.Raw = _NO_RAW
    schemaVersion: _Int32 | None = None
    deviceProperties: msgspec.Raw = _NO_RAW
    distributedInfo: msgspec.Raw = _NO_RAW
    displayTimeUnit: str | None = None
    baseTimeNanoseconds: _Int64 | None = None


_head_decoder = msgspec.json.Decoder(_Head)
_events_decoder = msgspec.json.Decoder(list[_Event])
_loose_decoder = msgspec.json.Decoder(list[_EventLoose])
_raw_args_decoder = msgspec.json.Decoder(list[_RawArgs])
_args_decoder = msgspec.json.Decoder(_Args)
_collective_decoder = msgspec.json.Decoder(_Collective)
# Kineto's events are written one object after another: `}`, a comma, `{`. A match inside a
# string or a nested object is found out by the chunk failing to decode, and skipped.
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
# ~4 MB of JSON is ~12k events: large enough that per-chunk costs vanish, small enough that the
# Python objects of one chunk stay a few tens of MB.
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
# Events of this much JSON or more are parsed by two processes at once (diag/ingest/forked.py):
# parsing is ~70% of ingesting a 307 MB trace, and half of `diag analyze` of the 35 MB control
# trace, which it takes from 1.67 s to 1.54 s (medians of 9, interleaved) at the same peak of the
# process tree (282 MB; the child shares the parent's pages). Smaller ones are read whole: the fork
# and reading the child's tables back cost the same whatever the part's size.
SPLIT_BYTES = 16 * 1024 * 1024
# ... in this many segments, which the two processes claim one at a time, in file order: the last
# to finish waits at most about a segment's parse for the other.
SEGMENTS = 32

_KERNEL_CATS = frozenset({"kernel", "Kernel"})
_MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy"})
_MEMSET_CATS = frozenset({"gpu_memset", "Memset"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver"})
_FLOW_PHASES = frozenset({"s", "f", "t"})
# Host-side 'X' categories that are not CPU spans: they go to other_events.
_NOT_CPU_X = frozenset({"Trace", "cuda_sync", "cuda_profiler_range"})


class KinetoFile(msgspec.Struct):
    """What a parse learns about a file beyond its event rows (filled as its chunks are read)."""

    schema_version: int | None
    time_unit: str | None
    base_time_ns: int | None
    device_props: Any
    distributed_info: Any
    partial: bool
    damage_offset: int | None
    warnings: list[str] = msgspec.field(default_factory=list)
    n_events: int = 0
    first_ts_ns: int | None = None
    last_ts_ns: int | None = None
    has_gpu: bool = False
    schema_era: str = "current"
    kernel_devices: list[int] = msgspec.field(default_factory=list)

    @classmethod
    def blank(cls) -> KinetoFile:
        """Counts only: what a part of a file's events adds up to (diag/ingest/forked.py)."""
        return cls(None, None, None, None, None, False, None)

    def counts(self) -> dict[str, Any]:
        return {"n_events": self.n_events, "first_ts_ns": self.first_ts_ns, "last_ts_ns": self.last_ts_ns,
                "has_gpu": self.has_gpu, "era_2021": self.schema_era == "2021", "kernel_devices": self.kernel_devices}

    def add_counts(self, c: dict[str, Any]) -> None:
        """Fold in the counts of the events after this file's so far."""
        self.n_events += c["n_events"]
        if c["first_ts_ns"] is not None:
            self.first_ts_ns = c["first_ts_ns"] if self.first_ts_ns is None else min(self.first_ts_ns, c["first_ts_ns"])
        if c["last_ts_ns"] is not None:
            self.last_ts_ns = c["last_ts_ns"] if self.last_ts_ns is None else max(self.last_ts_ns, c["last_ts_ns"])
        if not self.kernel_devices:
            self.kernel_devices = c["kernel_devices"]
        self.has_gpu |= c["has_gpu"]
        if c["era_2021"]:
            self.schema_era = "2021"

    def absorb(self, n_events: int, tables: dict[str, pa.Table], era_2021: bool) -> None:
        """Fold in one chunk's tables."""
        lo, hi = _extent(tables)
        gpu = tables["kernels"].num_rows + tables["copies"].num_rows
        devices: list[int] = []
        if gpu and not self.kernel_devices:
            col = tables["kernels"] if tables["kernels"].num_rows else tables["copies"]
            devices = [d for d in col.column("device").to_pylist()[:1] if d is not None]
        self.add_counts({"n_events": n_events, "first_ts_ns": lo, "last_ts_ns": hi, "has_gpu": gpu > 0,
                         "era_2021": era_2021, "kernel_devices": devices})


class _Split(NamedTuple):
    """The events mv[pos:end] in segments, and the forked child claiming them with this process."""

    pos: int
    end: int
    segments: list[tuple[int, int]]
    claims: Claims
    half: SecondHalf

    def close(self) -> None:
        self.half.close()
        self.claims.close()


class Begun(NamedTuple):
    """read_kineto's first steps taken before it is called (`begin`), for the `data` they were
    taken on: the head decoded and, for a file split, the child already parsing."""

    data: Any
    head: _Head
    damage: int | None
    decoded: Any
    split: _Split | None

    def close(self) -> None:
        """End the child, if read_kineto did not take it."""
        if self.split is not None:
            self.split.close()

    def __enter__(self) -> Begun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def begin(path: str, data: Any, salvage: bool, release: Any, split: bool, where: str | None = None) -> Begun:
    """read_kineto's first steps for `data`, taken before it is called: the head decoded and, with
    `split` and events enough, the child forked, which claims segments meanwhile. Raises
    BadInput as read_kineto would; close the result (a `with` block) once read_kineto is done.

    The child is forked before the head is checked, at where the events seem to be (_seeming_span:
    the first "traceEvents" key, the last `]`), so that it parses while this process checks the
    whole document (0.04 s for the 35 MB control trace, 0.25 s for 307 MB). Where the check finds
    the events elsewhere (an array after them, a salvaged copy), that child is closed and one is
    forked where they are: read_kineto takes a child's segments only if they span the events."""
    seeming = _seeming_span(data) if split else None
    forked = _fork_back(path, memoryview(data), *seeming, DEFAULT_CHUNK_BYTES, release, where) \
        if seeming is not None and seeming[1] - seeming[0] >= SPLIT_BYTES else None
    try:
        head, damage, decoded = _decode_head(path, data, salvage)
    except BaseException:
        if forked is not None:
            forked.close()
        raise
    pos, end = _span(decoded, head.traceEvents)
    if forked is not None and (decoded is not data or (forked.pos, forked.end) != (pos, end)):
        forked.close()
        forked = None
    if forked is None and split and end - pos >= SPLIT_BYTES:
        forked = _fork_back(path, memoryview(decoded), pos, end, DEFAULT_CHUNK_BYTES, release, where)
    return Begun(data, head, damage, decoded, forked)


# Kineto writes the events' key within the document's first bytes, after deviceProperties and
# distributedInfo (a few kB); one not found there is not looked for further.
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[\s*')
_EVENTS_KEY_WITHIN = 1024 * 1024


def _seeming_span(data: Any) -> tuple[int, int] | None:
    """Where the events seem to be, as _span would say, unchecked: after the first "traceEvents"
    key's `[`, up to the document's last `]`."""
    m = _EVENTS_KEY.search(data, 0, min(len(data), _EVENTS_KEY_WITHIN))
    end = data.rfind(b"]")
    return (m.end(), end) if m is not None and end >= m.end() else None


def read_kineto(
    path: str, data: Any, salvage: bool = False, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    release: Any = None, split: bool = False, rank_map: RankMap | None = None,
    while_waiting: Callable[[], None] | None = None, begun: Begun | None = None,
) -> tuple[KinetoFile, Iterator[dict[str, pa.Table]]]:
    """The file's metadata, and its event tables one bounded chunk at a time.

    One C pass validates the whole document and finds the events array (left as raw text); then
    each chunk of about `chunk_bytes` is decoded and tabulated, so memory holds one chunk of
    Python objects whatever the file's size. `release(start, end)` is told when a byte range of
    `data` is done with (memory-mapped files drop those pages). With `split`, a file of SPLIT_BYTES or
    more of events is parsed by this process and a forked child at once (diag/ingest/forked.py).
    With `rank_map` (a merged file), every table gets a `rank` column and each event its original pid.
    `while_waiting` is called when this process is done with its part and the child is not (the
    consumer writes what it holds of the tables yielded so far, rather than wait idle). `begun`: its
    first steps, taken already (`begin`).
    """
    if begun is None or begun.data is not data:
        begun = Begun(data, *_decode_head(path, data, salvage), None)
    head, damage, decoded = begun.head, begun.damage, begun.decoded
    info = KinetoFile(
        schema_version=head.schemaVersion, time_unit=head.displayTimeUnit,
        base_time_ns=head.baseTimeNanoseconds, device_props=_json_or_none(path, "deviceProperties", head.deviceProperties),
        distributed_info=_json_or_none(path, "distributedInfo", head.distributedInfo), partial=damage is not None, damage_offset=damage,
    )
    return info, _chunks(path, info, decoded, head.traceEvents, chunk_bytes, release, split, rank_map, while_waiting,
                         begun.split)


def _offset_in(data: Any, part: msgspec.Raw) -> int:
    """Where `part`, a slice of `data` that msgspec decoded without a copy, begins in it."""
    return int(np.frombuffer(part, np.uint8).__array_interface__["data"][0]
               - np.frombuffer(data, np.uint8).__array_interface__["data"][0])


def _chunks(
    path: str, info: KinetoFile, data: Any, events: msgspec.Raw, chunk_bytes: int, release: Any, split: bool,
    rank_map: RankMap | None, while_waiting: Callable[[], None] | None, begun: _Split | None,
) -> Iterator[dict[str, pa.Table]]:
    """The tables of the events array `events`, read in place from `data`, the buffer it was decoded
    from (the file's content, or a salvaged copy of its first bytes): every position below is a byte
    of the file, as `release` and an error's offset want."""
    bad: Counter[str] = Counter()
    mv = memoryview(data)
    pos, end = _span(data, events)
    if begun is not None and not (split and rank_map is None and (begun.pos, begun.end) == (pos, end)):
        begun.close()   # not wanted after all
        begun = None
    if not (split and end - pos >= SPLIT_BYTES and rank_map is None):
        yield from _range(path, info, mv, pos, end, chunk_bytes, release, bad, None, rank_map)
    else:
        yield from _two_ends(path, info, mv, pos, end, chunk_bytes, release, bad, while_waiting, begun)
    info.warnings.extend(value_warnings(bad))
    if info.partial:
        info.warnings.append(
            f"damaged at byte {info.damage_offset}: kept the {info.n_events} complete events before it"
        )


def _span(data: Any, events: msgspec.Raw) -> tuple[int, int]:
    """(first event's start, closing bracket) of the events array `events`, decoded from `data`."""
    mv, base = memoryview(data), _offset_in(data, events) if len(events) else 0
    end = base + len(events)
    while end > base and mv[end - 1] != ord("]"):
        end -= 1
    end -= 1                                    # the closing bracket
    pos = base + 1                              # after the opening bracket
    while pos < end and mv[pos] in b" \t\r\n":
        pos += 1
    return pos, end


def _two_ends(
    path: str, info: KinetoFile, mv: memoryview, pos: int, end: int, chunk_bytes: int, release: Any,
    bad: Counter[str], while_waiting: Callable[[], None] | None, begun: _Split | None,
) -> Iterator[dict[str, pa.Table]]:
    """The events in mv[pos:end] in SEGMENTS segments, claimed in file order by this process and a
    forked child (diag/ingest/forked.py; `begun`: the child forked already), the tables in file
    order. A part is taken only where the part before it ended at its segment's end: a boundary
    inside a string makes the part before end short of it (or read on to the end), and the next
    one is then read here from where that one ended, as one process reads the file."""
    forked = begun or _fork_back(path, mv, pos, end, chunk_bytes, release)
    if forked is None:   # no second process to be had (memory, a process limit): one reads it all
        yield from _range(path, info, mv, pos, end, chunk_bytes, release, bad)
        return
    segments, claims, half = forked.segments, forked.claims, forked.half
    with closing(forked):
        mine: dict[int, Part | None] = {}   # this process's parts, parsed ahead of their turn
        at = pos
        for j, (start, stop) in enumerate(segments):
            clean = at == (segments[j - 1][1] if j else pos)
            if not clean:
                mine.pop(j, None)   # begun where the part before did not end: read again below
                if at >= stop:
                    continue   # read through by the part before
            part = _turn(path, mv, segments, chunk_bytes, j, mine, claims, half, while_waiting) if clean else None
            if part is None:
                at = yield from _range(path, info, mv, start if clean else at, end, chunk_bytes, release, bad, stop)
                continue
            info.add_counts(part.counts)
            bad.update(part.bad)
            yield from part.tables
            if release is not None:
                release(start, part.end)
            at = part.end


# This process's parts parsed ahead of their turn, at most: each waits in memory for the child's
# part before it (a few MB of tables a segment of the 307 MB trace).
AHEAD = 2


def _turn(
    path: str, mv: memoryview, segments: list[tuple[int, int]], chunk_bytes: int, j: int,
    mine: dict[int, Part | None], claims: Claims, half: SecondHalf, while_waiting: Callable[[], None] | None,
) -> Part | None:
    """Segment j's part, once there is one: this process's, or the child's. Until the child's is
    done, this process claims and parses segments itself; with none left to claim (or AHEAD of them
    parsed), it writes what it holds (`while_waiting`) and waits. None: j is for this process to read."""
    while j not in mine and not half.ready(j):
        i = claims.claim() if len(mine) < AHEAD else None
        if i is not None:
            mine[i] = _part(path, mv, segments[i], chunk_bytes, None)
            continue
        if while_waiting is not None:
            while_waiting()
        return half.part(j)
    return mine.pop(j) if j in mine else half.part(j)


def _part(path: str, mv: memoryview, segment: tuple[int, int], chunk_bytes: int, release: Any) -> Part | None:
    """A segment parsed on its own, before its turn: None where it cannot be (a bad event, or it
    begins inside a string), which its turn then finds out with the file's own counts. It ends at
    the segment's end, or short of it where that end is not between two events (its turn then
    reads on from there): never past it, so that a part's tables are a segment's at most."""
    from diag.ingest.forked import Part

    counts, bad, tables = KinetoFile.blank(), Counter[str](), []
    start, stop = segment
    chunks = _range(path, counts, mv, start, stop, chunk_bytes, release, bad, stop)
    try:
        while True:
            tables.append(next(chunks))
    except StopIteration as ended:
        return Part(ended.value, counts.counts(), bad, tables)
    except BadInput:
        return None


def _fork_back(path: str, mv: memoryview, pos: int, end: int, chunk_bytes: int, release: Any,
               where: str | None = None) -> _Split | None:
    """The events mv[pos:end] in SEGMENTS segments, and a forked child claiming them with this
    process; None if no process can be forked, or its files made (`where` not a directory, a full
    disk): one process then reads them all."""
    from diag.ingest.forked import Claims, SecondHalf

    segments = _segments(mv, pos, end, (end - pos) // SEGMENTS)
    try:
        claims = Claims(len(segments), where)
    except OSError:
        return None
    try:
        half = SecondHalf(claims, partial(_in_the_child, path, mv, segments, chunk_bytes, release), where)
    except OSError:
        claims.close()
        return None
    return _Split(pos, end, segments, claims, half)


def _segments(mv: memoryview, pos: int, end: int, size: int) -> list[tuple[int, int]]:
    """The events mv[pos:end] cut at event boundaries about every `size` bytes: each part's
    (start, end). A boundary inside a string is found out when the part ending there is read."""
    out = []
    while pos < end:
        cut, nxt = _cut(mv, pos, end, size)
        out.append((pos, cut))
        pos = nxt
    return out


def _in_the_child(path: str, mv: memoryview, segments: list[tuple[int, int]], chunk_bytes: int, release: Any,
                  i: int) -> Part | None:
    """The forked child's work on segment i. The pages before it are handed back first (the
    child's copy of them, never read there again): the child of a 307 MB file peaked at 481 MB
    RSS with those this process parses, 344 without."""
    if release is not None:
        release(segments[0][0], segments[i][0])
    return _part(path, mv, segments[i], chunk_bytes, release)


def _range(
    path: str, info: KinetoFile, mv: memoryview, pos: int, end: int, chunk_bytes: int, release: Any,
    bad: Counter[str], stop: int | None = None, rank_map: RankMap | None = None,
) -> Generator[dict[str, pa.Table], None, int]:
    """The events in mv[pos:end], chunk by chunk; with `stop`, it ends there, or just before
    where `stop` turns out not to end a whole event. Returns where it ended."""
    while pos < end:
        limit = stop if stop is not None and pos < stop else end
        cut, nxt = _cut(mv, pos, limit, chunk_bytes)
        piece, mended = _piece(mv, pos, cut), 0
        with _no_gc():
            while True:
                try:
                    evs = _typed_events(piece, bad)
                    break
                except _BadEvent as e:
                    raise BadInput(path, f"event {info.n_events + e.index} {e.reason}") from None
                except msgspec.DecodeError:
                    if not mended and not _is_utf8(piece):
                        # A typed string (a name cut mid-character) holds bytes that are not UTF-8,
                        # which the whole document's check skipped over: kept, as in _raw_column.
                        piece, mended = _mend_utf8(piece)
                        continue
                    if cut == stop:
                        return pos
                    if cut >= end:
                        raise BadInput(path, f"events from byte {pos} do not decode as a list") from None
                    # The boundary fell inside a string or a nested object: take the next one.
                    cut, nxt = _cut(mv, nxt, end, 0)
                    piece, mended = _piece(mv, pos, cut), 0
            bad["not_utf8"] += mended
            raws = [r.args for r in _raw_args_decoder.decode(piece)]
            try:
                tables, era_2021 = _tabulate(evs, raws, bad) if rank_map is None else \
                    _tabulate_by_rank(evs, raws, bad, rank_map)
            except _OutOfRange:
                i, what = next((i, f"{k} {v}") for i, e in enumerate(evs) for k, v in (("ts", e.ts), ("dur", e.dur))
                               if v is not None and abs(v) > _MAX_US)
                raise BadInput(path, f"event {info.n_events + i}: {what} µs is beyond the nanosecond range "
                                     "(int64) of any clock") from None
        info.absorb(len(evs), tables, era_2021)
        yield tables
        if release is not None:
            release(pos, cut)
        if cut == stop:
            return stop
        pos = nxt
    return pos


def _piece(mv: memoryview, pos: int, cut: int) -> bytes:
    """The events in mv[pos:cut] as a JSON list, copied once: `b"[" + mv[...].tobytes() + b"]"`
    copied them twice, 11.8 ms of the 35 MB control trace's parse against 4.4 ms."""
    return b"".join((b"[", mv[pos:cut], b"]"))


@contextmanager
def _no_gc() -> Iterator[None]:
    """A chunk builds ~10^5 short-lived, acyclic objects: the cyclic collector would walk them
    again and again for nothing (msgspec's docs advise the same)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _cut(mv: memoryview, pos: int, end: int, size: int) -> tuple[int, int]:
    """(end of this chunk, start of the next) at the first event boundary ≥ pos + size."""
    if pos + size >= end:
        return end, end
    m = _BOUNDARY.search(mv, pos + size, end)  # type: ignore[call-overload]
    if m is None:
        return end, end
    return m.start() + 1, m.end() - 1


class _BadEvent(Exception):
    """An event of a chunk that is not a Kineto event; `index` counts from the chunk's first."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.reason = index, reason


_AT_EVENT = re.compile(r"^(.*?)\s*-\s*at `\$\[(\d+)\]([^`]*)`$")


def _typed_events(piece: bytes, bad: Counter[str]) -> list[_Event]:
    try:
        return _events_decoder.decode(piece)
    except msgspec.ValidationError:
        pass
    try:
        loose = _loose_decoder.decode(piece)
    except msgspec.ValidationError as e:
        # msgspec says "Expected `str`, got `int` - at `$[12].name`": 12 counts within the chunk.
        m = _AT_EVENT.match(str(e))
        if m is None:
            raise _BadEvent(0, f"is not a Kineto event: {e}") from None
        raise _BadEvent(int(m.group(2)), f"is not a Kineto event: {m.group(1)} at {m.group(3).lstrip('.')}") from None
    out = []
    for ev in loose:
        args = _decode_args([ev.args], bad)[0]
        out.append(_Event(ev.ph, ev.cat, ev.name, ev.pid, ev.tid, ev.ts, ev.dur, ev.id, args))
    return out


# --------------------------------------------------------------------------- decoding


def _decode_head(path: str, data: Any, salvage: bool) -> tuple[_Head, int | None, Any]:
    """The document's head, where it is damaged (with `salvage`), and the buffer it was decoded from."""
    try:
        head = _head_decoder.decode(data)
    except msgspec.ValidationError as e:
        raise BadInput(path, f"not a Kineto trace: {e}") from None
    except RecursionError:
        raise BadInput(path, "JSON nested too deeply to be a Kineto trace") from None
    except msgspec.DecodeError as e:
        offset = _error_offset(e, len(data))
        if not salvage:
            raise BadInput(path, f"{_describe(e, data, offset)}; --salvage keeps the events before it", offset) from None
        head, cut = _salvage(path, data, offset)
        return head, offset, cut
    if memoryview(head.traceEvents)[:1].tobytes() != b"[":
        raise BadInput(path, "not a Kineto trace: traceEvents is not a list", 0)
    return head, None, data


def _error_offset(e: msgspec.DecodeError, size: int) -> int:
    m = re.search(r"\(byte (\d+)\)", str(e))
    return int(m.group(1)) if m else size  # "truncated" carries no offset: the damage is at the end


def _describe(e: msgspec.DecodeError, data: bytes, offset: int) -> str:
    if "truncated" in str(e):
        return "truncated JSON (the file ends mid-document: a run killed while writing?)"
    ch = data[offset : offset + 1]
    if ch and ch[0] < 0x20:
        return f"control character 0x{ch[0]:02x} inside the JSON (PyTorch issue 130622)"
    if data[offset : offset + 3] in (b"NaN", b"Inf") or data[offset : offset + 9] == b"-Infinity":
        return "NaN/Infinity literal, which JSON does not allow"
    return f"malformed JSON: {e}"


# Kineto writes one event per element of `traceEvents`; a complete element ends with `}` followed
# by `,`. Closing the array and the document right after the last complete element gives a valid
# document of every event before the damage.
_ELEMENT_END = re.compile(rb"\}\s*,")


def _salvage(path: str, data: Any, offset: int) -> tuple[_Head, bytes]:
    """The head of the document cut after its last complete event before `offset`, and that cut
    document (a copy of the file's first bytes, then the closing brackets)."""
    start = data.find(b'"traceEvents"')
    if start < 0 or start > offset:
        raise BadInput(path, "damaged before any trace event; nothing to salvage", offset)
    ends = [m.start() for m in _ELEMENT_END.finditer(data, start, offset)]
    for end in reversed(ends[-64:]):
        cut = data[: end + 1] + b"]}"
        try:
            return _head_decoder.decode(cut), cut
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
    raise BadInput(path, "damaged before the first complete trace event; nothing to salvage", offset)


# --------------------------------------------------------------------------- tabulating


class _OutOfRange(Exception):
    """A time in µs whose ns do not fit int64 (cast, it would read as INT64_MIN)."""


# int64 ns reach ±9.22e18, that is ±9.22e15 µs (292 years): Kineto's epoch µs are ~1.7e15.
_MAX_US = (2**63 - 1) // 1000


def _ns_array(values: Sequence[Number | None]) -> pa.Array:
    """_ns_values as an Arrow array."""
    return _arrow_ns(*_ns_values(values))


def _arrow_ns(ns: np.ndarray, invalid: np.ndarray | None) -> pa.Array:
    return pa.array(ns) if invalid is None else pa.array(ns, mask=invalid)


def _ns_values(values: Sequence[Number | None] | np.ndarray, bad: Counter[str] | None = None,
               where: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """µs (as Kineto writes them, up to 3 decimals) → integer ns, vectorized. With `bad`, the values
    are durations: a negative one (among those `where` marks, if given) is kept as 0 and counted.

    The whole µs and the fraction are scaled apart, the whole µs in integers: at absolute epoch µs
    (~1.7e15) a float64 holds whole µs exactly but has 0.25 µs of resolution below them, and their
    ns (~1.7e18) are past its exact integers (2^53): scaled as floats, integer µs came out up to
    128 ns off (1672876799191557 µs → …557120 ns). Integer µs (older traces) are now exact. Returns
    the ns and where a value is missing (None when none is).
    """
    a = np.array(values, dtype=np.float64)   # None → NaN
    valid = np.isfinite(a)
    if (np.abs(a[valid]) > _MAX_US).any():
        raise _OutOfRange
    if bad is not None and (negative := a < 0 if where is None else (a < 0) & where).any():
        bad["negative_dur"] += int(negative.sum())
        a[negative] = 0.0
    a = np.where(valid, a, 0.0)   # 0 where missing (part() counts on it)
    whole = np.floor(a)
    out = whole.astype(np.int64) * 1000 + np.rint((a - whole) * 1000.0).astype(np.int64)
    return out, None if valid.all() else ~valid


def _int_or_none(v: int | str | None) -> int | None:
    if type(v) is int:
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _host_id(v: int | str | None, bad: Counter[str] | None = None) -> int | None:
    """A host pid or tid as an integer. Some writers name a thread ("python", "pt_autograd_0")
    where Kineto writes its number: each name gets its own id, the same in every chunk and file
    (a hash), negative so that it never meets a real one; counted."""
    n = _int_or_none(v)
    if n is None and isinstance(v, str):
        if bad is not None:
            bad["named_ids"] += 1
        return _named_id(v)
    return n


def _host_ids(values: list[int | str | None], bad: Counter[str]) -> pa.Array | list[int | None]:
    """_host_id of each. The integers (or nulls) Kineto writes go to Arrow as they are, in one C
    pass; only a list with a name (or an integer past int64) is looked at value by value."""
    try:
        return pa.array(values, I64)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return [v if type(v) is int else _host_id(v, bad) for v in values]


@lru_cache(maxsize=4096)
def _named_id(name: str) -> int:
    return -1 - int.from_bytes(hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=7).digest(), "big")


def value_warnings(bad: Counter[str]) -> list[str]:
    """What was done to values that could not be kept as written, one warning per kind; the
    "values: " prefix puts them in the report's notes too (diag/api.py)."""
    said = {
        "typed": "typed values were of an unexpected type or out of range; kept raw, typed what fit",
        "negative_dur": "events had a negative duration; kept with duration 0",
        "no_ph": "events had no 'ph'; those with ts and dur read as complete ('X') events, the rest kept aside",
        "named_ids": "pid/tid values were names, not numbers; each name read as its own (negative) id",
        "not_utf8": "byte sequences were not UTF-8 (a string cut mid-character?); each kept as U+FFFD",
    }
    return [f"values: {bad[k]} {text}" for k, text in said.items() if bad[k]]


def _schema(*cols: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema(list(cols))


# Raw JSON columns are Arrow's JSON type (_raw_column), which DuckDB takes as its own.
S, JSON, I64, I32, F64, B = pa.string(), pa.json_(), pa.int64(), pa.int32(), pa.float64(), pa.bool_()
SCHEMAS: dict[str, pa.Schema] = {
    "cpu_ops": _schema(
        ("cat", S), ("name", S), ("pid", I64), ("tid", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("external_id", I64), ("seq_num", I64), ("fwd_tid", I64), ("input_dims", JSON), ("input_types", JSON),
        ("trace_flops", F64), ("args", JSON),
    ),
    "gpu_annotations": _schema(
        ("name", S), ("device", I32), ("stream", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("external_id", I64), ("args", JSON),
    ),
    "runtime_calls": _schema(
        ("cat", S), ("name", S), ("pid", I64), ("tid", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("correlation", I64), ("external_id", I64), ("cbid", I32), ("args", JSON),
    ),
    "kernels": _schema(
        ("name", S), ("device", I32), ("stream", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("correlation", I64), ("external_id", I64), ("grid", JSON), ("block", JSON), ("args", JSON),
    ),
    "copies": _schema(
        ("kind", S), ("name", S), ("device", I32), ("stream", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("correlation", I64), ("external_id", I64), ("bytes", I64), ("args", JSON),
    ),
    "flows": _schema(
        ("cat", S), ("name", S), ("ph", S), ("flow_id", S), ("pid", I64), ("tid", I64), ("ts_ns", I64),
        ("args", JSON),
    ),
    "collective_args": _schema(
        ("source", S), ("external_id", I64), ("correlation", I64), ("tid", I64), ("ts_ns", I64),
        ("dur_ns", I64), ("collective", S), ("pg_name", S), ("pg_desc", S),
        ("pg_ranks", pa.list_(I32)), ("pg_ranks_truncated", B), ("group_size", I32), ("in_nelems", I64),
        ("out_nelems", I64), ("dtype", S), ("seq", I64), ("global_rank_start", I32),
        ("global_rank_stride", I32), ("in_split", JSON), ("out_split", JSON), ("peer_rank", I32),
    ),
    "other_events": _schema(
        ("ph", S), ("cat", S), ("name", S), ("pid", S), ("tid", S), ("ts_ns", I64), ("dur_ns", I64),
        ("args", JSON),
    ),
}
# The tables that hold events (collective_args is derived from them, not counted).
EVENT_TABLES = ("cpu_ops", "gpu_annotations", "runtime_calls", "kernels", "copies", "flows", "other_events")


def _decode_args(raws: Sequence[msgspec.Raw], bad: Counter[str]) -> list[_Args]:
    out: list[_Args] = []
    for raw in raws:
        if not len(raw):
            out.append(_EMPTY_ARGS)
            continue
        try:
            out.append(_args_decoder.decode(raw))
        except msgspec.ValidationError:
            # A typed key of an unexpected type (e.g. "stream": "7"). Keep the event and its raw
            # args, type what fits, and count it.
            bad["typed"] += 1
            out.append(_lenient(raw, _EMPTY_ARGS))
    return out


def _collective(raw: msgspec.Raw, bad: Counter[str]) -> _Collective:
    try:
        return _collective_decoder.decode(raw)
    except msgspec.ValidationError:   # as _decode_args
        bad["typed"] += 1
        return _lenient(raw, _NO_COLLECTIVE)


def _lenient(raw: msgspec.Raw, empty: _Typed) -> _Typed:
    """`empty` with each of its keys that `raw` holds a value of the right type for."""
    obj = msgspec.json.decode(raw)
    if not isinstance(obj, dict):
        return empty
    kind = type(empty)
    kept: dict[str, Any] = {}
    for attr, key in zip(kind.__struct_fields__, kind.__struct_encode_fields__, strict=True):
        if key in obj:
            try:
                one = msgspec.json.decode(msgspec.json.encode({key: obj[key]}), type=kind)
            except msgspec.ValidationError:
                continue
            kept[attr] = getattr(one, attr)
    return msgspec.structs.replace(empty, **kept)


# Where each event goes, as a small integer per event: the order of _KINDS.
_KINDS = ("kernels", "memcpy", "memset", "gpu_ann", "runtime", "cpu", "flows", "other")
KERNELS, MEMCPY, MEMSET, GPU_ANN, RUNTIME, CPU, FLOWS, OTHER = range(len(_KINDS))


class _CompleteKinds(dict[str | None, int]):
    """The kind of a complete ('X') event by its category: a trace has a handful of categories,
    so each is worked out once, on first sight, and then looked up."""

    def __missing__(self, cat: str | None) -> int:
        kind = self[cat] = _KINDS.index(_complete_key(cat))
        return kind


_COMPLETE_KIND = _CompleteKinds()
_NO_PH = len(_KINDS)   # an event without 'ph', while its kind is worked out
_PHASE_KIND = {**dict.fromkeys(_FLOW_PHASES, FLOWS), "": _NO_PH}


def _complete_key(cat: str | None) -> str:
    """The table of a complete ('X') event with a start, by category (a host span without pid or
    tid goes to "other", decided in _kinds)."""
    if cat in _NOT_CPU_X:
        return "other"
    if cat in _KERNEL_CATS:
        return "kernels"
    if cat in _MEMCPY_CATS:
        return "memcpy"
    if cat in _MEMSET_CATS:
        return "memset"
    if cat == "gpu_user_annotation":
        return "gpu_ann"
    if cat in _RUNTIME_CATS or (cat or "").endswith(("_runtime", "_driver")):
        return "runtime"
    return "cpu"


def _kinds(events: list[_Event], missing_ts: np.ndarray, bad: Counter[str]) -> np.ndarray:
    """Each event's kind (an index into _KINDS): one expression an event, then the rare cases as
    whole-array fixes (a host span without pid or tid is found later, in _Chunk)."""
    complete, phase = _COMPLETE_KIND, _PHASE_KIND.get
    kinds = np.array([complete[e.cat] if e.ph == "X" else phase(e.ph, OTHER) for e in events], dtype=np.int8)
    if (no_ph := np.flatnonzero(kinds == _NO_PH)).size:
        # Only a complete ('X') event has both a start and a duration (Chrome trace format).
        bad["no_ph"] += int(no_ph.size)
        for i in no_ph.tolist():
            kinds[i] = OTHER if events[i].dur is None else complete[events[i].cat]
    kinds[(kinds <= CPU) & missing_ts] = OTHER
    return kinds


def _raw_column(raws: Sequence[msgspec.Raw | bytes], bad: Counter[str]) -> pa.Array:
    """Raw JSON texts (each event's args, or one value of them) as one column of Arrow's JSON type
    (UTF-8 text), which DuckDB stores as JSON as it is, null where an event has none: the texts
    copied once (b"".join) behind offsets from their lengths, not a bytes object and an Arrow
    conversion per event (the args of the 307 MB trace's 1.2M events: 0.50 s → 0.10 s).

    msgspec has checked that each is JSON, all but the UTF-8 of the strings it skipped over (a name
    cut mid-character, a stray byte); that is checked here on the joined texts, which begin and end
    with ASCII (a brace, a bracket, a quote, a digit or a literal's letter), so they are UTF-8 exactly
    when each one is. A text that is not is kept with each bad byte as U+FFFD, and counted. DuckDB
    checking the JSON again (CAST AS JSON) took 0.25 s of the 307 MB trace's cpu_ops args, so 0.12 s."""
    if not raws:
        return _empty_json()
    data = b"".join(raws)
    if not _is_utf8(data):
        raws = _mended(raws, bad)
        data = b"".join(raws)
    n = len(raws)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    present = lengths > 0
    valid = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    if len(data) < 2**31:
        return pa.Array.from_buffers(JSON, n, [valid, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])
    return pa.Array.from_buffers(pa.json_(pa.large_string()), n, [valid, pa.py_buffer(offsets), pa.py_buffer(data)])


@cache
def _empty_json() -> pa.Array:
    """Built on first use, as _empty_table (an empty array costs ~18 µs: most tables of a small file)."""
    return pa.array([], JSON)


def _is_utf8(data: bytes) -> bool:
    """ASCII at once (most traces), else by one decode: a copy of a chunk with other text in it."""
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _mended(raws: Sequence[msgspec.Raw | bytes], bad: Counter[str]) -> list[bytes]:
    out = []
    for raw in raws:
        text = bytes(raw)
        if not _is_utf8(text):
            text, n = _mend_utf8(text)
            bad["not_utf8"] += n
        out.append(text)
    return out


_REPLACEMENT = "\ufffd".encode()


def _mend_utf8(data: bytes) -> tuple[bytes, int]:
    """`data` with each byte sequence that is not UTF-8 as U+FFFD, and how many there were."""
    text = data.decode("utf-8", "replace")
    return text.encode(), text.count("\ufffd") - data.count(_REPLACEMENT)


class _Chunk:
    """One chunk's events put in order of kind (trace order within a kind), with what every table
    has worked out once for the whole chunk: a table's share is then a slice, not a Python list
    per table and column (the 307 MB trace's tabulation 0.32 → 0.27 s per 192k events). The
    columns of each table are built apart, so that each holds only its own rows' buffers (an
    Arrow slice keeps the whole chunk's: sized and pickled whole)."""

    def __init__(self, events: list[_Event], raws: list[msgspec.Raw], bad: Counter[str]) -> None:
        self.bad = bad
        ts = np.array([e.ts for e in events], dtype=np.float64)   # None → NaN
        kinds = _kinds(events, np.isnan(ts), bad)
        self._sort(events, kinds)
        host = slice(self.bounds[RUNTIME], self.bounds[CPU + 1])
        self.pids, self.tids = [e.pid for e in self.events[host]], [e.tid for e in self.events[host]]
        if None in self.pids or None in self.tids:   # a host span without pid or tid: "other"
            unnamed = np.array([p is None or t is None for p, t in zip(self.pids, self.tids, strict=True)])
            kinds[self.order[host][unnamed]] = OTHER
            self._sort(events, kinds)
            host = slice(self.bounds[RUNTIME], self.bounds[CPU + 1])
            self.pids, self.tids = [e.pid for e in self.events[host]], [e.tid for e in self.events[host]]
        evs = self.events
        self.ts_ns = _ns_values(ts[self.order])
        # A negative duration claims negative time: kept as 0 and counted, except on flow events,
        # whose `dur` nothing reads.
        self.dur_ns = _ns_values([e.dur for e in evs], bad, kinds[self.order] != FLOWS)
        self.raws = _pick(raws, self.order)
        self.names, self.cats = [e.name for e in evs], [e.cat for e in evs]

    def _sort(self, events: list[_Event], kinds: np.ndarray) -> None:
        self.order = np.argsort(kinds, kind="stable")
        self.bounds = np.concatenate([[0], np.cumsum(np.bincount(kinds, minlength=len(_KINDS)))]).tolist()
        self.events = _pick(events, self.order)

    def part(self, first: int, last: int | None = None, missing_dur: bool = False) -> tuple[list[_Event], dict[str, Any]]:
        """The events of kinds first..last (adjacent in _KINDS) and their columns every table has.
        A missing duration reads 0, or with `missing_dur` null."""
        lo, hi = self.bounds[first], self.bounds[(first if last is None else last) + 1]
        if lo == hi:
            return [], dict.fromkeys(("ts_ns", "dur_ns", "args", "name", "cat"), [])
        (ts, no_ts), (dur, no_dur) = self.ts_ns, self.dur_ns    # a missing value's ns are 0
        return self.events[lo:hi], {
            "ts_ns": _arrow_ns(ts[lo:hi], None if no_ts is None else no_ts[lo:hi]),
            "dur_ns": _arrow_ns(dur[lo:hi], None if no_dur is None or not missing_dur else no_dur[lo:hi]),
            "args": _raw_column(self.raws[lo:hi], self.bad), "name": pa.array(self.names[lo:hi], S),
            "cat": pa.array(self.cats[lo:hi], S),
        }

    def raws_of(self, kind: int) -> list[msgspec.Raw]:
        """The raw args of the events of `kind`, in the order part() gives them."""
        return self.raws[self.bounds[kind]:self.bounds[kind + 1]]

    def host_ids(self, kind: int) -> tuple[list[int | None], list[int | None]]:
        """The pid and tid columns of a host table (RUNTIME or CPU)."""
        lo, hi = self.bounds[kind] - self.bounds[RUNTIME], self.bounds[kind + 1] - self.bounds[RUNTIME]
        return _host_ids(self.pids[lo:hi], self.bad), _host_ids(self.tids[lo:hi], self.bad)


def _pick(items: list[Any], order: np.ndarray) -> list[Any]:
    """items[i] for each i of `order`, in one C call."""
    if len(order) < 2:
        return [items[i] for i in order.tolist()]
    return list(itemgetter(*order.tolist())(items))


def _ext(a: _Args) -> int | None:
    return a.external_id if a.external_id is not None else a.external_id_2021


def _exts(evs: list[_Event]) -> list[int | None]:
    """_ext of each event's args; the 2021 key looked at only where today's is missing."""
    ids = [e.args.external_id for e in evs]
    if None in ids:
        ids = [i if i is not None else e.args.external_id_2021 for i, e in zip(ids, evs, strict=True)]
    return ids


def _gpu_columns(chunk: _Chunk, first: int, last: int | None = None) -> tuple[list[_Event], dict[str, Any]]:
    # Kineto puts the device and stream in args and as the GPU row's pid/tid; the 2021 schema
    # only in pid/tid.
    evs, cols = chunk.part(first, last)
    return evs, {
        **cols,
        "external_id": _exts(evs),
        "device": [e.args.device if e.args.device is not None else _int_or_none(e.pid) for e in evs],
        "stream": [st if isinstance(st := e.args.stream, int) else _stream_or_tid(st, e.tid, chunk.bad) for e in evs],
        "correlation": [e.args.correlation for e in evs],
    }


def _stream_or_tid(stream: str | None, tid: int | str | None, bad: Counter[str]) -> int | None:
    """A GPU event's stream written as text (ROCm: "0x0", a runtime call's as well, which no column
    keeps), else the GPU row's tid, as the 2021 schema gives it. Text that is no number is counted."""
    if stream is not None:
        try:
            return int(stream, 16) if stream[:2] in ("0x", "0X") else int(stream)
        except ValueError:
            bad["typed"] += 1
    return _int_or_none(tid)


def _host_columns(chunk: _Chunk, kind: int) -> tuple[list[_Event], dict[str, Any]]:
    evs, cols = chunk.part(kind)
    pids, tids = chunk.host_ids(kind)
    return evs, {**cols, "external_id": _exts(evs), "pid": pids, "tid": tids}


def _table(name: str, bad: Counter[str], cols: dict[str, Any]) -> pa.Table:
    schema = SCHEMAS[name]
    if not len(cols[schema[0].name]):
        return _empty_table(name)   # most of a small file's tables: ~40 µs each to build
    return pa.table({f.name: _column(cols[f.name], f.type, bad) for f in schema}, schema=schema)


@cache
def _empty_table(name: str) -> pa.Table:
    """Built on first use, not at import: an Arrow array built before `diag` keeps pandas out
    (diag/runtime/no_pandas.py) would import pandas."""
    return SCHEMAS[name].empty_table()


_INT_RANGES = {I64: (-(2**63), 2**63 - 1), I32: (-(2**31), 2**31 - 1)}


def _column(values: list[Any] | pa.Array, typ: pa.DataType, bad: Counter[str]) -> pa.Array:
    """A column of `typ`; an integer out of its range (a 2^70 id in a typed key) is typed null,
    kept only in the raw args, and counted."""
    if isinstance(values, pa.Array):
        return values if values.type == typ else values.cast(typ)
    try:
        return pa.array(values, type=typ)
    except (OverflowError, pa.ArrowInvalid):
        if typ not in _INT_RANGES:
            raise
    lo, hi = _INT_RANGES[typ]
    fit = [v if v is None or lo <= v <= hi else None for v in values]
    bad["typed"] += sum(1 for v, f in zip(values, fit, strict=True) if v is not None and f is None)
    return pa.array(fit, type=typ)


def _collective_rows(source: str, evs: list[_Event], raws: list[msgspec.Raw], bad: Counter[str]) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {f.name: [] for f in SCHEMAS["collective_args"]}
    for e, raw in zip(evs, raws, strict=True):
        a = e.args
        if a.collective is None:
            continue
        c = _collective(raw, bad)
        ranks, truncated = parse_pg_ranks(_raw_str(c.pg_ranks), c.group_size, c.rank_start, c.rank_stride)
        row = {
            "source": source, "external_id": _ext(a), "correlation": a.correlation if source == "kernel" else None,
            "tid": _host_id(e.tid) if source == "cpu_op" else None, "ts_ns": e.ts,
            "dur_ns": max(e.dur or 0, 0),
            "collective": a.collective, "pg_name": c.pg_name, "pg_desc": c.pg_desc, "pg_ranks": ranks,
            "pg_ranks_truncated": truncated, "group_size": c.group_size, "in_nelems": c.in_nelems,
            "out_nelems": c.out_nelems, "dtype": c.dtype, "seq": c.seq, "global_rank_start": c.rank_start,
            "global_rank_stride": c.rank_stride, "in_split": c.in_split, "out_split": c.out_split,
            "peer_rank": _peer(a.collective, c, ranks),
        }
        for k, col in rows.items():
            col.append(row[k])
    return rows


def _peer(collective: str, c: _Collective, ranks: list[int] | None) -> int | None:
    """The global rank on the other side of a send/recv."""
    kind = collective.lower()
    if "send" not in kind and "recv" not in kind:
        return None
    direct = c.dst_rank if "send" in kind else c.src_rank
    if direct is not None:
        return direct
    g = c.peer_group_rank
    return ranks[g] if ranks is not None and g is not None and 0 <= g < len(ranks) else None


def _raw_str(r: msgspec.Raw) -> str | None:
    return bytes(r).decode("utf-8", "replace") if len(r) else None


def _tabulate(events: list[_Event], raws: list[msgspec.Raw], bad: Counter[str]) -> tuple[dict[str, pa.Table], bool]:
    """One chunk's events (and the raw text of their args) → one Arrow table per destination; and
    whether it is the 2021 schema."""
    chunk = _Chunk(events, raws, bad)
    tables: dict[str, pa.Table] = {}

    kernels, kc = _gpu_columns(chunk, KERNELS)
    kc["grid"] = _raw_column([e.args.grid for e in kernels], bad)
    kc["block"] = _raw_column([e.args.block for e in kernels], bad)
    tables["kernels"] = _table("kernels", bad, kc)

    copies, cc = _gpu_columns(chunk, MEMCPY, MEMSET)
    n_memcpy = chunk.bounds[MEMCPY + 1] - chunk.bounds[MEMCPY]
    cc["kind"] = ["memcpy"] * n_memcpy + ["memset"] * (len(copies) - n_memcpy)
    cc["bytes"] = [e.args.bytes for e in copies]
    tables["copies"] = _table("copies", bad, cc)

    tables["gpu_annotations"] = _table("gpu_annotations", bad, _gpu_columns(chunk, GPU_ANN)[1])

    runtime, rc = _host_columns(chunk, RUNTIME)
    rc["correlation"] = [e.args.correlation for e in runtime]
    rc["cbid"] = [e.args.cbid for e in runtime]
    tables["runtime_calls"] = _table("runtime_calls", bad, rc)

    cpu, oc = _host_columns(chunk, CPU)
    oc["seq_num"] = [e.args.seq_num for e in cpu]
    oc["fwd_tid"] = [e.args.fwd_tid for e in cpu]
    oc["input_dims"] = _raw_column([e.args.input_dims for e in cpu], bad)
    oc["input_types"] = _raw_column([e.args.input_types for e in cpu], bad)
    oc["trace_flops"] = [e.args.flops for e in cpu]
    tables["cpu_ops"] = _table("cpu_ops", bad, oc)

    flows, fc = chunk.part(FLOWS)
    tables["flows"] = _table("flows", bad, {
        **fc, "ph": [e.ph for e in flows], "flow_id": [None if e.id is None else str(e.id) for e in flows],
        "pid": _host_ids([e.pid for e in flows], bad), "tid": _host_ids([e.tid for e in flows], bad),
    })
    other, xc = chunk.part(OTHER, missing_dur=True)
    tables["other_events"] = _table("other_events", bad, {
        **xc, "ph": [e.ph for e in other],
        "pid": [None if e.pid is None else str(e.pid) for e in other],
        "tid": [None if e.tid is None else str(e.tid) for e in other],
    })

    coll = _collective_rows("cpu_op", cpu, chunk.raws_of(CPU), bad)
    for k, v in _collective_rows("kernel", kernels, chunk.raws_of(KERNELS), bad).items():
        coll[k].extend(v)
    if coll["source"]:   # most chunks name no collective: their table is the empty one
        coll.update(ts_ns=_ns_array(coll["ts_ns"]), dur_ns=_ns_array(coll["dur_ns"]),
                    in_split=_raw_column(coll["in_split"], bad), out_split=_raw_column(coll["out_split"], bad))
    tables["collective_args"] = _table("collective_args", bad, coll)

    sample = kernels[:1] + runtime[:1] + cpu[:1]
    return tables, any(e.cat in _CATS_2021 for e in sample)


_CATS_2021 = frozenset({"Kernel", "Runtime", "Operator"})


def _tabulate_by_rank(
    events: list[_Event], raws: list[msgspec.Raw], bad: Counter[str], rank_map: RankMap
) -> tuple[dict[str, pa.Table], bool]:
    """_tabulate of a merged file's chunk: each rank's events apart (with the pid they had before
    the merge), every table with a `rank` column."""
    groups: dict[int, tuple[list[_Event], list[msgspec.Raw]]] = {}
    for ev, raw in zip(events, raws, strict=True):
        rank, ev.pid = rank_map.place(ev.pid, ev.args.rank)
        evs, rs = groups.setdefault(rank, ([], []))
        evs.append(ev)
        rs.append(raw)
    parts = [(rank, *_tabulate(evs, rs, bad)) for rank, (evs, rs) in groups.items()] or \
        [(rank_map.ranks[0], *_tabulate([], [], bad))]
    out = {name: pa.concat_tables([t[name].append_column("rank", pa.array([rank] * t[name].num_rows, pa.int32()))
                                   for rank, t, _ in parts])
           for name in parts[0][1]}
    return out, any(era for _, _, era in parts)


def _extent(tables: dict[str, pa.Table]) -> tuple[int | None, int | None]:
    """Earliest start and latest end over the timed events (metadata rows carry no real time).

    In NumPy: their times are never null (an event without a start is `other`, _kinds; a missing
    duration reads 0, _Chunk.part), and so the parse imports no pyarrow.compute, whose ~35 ms
    import was on the path before the parse's fork and in its child (read_ahead.begin)."""
    first: int | None = None
    last: int | None = None
    for name in ("cpu_ops", "runtime_calls", "kernels", "copies", "gpu_annotations"):
        t = tables[name]
        if t.num_rows == 0:
            continue
        ts, dur = t["ts_ns"], t["dur_ns"]
        if ts.null_count or dur.null_count:
            raise AssertionError(f"{name}: a timed event without a time")
        start = ts.to_numpy()
        lo, hi = int(start.min()), int((start + dur.to_numpy()).max())
        first = lo if first is None else min(first, lo)
        last = hi if last is None else max(last, hi)
    return first, last


def _json_or_none(path: str, key: str, r: msgspec.Raw) -> Any:
    if not len(r):
        return None
    try:
        return msgspec.json.decode(r)
    except msgspec.DecodeError as e:   # the document's pass skips over a value's text (UTF-8 included)
        raise BadInput(path, f"{key}: {e}") from None


_INT = re.compile(r"-?\d+")


def parse_pg_ranks(
    text: str | None, group_size: int | None, start: int | None, stride: int | None
) -> tuple[list[int] | None, bool]:
    """Parse "Process Group Ranks": a list, or its JSON text "[0, 1, 2]", or the truncated form
    "[0, 1, ..., 63]" that PyTorch writes for large groups.

    The truncated form is expanded when it is unambiguous: an arithmetic progression given by
    the listed head (or by "Global rank start"/"Global rank stride") that reaches the listed tail
    in exactly "Group size" members. Otherwise the listed ranks are kept and flagged truncated.
    """
    if text is None:
        return None, False
    body = text.strip()
    if body.startswith('"'):  # the list was written as a JSON string
        try:
            body = msgspec.json.decode(body.encode())
        except msgspec.DecodeError:
            return None, False
        body = str(body).strip()
    if "..." not in body:
        return [int(x) for x in _INT.findall(body)], False
    head_text, _, tail_text = body.partition("...")
    head = [int(x) for x in _INT.findall(head_text)]
    tail = [int(x) for x in _INT.findall(tail_text)]
    first = head[0] if head else start
    step = head[1] - head[0] if len(head) >= 2 else stride
    if first is None or not step or not tail or not group_size:
        return head + tail, True
    expanded = [first + i * step for i in range(group_size)]
    if expanded[: len(head)] == head and expanded[-len(tail) :] == tail:
        return expanded, False
    return head + tail, True


def rank_from_distributed_info(info: Any) -> tuple[int | None, int | None, str | None]:
    """(rank, world_size, backend) from distributedInfo, each None when absent."""
    if not isinstance(info, dict):
        return None, None, None
    rank = info.get("rank")
    world = info.get("world_size")
    return (
        rank if isinstance(rank, int) else None,
        world if isinstance(world, int) else None,
        info.get("backend") if isinstance(info.get("backend"), str) else None,
    )


def device_props_for(props: Any, kernel_devices: Sequence[int | None]) -> dict[str, Any] | None:
    if not isinstance(props, list):
        return None
    by_id = {p.get("id"): p for p in props if isinstance(p, dict)}
    for d in kernel_devices:
        if d in by_id:
            return by_id[d]
    return props[0] if props and isinstance(props[0], dict) else None
