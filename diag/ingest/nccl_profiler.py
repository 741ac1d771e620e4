"""NCCL example profiler plugin dumps → nccl_ops rows.

At communicator finalize the example plugin (NVIDIA/nccl ext-profiler/example: plugin.cc
`exampleProfilerFinalize`, print_event.cc) writes `<NCCL_PROFILE_DUMP_FILE>_<commHash>_<rank>.json`:
"[\\n", one Chrome-trace async event per line, then "{}]\\n". A span is a "b" and an "e" event with the
same name, cat and id, printed nested, outermost first:

    {"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 0, "pid": 4242, "tid": 1, "ts": 1234.567890,
     "args": {"SeqNum": 0, "CommHash": 12715772615376301750, "Rank": 0, "Count": 1048576,
              "Datatype": "ncclFloat32", "Algorithm": "RING", "Protocol": "SIMPLE", "nChannels": 4}},
    {"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 0, "pid": 4242, "tid": 1, "ts": 1300.123456},

GROUP_API is ncclGroupStart..End; COLL_API / P2P_API the ncclAllReduce / ncclSend call;
KERNEL_LAUNCH the launch; COLL and P2P the operations NCCL runs (task events); inside those GPU
(KernelCh, one per channel), PROXY and NET (proxy progress, network steps); PROXY Idle / Sleep /
Append the proxy thread; CE_COLL a copy-engine collective. COLL, P2P and CE_COLL spans become rows,
one each; the other events describe parts of them and are counted in a warning.

Clock: ts is µs (printed with %f) on CLOCK_MONOTONIC since the plugin's first init in the process
(`gettime() - startTime`); 0.000000 means the plugin never set that time. For a row:
- start_ns = begin ts × 1000: the task event's start, on the host as NCCL enqueues the operation.
- end_ns = end ts × 1000: when its last channel and proxy op completed (plugin.cc `updateEvent`).
- duration_ns = end_ns - start_ns.
- comm_id = pg_name = CommHash as "0x%x", the Inspector's spelling of the same communicator hash.
- seq = SeqNum (COLL); in_nelems / out_nelems from Count, NCCL's per-rank count (send side;
  receive side for ReduceScatter and Recv); msg_bytes = Count × size of Datatype.
- algorithm, protocol; n_channels = nChannels (nMaxChannels in older plugins).
Rank: args.Rank is the rank within the communicator; it is the file's rank when all rows agree,
else (no rows name one) the rank ending the file name.

Parsing is lenient, at the token level: older plugins print pointers and datatypes bare
(`"Stream": 0x262ca50`, `"datatype": ncclFloat32`) and %f can print `nan` or `inf`, so bare words
that are not JSON literals are quoted before the stdlib parser (exact big integers) reads the text.
A dump cut off between events (no closing "]") is read up to the cut, with a warning; one cut
inside an event is refused.
"""

from __future__ import annotations

import json
import os
import re
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Mapping

from diag.ingest.nccl_rows import (
    Fields,
    JsonLimit,
    NcclOp,
    SourceParse,
    byte_offset,
    decode_text,
    loads,
    normalize_collective,
    record_json,
    scaled_ns,
    single_rank,
)
from diag.runtime.errors import BadInput

_TOKEN = re.compile(
    r"(?P<space>\s+)"
    r'|(?P<string>"[^"\\]*(?:\\.[^"\\]*)*")'
    r"|(?P<punct>[\[\]{}:,])"
    r'|(?P<bare>[^\s\[\]{}:,"]+)'
    r'|(?P<unclosed>")'
)
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_JSON_LITERALS = frozenset({"true", "false", "null"})

