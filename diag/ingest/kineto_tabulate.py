"""Decoded Kineto events → Arrow tables shaped like diag/sql/schema.sql: each event's kind, its
columns typed and range-checked (a value that does not fit is a counted warning, never a lost
column), raw JSON columns kept byte for byte, collective rows, and the file's counts
(KinetoFile). Part of the Kineto parse (diag/ingest/kineto.py is its entry)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from functools import cache, lru_cache
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from diag.ingest.merged import RankMap
from diag.ingest.kineto_decode import (
    _FLOW_PHASES,
    _KERNEL_CATS,
    _MEMCPY_CATS,
    _MEMSET_CATS,
    _NOT_CPU_X,
    _RUNTIME_CATS,
    Number,
    _Args,
    _Collective,
    _collective,
    _Event,
    parse_pg_ranks,
)


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


_STREAM = "stream "


def _host_id(v: int | str | None, bad: Counter[str] | None = None) -> int | None:
    """A host pid or tid as an integer. Kineto before torch 1.10 wrote numbers as text ("tid":
    "5555") and a GPU stream's tid as "stream 7" (its kernels' flow ends carry it): the number, as
    later Kineto writes it (7), neither a name nor counted. Some writers name a thread ("python",
    "pt_autograd_0") where Kineto writes its number: each name gets its own id, the same in every
    chunk and file (a hash), negative so that it never meets a real one; counted."""
    n = _int_or_none(v)
    if n is None and isinstance(v, str) and v.startswith(_STREAM):
        n = _int_or_none(v.removeprefix(_STREAM))
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
        "no_dur": "complete ('X') events had no 'dur' (null or missing); kept with duration 0",
        "no_ts": "complete ('X') events had no 'ts' (null or missing); kept aside (other_events), off the timeline",
        "no_span": "events had a 'ph' that is not a complete span ('B'/'E' halves, or a letter such as 'x'); "
                   "kept aside (other_events), off the timeline",
        "no_cat": "complete ('X') events had no 'cat'; read as CPU ops",
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
# The Chrome trace format's phases of events diag sets aside knowingly: complete events of a category
# no table reads (cuda_sync, Trace), instants, counters, metadata, async and object events, marks,
# contexts. 'B'/'E' (a span in two events) and any other letter ('x') are counted when set aside (no_span).
_OTHER_PHASES = frozenset({"X", "i", "I", "C", "M", "b", "n", "e", "S", "T", "p", "F", "N", "O", "D", "P", "R", "c",
                           "(", ")", *_FLOW_PHASES})


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
    if (no_ts := (kinds <= CPU) & missing_ts).any():
        bad["no_ts"] += int(no_ts.sum())
        kinds[no_ts] = OTHER
    # Few events are "other" (metadata, instants, counters): looked at one by one.
    bad["no_span"] += sum(events[i].ph not in _OTHER_PHASES for i in np.flatnonzero(kinds == OTHER).tolist()
                          if events[i].ph)
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
        # The timed kinds come first in this order: their missing durations read 0, a missing cat CPU.
        timed = self.bounds[CPU + 1]
        if self.dur_ns[1] is not None:
            bad["no_dur"] += int(self.dur_ns[1][:timed].sum())
        bad["no_cat"] += self.cats[:timed].count(None)

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
