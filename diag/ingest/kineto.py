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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from diag.errors import BadInput

Number = int | float


class _Event(msgspec.Struct):
    ph: str = ""
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: Number | None = None
    dur: Number | None = None
    id: int | str | None = None
    bp: str | None = None
    args: msgspec.Raw = msgspec.Raw(b"")


class _Doc(msgspec.Struct):
    traceEvents: list[_Event] = msgspec.field(default_factory=list)
    schemaVersion: int | None = None
    deviceProperties: msgspec.Raw = msgspec.Raw(b"")
    distributedInfo: msgspec.Raw = msgspec.Raw(b"")
    displayTimeUnit: str | None = None
    baseTimeNanoseconds: int | None = None


_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct):
    """The `args` keys diag types. Unknown keys are skipped by the decoder (and kept in raw text)."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_2021: int | None = msgspec.field(default=None, name="external id")
    correlation: int | None = None
    device: int | None = None
    stream: int | None = None
    cbid: int | None = None
    bytes: int | None = None
    seq_num: int | None = msgspec.field(default=None, name="Sequence number")
    fwd_tid: int | None = msgspec.field(default=None, name="Fwd thread id")
    flops: Number | None = None
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    grid: msgspec.Raw = _NO_RAW
    block: msgspec.Raw = _NO_RAW
    # NCCL collective arguments (record_param_comms, and kernels in newer Kineto).
    collective: str | None = msgspec.field(default=None, name="Collective name")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Process Group Ranks")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    seq: int | None = msgspec.field(default=None, name="Seq")
    rank_start: int | None = msgspec.field(default=None, name="Global rank start")
    rank_stride: int | None = msgspec.field(default=None, name="Global rank stride")
    in_split: msgspec.Raw = msgspec.field(default=_NO_RAW, name="In split size")
    out_split: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Out split size")


_doc_decoder = msgspec.json.Decoder(_Doc)
_args_decoder = msgspec.json.Decoder(_Args)
_EMPTY_ARGS = _Args()

_KERNEL_CATS = frozenset({"kernel", "Kernel"})
_MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy"})
_MEMSET_CATS = frozenset({"gpu_memset", "Memset"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver"})
_FLOW_PHASES = frozenset({"s", "f", "t"})
# Host-side 'X' categories that are not CPU spans: they go to other_events.
_NOT_CPU_X = frozenset({"Trace", "cuda_sync", "cuda_profiler_range"})


@dataclass(frozen=True)
class KinetoParse:
    """One file, parsed. Tables carry every column of their schema table except file_id and rank."""

    tables: dict[str, pa.Table]
    n_events: int
    schema_version: int | None
    schema_era: str
    time_unit: str | None
    base_time_ns: int | None
    device_props: Any
    distributed_info: Any
    first_ts_ns: int | None
    last_ts_ns: int | None
    partial: bool
    damage_offset: int | None
    warnings: tuple[str, ...] = field(default=())

    @property
    def has_gpu(self) -> bool:
        return self.tables["kernels"].num_rows > 0 or self.tables["copies"].num_rows > 0


def parse_kineto(path: str, data: bytes, salvage: bool = False) -> KinetoParse:
    doc, damage = _decode(path, data, salvage)
    warnings: list[str] = []
    if damage is not None:
        warnings.append(f"damaged at byte {damage}: kept the {len(doc.traceEvents)} complete events before it")
    return _tabulate(path, doc, warnings, damage)


# --------------------------------------------------------------------------- decoding


def _decode(path: str, data: bytes, salvage: bool) -> tuple[_Doc, int | None]:
    try:
        return _doc_decoder.decode(data), None
    except msgspec.ValidationError as e:
        raise BadInput(path, f"not a Kineto trace: {e}") from None
    except RecursionError:
        raise BadInput(path, "JSON nested too deeply to be a Kineto trace") from None
    except msgspec.DecodeError as e:
        offset = _error_offset(e, len(data))
        if not salvage:
            raise BadInput(path, f"{_describe(e, data, offset)}; --salvage keeps the events before it", offset) from None
        doc = _salvage(path, data, offset)
        return doc, offset


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


def _salvage(path: str, data: bytes, offset: int) -> _Doc:
    start = data.find(b'"traceEvents"')
    if start < 0 or start > offset:
        raise BadInput(path, "damaged before any trace event; nothing to salvage", offset)
    ends = [m.start() for m in _ELEMENT_END.finditer(data, start, offset)]
    for end in reversed(ends[-64:]):
        try:
            return _doc_decoder.decode(data[: end + 1] + b"]}")
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
    raise BadInput(path, "damaged before the first complete trace event; nothing to salvage", offset)


# --------------------------------------------------------------------------- tabulating


def _ns_array(values: Sequence[Number | None]) -> pa.Array:
    """µs (as Kineto writes them, up to 3 decimals) → integer ns, vectorized.

    The whole µs and the fraction are scaled apart: at absolute epoch µs (~1.7e15) a float64 has
    0.25 µs of resolution, and multiplying by 1000 first would lose a further factor of 1000.
    Integer µs (older traces) are exact either way.
    """
    a = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    whole = np.floor(a)
    ns = whole * 1000.0 + np.rint((a - whole) * 1000.0)
    valid = np.isfinite(a)
    out = np.where(valid, ns, 0).astype(np.int64)
    if not valid.all():
        return pa.array(out, mask=~valid)
    return pa.array(out)


def _int_or_none(v: int | str | None) -> int | None:
    if type(v) is int:
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _text(r: msgspec.Raw) -> bytes | None:
    return bytes(r) if len(r) else None


def _schema(*cols: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema(list(cols))


# Raw JSON columns travel as binary and become JSON text in DuckDB (store.py), where the UTF-8
# check is vectorized instead of one Python decode per event.
S, BIN, I64, I32, F64, B = pa.string(), pa.binary(), pa.int64(), pa.int32(), pa.float64(), pa.bool_()
SCHEMAS: dict[str, pa.Schema] = {
    "cpu_ops": _schema(
        ("cat", S), ("name", S), ("pid", I64), ("tid", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("external_id", I64), ("seq_num", I64), ("fwd_tid", I64), ("input_dims", BIN), ("input_types", BIN),
        ("trace_flops", F64), ("args", BIN),
    ),
    "gpu_annotations": _schema(
        ("name", S), ("device", I32), ("stream", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("external_id", I64), ("args", BIN),
    ),
    "runtime_calls": _schema(
        ("cat", S), ("name", S), ("pid", I64), ("tid", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("correlation", I64), ("external_id", I64), ("cbid", I32), ("args", BIN),
    ),
    "kernels": _schema(
        ("name", S), ("device", I32), ("stream", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("correlation", I64), ("external_id", I64), ("grid", BIN), ("block", BIN), ("args", BIN),
    ),
    "copies": _schema(
        ("kind", S), ("name", S), ("device", I32), ("stream", I64), ("ts_ns", I64), ("dur_ns", I64),
        ("correlation", I64), ("external_id", I64), ("bytes", I64), ("args", BIN),
    ),
    "flows": _schema(
        ("cat", S), ("name", S), ("ph", S), ("flow_id", S), ("pid", I64), ("tid", I64), ("ts_ns", I64),
        ("args", BIN),
    ),
    "collective_args": _schema(
        ("source", S), ("external_id", I64), ("correlation", I64), ("tid", I64), ("ts_ns", I64),
        ("dur_ns", I64), ("collective", S), ("pg_name", S), ("pg_desc", S),
        ("pg_ranks", pa.list_(I32)), ("pg_ranks_truncated", B), ("group_size", I32), ("in_nelems", I64),
        ("out_nelems", I64), ("dtype", S), ("seq", I64), ("global_rank_start", I32),
        ("global_rank_stride", I32), ("in_split", BIN), ("out_split", BIN),
    ),
    "other_events": _schema(
        ("ph", S), ("cat", S), ("name", S), ("pid", S), ("tid", S), ("ts_ns", I64), ("dur_ns", I64),
        ("args", BIN),
    ),
}
# The tables that hold events (collective_args is derived from them, not counted).
EVENT_TABLES = ("cpu_ops", "gpu_annotations", "runtime_calls", "kernels", "copies", "flows", "other_events")
JSON_COLUMNS = frozenset({"args", "input_dims", "input_types", "grid", "block", "in_split", "out_split"})


def _decode_args(raws: Sequence[msgspec.Raw], bad: list[int]) -> list[_Args]:
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
            bad[0] += 1
            out.append(_lenient_args(raw))
    return out


def _lenient_args(raw: msgspec.Raw) -> _Args:
    obj = msgspec.json.decode(raw)
    if not isinstance(obj, dict):
        return _EMPTY_ARGS
    kept: dict[str, Any] = {}
    for attr, key in zip(_Args.__struct_fields__, _Args.__struct_encode_fields__, strict=True):
        if key in obj:
            try:
                one = _args_decoder.decode(msgspec.json.encode({key: obj[key]}))
            except msgspec.ValidationError:
                continue
            kept[attr] = getattr(one, attr)
    return msgspec.structs.replace(_EMPTY_ARGS, **kept)


class _Routed:
    """Events of one file, sorted by the table they belong to."""

    def __init__(self) -> None:
        self.kernels: list[_Event] = []
        self.memcpy: list[_Event] = []
        self.memset: list[_Event] = []
        self.gpu_ann: list[_Event] = []
        self.runtime: list[_Event] = []
        self.cpu: list[_Event] = []
        self.flows: list[_Event] = []
        self.other: list[_Event] = []


def _route(events: list[_Event]) -> _Routed:
    r = _Routed()
    for ev in events:
        ph, cat = ev.ph, ev.cat
        if ph == "X" and ev.ts is not None and cat not in _NOT_CPU_X:
            if cat in _KERNEL_CATS:
                r.kernels.append(ev)
            elif cat in _MEMCPY_CATS:
                r.memcpy.append(ev)
            elif cat in _MEMSET_CATS:
                r.memset.append(ev)
            elif cat == "gpu_user_annotation":
                r.gpu_ann.append(ev)
            elif _int_or_none(ev.pid) is None or _int_or_none(ev.tid) is None:
                r.other.append(ev)
            elif cat in _RUNTIME_CATS or (cat or "").endswith(("_runtime", "_driver")):
                r.runtime.append(ev)
            else:
                r.cpu.append(ev)
        elif ph in _FLOW_PHASES:
            r.flows.append(ev)
        else:
            r.other.append(ev)
    return r


def _ext(a: _Args) -> int | None:
    return a.external_id if a.external_id is not None else a.external_id_2021


def _common(evs: list[_Event], args: list[_Args]) -> dict[str, Any]:
    return {
        "name": [e.name for e in evs],
        "ts_ns": _ns_array([e.ts for e in evs]),
        "dur_ns": _ns_array([e.dur or 0 for e in evs]),
        "external_id": [_ext(a) for a in args],
        "args": [_text(e.args) for e in evs],
    }


def _gpu_columns(evs: list[_Event], args: list[_Args]) -> dict[str, Any]:
    # Kineto puts the device and stream in args and as the GPU row's pid/tid; the 2021 schema
    # only in pid/tid.
    return {
        **_common(evs, args),
        "device": [a.device if a.device is not None else _int_or_none(e.pid) for e, a in zip(evs, args, strict=True)],
        "stream": [a.stream if a.stream is not None else _int_or_none(e.tid) for e, a in zip(evs, args, strict=True)],
        "correlation": [a.correlation for a in args],
    }


def _host_columns(evs: list[_Event], args: list[_Args]) -> dict[str, Any]:
    return {
        **_common(evs, args),
        "cat": [e.cat for e in evs],
        "pid": [_int_or_none(e.pid) for e in evs],
        "tid": [_int_or_none(e.tid) for e in evs],
    }


def _table(name: str, cols: dict[str, Any]) -> pa.Table:
    schema = SCHEMAS[name]
    return pa.table(
        {f.name: cols[f.name] if isinstance(cols[f.name], pa.Array) else pa.array(cols[f.name], type=f.type)
         for f in schema},
        schema=schema,
    )


def _collective_rows(source: str, evs: list[_Event], args: list[_Args]) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {f.name: [] for f in SCHEMAS["collective_args"]}
    for e, a in zip(evs, args, strict=True):
        if a.collective is None:
            continue
        ranks, truncated = parse_pg_ranks(_raw_str(a.pg_ranks), a.group_size, a.rank_start, a.rank_stride)
        row = {
            "source": source, "external_id": _ext(a), "correlation": a.correlation if source == "kernel" else None,
            "tid": _int_or_none(e.tid) if source == "cpu_op" else None, "ts_ns": e.ts, "dur_ns": e.dur or 0,
            "collective": a.collective, "pg_name": a.pg_name, "pg_desc": a.pg_desc, "pg_ranks": ranks,
            "pg_ranks_truncated": truncated, "group_size": a.group_size, "in_nelems": a.in_nelems,
            "out_nelems": a.out_nelems, "dtype": a.dtype, "seq": a.seq, "global_rank_start": a.rank_start,
            "global_rank_stride": a.rank_stride, "in_split": _text(a.in_split), "out_split": _text(a.out_split),
        }
        for k, col in rows.items():
            col.append(row[k])
    return rows


def _raw_str(r: msgspec.Raw) -> str | None:
    return bytes(r).decode("utf-8", "replace") if len(r) else None


def _tabulate(path: str, doc: _Doc, warnings: list[str], damage: int | None) -> KinetoParse:
    r = _route(doc.traceEvents)
    bad = [0]
    tables: dict[str, pa.Table] = {}

    k_args = _decode_args([e.args for e in r.kernels], bad)
    kc = _gpu_columns(r.kernels, k_args)
    kc["grid"] = [_text(a.grid) for a in k_args]
    kc["block"] = [_text(a.block) for a in k_args]
    tables["kernels"] = _table("kernels", kc)

    copies = r.memcpy + r.memset
    c_args = _decode_args([e.args for e in copies], bad)
    cc = _gpu_columns(copies, c_args)
    cc["kind"] = ["memcpy"] * len(r.memcpy) + ["memset"] * len(r.memset)
    cc["bytes"] = [a.bytes for a in c_args]
    tables["copies"] = _table("copies", cc)

    g_args = _decode_args([e.args for e in r.gpu_ann], bad)
    tables["gpu_annotations"] = _table("gpu_annotations", _gpu_columns(r.gpu_ann, g_args))

    rt_args = _decode_args([e.args for e in r.runtime], bad)
    rc = _host_columns(r.runtime, rt_args)
    rc["correlation"] = [a.correlation for a in rt_args]
    rc["cbid"] = [a.cbid for a in rt_args]
    tables["runtime_calls"] = _table("runtime_calls", rc)

    cpu_args = _decode_args([e.args for e in r.cpu], bad)
    pc = _host_columns(r.cpu, cpu_args)
    pc["seq_num"] = [a.seq_num for a in cpu_args]
    pc["fwd_tid"] = [a.fwd_tid for a in cpu_args]
    pc["input_dims"] = [_text(a.input_dims) for a in cpu_args]
    pc["input_types"] = [_text(a.input_types) for a in cpu_args]
    pc["trace_flops"] = [a.flops for a in cpu_args]
    tables["cpu_ops"] = _table("cpu_ops", pc)

    fl = r.flows
    tables["flows"] = _table("flows", {
        "cat": [e.cat for e in fl], "name": [e.name for e in fl], "ph": [e.ph for e in fl],
        "flow_id": [None if e.id is None else str(e.id) for e in fl],
        "pid": [_int_or_none(e.pid) for e in fl], "tid": [_int_or_none(e.tid) for e in fl],
        "ts_ns": _ns_array([e.ts for e in fl]), "args": [_text(e.args) for e in fl],
    })
    ot = r.other
    tables["other_events"] = _table("other_events", {
        "ph": [e.ph for e in ot], "cat": [e.cat for e in ot], "name": [e.name for e in ot],
        "pid": [None if e.pid is None else str(e.pid) for e in ot],
        "tid": [None if e.tid is None else str(e.tid) for e in ot],
        "ts_ns": _ns_array([e.ts for e in ot]), "dur_ns": _ns_array([e.dur for e in ot]),
        "args": [_text(e.args) for e in ot],
    })

    coll = _collective_rows("cpu_op", r.cpu, cpu_args)
    for k, v in _collective_rows("kernel", r.kernels, k_args).items():
        coll[k].extend(v)
    coll["ts_ns"] = _ns_array(coll["ts_ns"])
    coll["dur_ns"] = _ns_array(coll["dur_ns"])
    tables["collective_args"] = _table("collective_args", coll)

    if bad[0]:
        warnings.append(f"{bad[0]} events had args of an unexpected type; kept raw, typed what fit")
    first, last = _extent(tables)
    era_2021 = any(e.cat in _CATS_2021 for e in r.kernels[:1] + r.runtime[:1] + r.cpu[:1])
    return KinetoParse(
        tables=tables,
        n_events=len(doc.traceEvents),
        schema_version=doc.schemaVersion,
        schema_era="2021" if era_2021 else "current",
        time_unit=doc.displayTimeUnit,
        base_time_ns=doc.baseTimeNanoseconds,
        device_props=_json_or_none(doc.deviceProperties),
        distributed_info=_json_or_none(doc.distributedInfo),
        first_ts_ns=first,
        last_ts_ns=last,
        partial=damage is not None,
        damage_offset=damage,
        warnings=tuple(warnings),
    )


_CATS_2021 = frozenset({"Kernel", "Runtime", "Operator"})


def _extent(tables: dict[str, pa.Table]) -> tuple[int | None, int | None]:
    """Earliest start and latest end over the timed events (metadata rows carry no real time)."""
    first: int | None = None
    last: int | None = None
    for name in ("cpu_ops", "runtime_calls", "kernels", "copies", "gpu_annotations"):
        t = tables[name]
        if t.num_rows == 0:
            continue
        lo = pc.min(t["ts_ns"]).as_py()
        hi = pc.max(pc.add(t["ts_ns"], t["dur_ns"])).as_py()
        first = lo if first is None else min(first, lo)
        last = hi if last is None else max(last, hi)
    return first, last


def _json_or_none(r: msgspec.Raw) -> Any:
    if not len(r):
        return None
    return msgspec.json.decode(r)


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