_ROW_CATEGORIES = frozenset({"COLL", "P2P", "CE_COLL"})
# Bytes per element by NCCL's datatype names (nccl.h ncclDataType_t; inspector.cc lists the same).
_NCCL_DTYPE_BYTES = {
    "ncclInt8": 1, "ncclUint8": 1, "ncclFloat8e4m3": 1, "ncclFloat8e5m2": 1,
    "ncclFloat16": 2, "ncclBfloat16": 2,
    "ncclInt32": 4, "ncclUint32": 4, "ncclFloat32": 4,
    "ncclInt64": 8, "ncclUint64": 8, "ncclFloat64": 8,
}  # fmt: skip
# Which side NCCL's count describes: (input, output), for the collectives where it is the whole buffer.
_COUNT_SIDES = {
    "allreduce": (True, True),
    "broadcast": (True, True),
    "reduce": (True, True),
    "allgather": (True, False),
    "reducescatter": (False, True),
    "send": (True, False),
    "recv": (False, True),
}
_RANK_IN_NAME = re.compile(r"_\d+_(\d+)\.json$")  # <prefix>_<commHash>_<rank>.json

Event = Mapping[str, object]


def parse(path: str, data: bytes) -> SourceParse:
    document, warnings = loads_lenient(path, decode_text(path, data))
    if not isinstance(document, list):
        raise BadInput(path, "an NCCL profiler dump is a JSON array of events", 0)
    if document and document[-1] == {}:
        document = document[:-1]  # the plugin's closing "{}]"
    fields = Fields()
    begins, ends, malformed, unmatched_ends = _pair_spans(document)
    rows: list[NcclOp] = []
    comm_ranks: list[int] = []
    other = Counter[str]()
    for idx, begin in begins:
        category = str(begin["cat"])
        if category not in _ROW_CATEGORIES:
            other[category] += 1
            continue
        args = fields.mapping(begin, "args") or {}
        rows.append(_op(idx, begin, ends.get(idx), args, fields))
        comm_rank = fields.integer(args, "Rank", bits=32)
        if comm_rank is not None:
            comm_ranks.append(comm_rank)
    if malformed:
        warnings.append(
            f"skipped {malformed} element(s) that are not profiler events (a 'cat' and ph 'b' or 'e')"
        )
    if unopened := sum(unmatched_ends.values()):
        warnings.append(f"{unopened} end event(s) had no begin: {_by_category(unmatched_ends)}")
    if unclosed := Counter(str(begin["cat"]) for idx, begin in begins if idx not in ends):
        warnings.append(f"{sum(unclosed.values())} span(s) have no end event: {_by_category(unclosed)}")
    if other:
        warnings.append(
            f"{sum(other.values())} span(s) describe parts of operations and are not rows: {_by_category(other)}"
        )
    warnings.extend(fields.warnings())
    rank, rank_warnings = single_rank(comm_ranks, "communicator ranks")
    rank_source = "content" if rank is not None else None
    if not comm_ranks and (in_name := _RANK_IN_NAME.search(os.path.basename(path))):
        rank, rank_source = int(in_name.group(1)), "filename"
        rank_warnings.append(f"rank {rank} taken from the file name: no operation in the dump names its rank")
    return SourceParse(tuple(rows), rank, rank_source, tuple(warnings + rank_warnings))


def _pair_spans(
    document: list[object],
) -> tuple[list[tuple[int, Event]], dict[int, Event], int, Counter[str]]:
    """Begin events in file order, the end event of each (by begin index), and what did not pair."""
    begins: list[tuple[int, Event]] = []
    ends: dict[int, Event] = {}
    open_by_key: defaultdict[tuple[object, ...], list[int]] = defaultdict(list)
    malformed = 0
    unmatched_ends = Counter[str]()
    for idx, event in enumerate(document):
        if not (
            isinstance(event, dict) and event.get("ph") in ("b", "e") and isinstance(event.get("cat"), str)
        ):
            malformed += 1
            continue
        # Ids count per category and thread, and KernelCh reuses one id, so pair the innermost open span.
        key = (event["cat"], event.get("name"), event.get("id"))
        if event["ph"] == "b":
            begins.append((idx, event))
            open_by_key[key].append(idx)
        elif open_by_key[key]:
            ends[open_by_key[key].pop()] = event
        else:
            unmatched_ends[str(event["cat"])] += 1
    return begins, ends, malformed, unmatched_ends


