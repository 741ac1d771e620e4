"""What the NCCL-side parsers share (diag/ingest/nccl.py dispatches to them): the row type and the
Arrow schema of the `nccl_ops` table (diag/sql/schema.sql), a parse's result, collective-name
normalization, typed and range-checked field reads, and the JSON helpers with their limits.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from decimal import Decimal
from operator import attrgetter

import msgspec
import pyarrow as pa

from diag.runtime.errors import BadInput
from diag.runtime.sanitize import storable

# nccl_ops without file_id and rank, in the order of schema.sql (a test compares the two).
NCCL_OPS_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("record_idx", pa.int64(), nullable=False),
        pa.field("pg_name", pa.string()),
        pa.field("pg_desc", pa.string()),
        pa.field("comm_id", pa.string()),
        pa.field("n_ranks", pa.int32()),
        pa.field("collective", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("p2p_seq", pa.int64()),
        pa.field("in_nelems", pa.int64()),
        pa.field("out_nelems", pa.int64()),
        pa.field("msg_bytes", pa.int64()),
        pa.field("dtype", pa.string()),
        pa.field("state", pa.string()),
        pa.field("start_ns", pa.int64()),
        pa.field("end_ns", pa.int64()),
        pa.field("duration_ns", pa.int64()),
        pa.field("algo_bw_gbps", pa.float64()),
        pa.field("bus_bw_gbps", pa.float64()),
        pa.field("algorithm", pa.string()),
        pa.field("protocol", pa.string()),
        pa.field("n_channels", pa.int32()),
        pa.field("record", pa.string()),  # JSON text; DuckDB casts it into the JSON column
    ]
)


class NcclOp(msgspec.Struct, frozen=True):
    """One operation as a source saw it: an `nccl_ops` row less `file_id`, `rank` and `source` (per file)."""

    record_idx: int
    record: str
    pg_name: str | None = None
    pg_desc: str | None = None
    comm_id: str | None = None
    n_ranks: int | None = None
    collective: str | None = None
    seq: int | None = None
    p2p_seq: int | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    msg_bytes: int | None = None
    dtype: str | None = None
    state: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    duration_ns: int | None = None
    algo_bw_gbps: float | None = None
    bus_bw_gbps: float | None = None
    algorithm: str | None = None
    protocol: str | None = None
    n_channels: int | None = None


class Resume(msgspec.Struct, frozen=True):
    """Where a read of an append-only file (NCCL Inspector) stopped: the byte after its last
    complete record, and what the parser carries to the next read (JSON-able; trace_files.read_state)."""

    offset: int
    state: Mapping[str, object]


class SourceParse(msgspec.Struct, frozen=True):
    """What one parser found: its rows, the rank the file names for itself, and what it had to say.
    `resume`: where to read on from when the file grows (None: the format is read whole)."""

    rows: tuple[NcclOp, ...]
    rank: int | None
    rank_source: str | None  # 'content' | 'filename' | None
    warnings: tuple[str, ...]
    resume: Resume | None = None


class NcclParse(msgspec.Struct, frozen=True):
    """A parsed NCCL-side file. `kind` is the trace_files.kind; `table` has the nccl_ops columns but file_id and rank."""

    kind: str
    rank: int | None
    rank_source: str | None  # 'content' | 'filename' | 'option' | None when no rank is known
    table: pa.Table
    warnings: tuple[str, ...]
    resume: Resume | None = None


def ops_table(rows: Iterable[NcclOp], source: str) -> tuple[pa.Table, list[str]]:
    """The rows as an Arrow table with NCCL_OPS_SCHEMA, and a warning per column that lost values.

    Values read from a file are range-checked as they are read (`Fields`); what the parsers compute
    from them (count × element size, sums of tensor sizes) is checked here against the column type.
    """
    held = rows if isinstance(rows, list | tuple) else list(rows)
    arrays, warnings = [], []
    for field in NCCL_OPS_SCHEMA:
        # One column's values at a time: a million rows' 23 columns as lists at once took 1.1 GB.
        values: list[object] = ([source] * len(held) if field.name == "source" else
                                list(map(attrgetter(field.name), held)))
        if field.name == "record":
            values = [_storable_json(str(v)) for v in values]
        elif field.type == pa.string():   # a lone surrogate from the file has no UTF-8 encoding
            values = [storable(v) if isinstance(v, str) else v for v in values]
        try:
            arrays.append(pa.array(values, field.type))
        except (pa.ArrowInvalid, OverflowError):
            low, high = _INT_RANGE[field.type.bit_width]
            fitting = [v if not isinstance(v, int) or low <= v <= high else None for v in values]
            warnings.append(
                f"{fitting.count(None) - values.count(None)} {field.name} value(s) do not fit {field.type}; left empty"
            )
            arrays.append(pa.array(fitting, field.type))
    return pa.Table.from_arrays(arrays, schema=NCCL_OPS_SCHEMA), warnings


# Source spellings → one name per operation. Keys are lower-case with '_' removed, after
# dropping the variant suffixes below, so `_reduce_scatter_base`, `reduce_scatter_tensor_coalesced`
# (Flight Recorder) and `ReduceScatter` (NCCL) all land on `reducescatter`.
_COLLECTIVE_NAMES = {
    "allreduce": "allreduce",
    "allgather": "allgather",
    "reducescatter": "reducescatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "alltoall",
    "send": "send",
    "recv": "recv",
    # ProcessGroupNCCL runs barrier as a one-element allreduce, and FR names it either way.
    "allreducebarrier": "barrier",
}
_VARIANT_SUFFIX = re.compile(r"(_coalesced|_single|_base|_oop|_into_tensor|_tensor|_v)+$")


def normalize_collective(text: str) -> str:
    """allreduce, allgather, reducescatter, broadcast, reduce, alltoall, send or recv.

    Anything else (barrier, gather, scatter, coalesced, SendRecv ...) keeps its own name in the
    same style (lower case, no underscores); the source's spelling stays in `record`.
    """
    name = _VARIANT_SUFFIX.sub("", text.strip().lower().lstrip("_"))
    key = name.replace("_", "")
    return _COLLECTIVE_NAMES.get(key, key)


_INT_RANGE = {32: (-(2**31), 2**31 - 1), 64: (-(2**63), 2**63 - 1)}
_FLOAT_MAX = sys.float_info.max


class Fields:
    """Typed reads from source records. A value of the wrong type or out of range reads as None
    and is counted, so the file's warnings say how many records lost which field."""

    def __init__(self, counts: object = None) -> None:
        """`counts`: what an earlier read of the same file counted (`counts()`), to go on from."""
        self._unusable: Counter[str] = Counter(counts if isinstance(counts, dict) else {})

    def counts(self) -> dict[str, int]:
        return dict(self._unusable)

    def integer(self, record: Mapping[str, object], key: str, bits: int = 64) -> int | None:
        value = record.get(key)
        if value is None:
            return None
        low, high = _INT_RANGE[bits]
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return value
        self._unusable[key] += 1
        return None

    def unsigned(self, record: Mapping[str, object], key: str) -> int | None:
        """A uint64 such as a communicator hash, which can exceed int64 (printed with %lu)."""
        value = record.get(key)
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64:
            return value
        self._unusable[key] += 1
        return None

    def number(self, record: Mapping[str, object], key: str) -> float | None:
        """A finite number; NaN reads as None, the Inspector's "nan" string too (inspector/json.cc jsonDouble)."""
        value = record.get(key)
        if value is None or value == "nan" or (isinstance(value, float) and math.isnan(value)):
            return None
        if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < _FLOAT_MAX:
            return float(value)
        self._unusable[key] += 1
        return None

    def text(self, record: Mapping[str, object], key: str) -> str | None:
        value = record.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            return value
        self._unusable[key] += 1
        return None

    def mapping(self, record: Mapping[str, object], key: str) -> Mapping[str, object] | None:
        value = record.get(key)
        if value is None:
            return None
        if isinstance(value, dict):
            return value
        self._unusable[key] += 1
        return None

    def unusable(self, key: str) -> None:
        """Count a field the caller found malformed beyond its type (e.g. a ragged list)."""
        self._unusable[key] += 1

    def warnings(self) -> list[str]:
        return [
            f"{count} record(s) had an unusable {key!r} (wrong type or out of range; left empty)"
            for key, count in sorted(self._unusable.items())
        ]


