"""A Kineto document's events in bounded chunks, and the split parse: a file of SPLIT_BYTES or more
of events is parsed by this process and a forked child at once (diag/ingest/forked.py), each
claiming segments in file order. Part of the Kineto parse (diag/ingest/kineto.py is its entry)."""

from __future__ import annotations

import gc
import re
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from contextlib import closing, contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa

from diag.runtime.errors import BadInput

if TYPE_CHECKING:
    from diag.ingest.forked import Claims, Part, SecondHalf
    from diag.ingest.merged import RankMap
from diag.ingest.kineto_decode import (
    _BadEvent,
    _raw_args_decoder,
    _typed_events,
)
from diag.ingest.kineto_tabulate import (
    _MAX_US,
    KinetoFile,
    _is_utf8,
    _mend_utf8,
    _OutOfRange,
    _tabulate,
    _tabulate_by_rank,
    value_warnings,
)

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
    return _past_blanks(data, base + 1, end), end   # from after the opening bracket


_BLANK = np.zeros(256, dtype=bool)
_BLANK[list(b" \t\r\n")] = True   # JSON's whitespace


def _past_blanks(data: Any, pos: int, end: int, window: int = 1 << 20) -> int:
    """The first position in data[pos:end] that is not JSON whitespace (`end` if none), looked for
    a window of bytes at a time in NumPy: byte by byte in Python, the 300 MB of blanks a 1 MB gzip
    can hold took 33 s (issue 40, item 7)."""
    while pos < end:
        stop = min(end, pos + window)
        blank = _BLANK[np.frombuffer(data, np.uint8, count=stop - pos, offset=pos)]
        if not blank.all():
            return pos + int(np.argmin(blank))
        pos = stop
    return end


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