def _op(idx: int, begin: Event, end: Event | None, args: Mapping[str, object], f: Fields) -> NcclOp:
    name = f.text(begin, "name")
    collective = normalize_collective(name) if name is not None else None
    # COLL / P2P write Count and Datatype; CE_COLL writes count and datatype.
    count = f.integer(args, "Count") if "Count" in args else f.integer(args, "count")
    dtype = f.text(args, "Datatype") if "Datatype" in args else f.text(args, "datatype")
    in_side, out_side = _COUNT_SIDES.get(collective or "", (False, False))
    element_bytes = _NCCL_DTYPE_BYTES.get(dtype or "")
    comm_hash = f.unsigned(args, "CommHash")
    comm_id = f"0x{comm_hash:x}" if comm_hash is not None else None
    start_ns = _ts_ns(begin, f)
    end_ns = _ts_ns(end, f) if end is not None else None
    return NcclOp(
        record_idx=idx,
        record=record_json({"begin": begin, "end": end}),
        pg_name=comm_id,
        comm_id=comm_id,
        collective=collective,
        seq=f.integer(args, "SeqNum"),
        in_nelems=count if in_side else None,
        out_nelems=count if out_side else None,
        msg_bytes=count * element_bytes if count is not None and element_bytes is not None else None,
        dtype=dtype,
        start_ns=start_ns,
        end_ns=end_ns,
        duration_ns=end_ns - start_ns if start_ns is not None and end_ns is not None else None,
        algorithm=f.text(args, "Algorithm"),
        protocol=f.text(args, "Protocol"),
        n_channels=f.integer(args, "nChannels" if "nChannels" in args else "nMaxChannels", bits=32),
    )


def _ts_ns(event: Event, f: Fields) -> int | None:
    ts_us = f.number(event, "ts")
    # 0.000000 is a time the plugin never set (e.g. the start of API events in older plugins).
    return scaled_ns(ts_us, 1000) if ts_us else None


def _by_category(counts: Counter[str]) -> str:
    return ", ".join(f"{category} {n}" for category, n in counts.most_common())


def loads_lenient(path: str, text: str) -> tuple[object, list[str]]:
    """Parse the plugin's JSON: quote bare words, close an array cut off between its elements."""
    pieces: list[str] = []
    piece_starts: list[int] = []  # where each piece starts in the repaired text ...
    source_starts: list[int] = []  # ... and in `text`
    length = 0
    depth: list[str] = []
    last = ""
    element_start = 0
    for match in _TOKEN.finditer(text):
        kind, token = match.lastgroup, match.group()
        if kind == "space":
            continue
        if kind == "unclosed":
            raise BadInput(path, "a string never closes (cut short?)", byte_offset(text, match.start()))
        if kind == "bare" and token not in _JSON_LITERALS and not _JSON_NUMBER.fullmatch(token):
            token = json.dumps(token)
        elif token in ("[", "{"):
            if len(depth) == 1:
                element_start = match.start()
            depth.append(token)
        elif token in ("]", "}") and depth:
            depth.pop()
        piece_starts.append(length)
        source_starts.append(match.start())
        pieces.append(token)
        length += len(token)
        last = token
    warnings: list[str] = []
    if depth:
        if depth != ["["] or last not in ("[", ",", "}"):
            raise BadInput(
                path, "the dump ends inside an event (cut short?)", byte_offset(text, element_start)
            )
        if last == ",":
            pieces.pop()
        pieces.append("]")
        warnings.append(
            "the dump ends without its closing ']' (cut short between events); read the events before the cut"
        )
    repaired = "".join(pieces)
    try:
        return loads(repaired), warnings
    except JsonLimit as e:
        raise BadInput(path, e.reason) from None
    except json.JSONDecodeError as e:
        at = source_starts[bisect_right(piece_starts, e.pos) - 1] if piece_starts else 0
        raise BadInput(
            path, f"not JSON even with bare words quoted ({e.msg})", byte_offset(text, at)
        ) from None
