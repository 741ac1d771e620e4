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

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

if TYPE_CHECKING:
    from diag.ingest.merged import RankMap
from diag.ingest import kineto_split
from diag.ingest.kineto_decode import _decode_head, _Head, _json_or_none
from diag.ingest.kineto_split import DEFAULT_CHUNK_BYTES, _chunks, _span, _Split
from diag.ingest.kineto_tabulate import KinetoFile


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
    forked = kineto_split._fork_back(path, memoryview(data), *seeming, DEFAULT_CHUNK_BYTES, release, where) \
        if seeming is not None and seeming[1] - seeming[0] >= kineto_split.SPLIT_BYTES else None
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
    if forked is None and split and end - pos >= kineto_split.SPLIT_BYTES:
        forked = kineto_split._fork_back(path, memoryview(decoded), pos, end, DEFAULT_CHUNK_BYTES, release, where)
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
