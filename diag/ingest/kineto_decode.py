"""Decoding a Kineto document with msgspec: the typed event and `args` structs (each field costs
every event, so they are few and in the order Kineto writes them), the head (metadata before the
events), the events of a piece typed one bad event at a time, salvage of a damaged file, and the
metadata's own fields (process-group ranks, distributedInfo, deviceProperties). Part of the Kineto
parse (diag/ingest/kineto.py is its entry)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import msgspec

from diag.runtime.errors import BadInput

if TYPE_CHECKING:
    pass



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

_KERNEL_CATS = frozenset({"kernel", "Kernel"})
_MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy"})
_MEMSET_CATS = frozenset({"gpu_memset", "Memset"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver"})
_FLOW_PHASES = frozenset({"s", "f", "t"})
# Host-side 'X' categories that are not CPU spans: they go to other_events.
_NOT_CPU_X = frozenset({"Trace", "cuda_sync", "cuda_profiler_range"})


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