def scaled_ns(value: float | int, ns_per_unit: int) -> int:
    """A time written in µs or ms as integer ns, rounded half-to-even from the value's decimal text.

    Going through `repr` keeps what the writer printed (`1818542.097656` µs → 1818542097.656 ns
    → 1818542098), instead of the binary float's error deciding a tie.
    """
    return round(Decimal(repr(value)) * ns_per_unit)


class JsonLimit(Exception):
    """JSON that stdlib json refuses beyond a syntax error: nested past the recursion limit, or an
    integer longer than Python converts (4300 digits by default, CVE-2020-10735)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def loads(text: str) -> object:
    """stdlib json.loads (exact big integers); its limits raise JsonLimit, syntax errors JSONDecodeError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise JsonLimit("JSON nested too deeply to be an NCCL-side trace") from None
    except json.JSONDecodeError:
        raise
    except ValueError:   # only the integer-digits limit: a syntax error is the subclass above
        raise JsonLimit(f"an integer of more than {sys.get_int_max_str_digits()} digits") from None


# A UTF-16 surrogate written as a JSON escape: DuckDB's JSON refuses one that is not half of a pair.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _storable_json(text: str) -> str:
    """A record kept as the file wrote it (Inspector's line), unless it escapes a surrogate: then
    decoded and written again, a lone one as U+FFFD (pairs decode to their character)."""
    return record_json(json.loads(text)) if _SURROGATE_ESCAPE.search(text) else text


def record_json(record: object) -> str:
    """The source record verbatim as compact JSON; big integers stay exact (stdlib json), a lone
    surrogate (a `\\ud800` escape in the file) U+FFFD, which DuckDB's JSON accepts."""
    return storable(json.dumps(record, separators=(",", ":"), ensure_ascii=False))


def decode_text(path: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(path, f"not UTF-8 text ({e.reason})", e.start) from None


def byte_offset(text: str, char_index: int) -> int:
    """Byte offset in the UTF-8 file of a character index into its decoded text."""
    return len(text[:char_index].encode("utf-8"))


def single_rank(ranks: Iterable[int], what: str) -> tuple[int | None, list[str]]:
    """The rank a file's records agree on, or None with a warning when they name several."""
    distinct = sorted(set(ranks))
    if len(distinct) == 1:
        return distinct[0], []
    if not distinct:
        return None, []
    shown = ", ".join(str(r) for r in distinct[:8]) + (", ..." if len(distinct) > 8 else "")
    return None, [f"records name {len(distinct)} different {what} ({shown}); the file's rank is left empty"]
