"""PyTorch Flight Recorder dumps (pickle or JSON) → nccl_ops rows.

The dump (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp, `dump_dict` and `dump_json`;
keys in FlightRecorder.hpp; version "2.x", 2.10 in torch 2.13):

    {"version": "2.10", "comm_lib_version": str,
     "pg_config": {pg_name: {"name": str, "desc": str, "ranks": "[0, 1, 2, 3]"}},
     "pg_status": {pg_id: {"last_enqueued_collective": .., ...}},
     "entries": [{"record_id", "pg_id", "process_group": (name, desc), "collective_seq_id",
                  "p2p_seq_id", "op_id", "profiling_name": "nccl:all_reduce" | "nccl:send 0->1",
                  "time_created_ns", "duration_ms" (only with TORCH_NCCL_ENABLE_TIMING),
                  "input_sizes", "input_dtypes", "output_sizes", "output_dtypes",
                  "state": "scheduled" | "started" | "completed", "time_discovered_started_ns",
                  "time_discovered_completed_ns", "retired", "timeout_ms", "is_p2p",
                  "frames" (pickle only), "thread_id", "thread_name"}, ...],
     "nccl_comm_state": {...}}

The pickle writes an unknown discovery time as None, the JSON as 0; the JSON omits "entries"
when there are none. Pickles are read only through `safe_pickle.load_plain`.

Clock: `time_created_ns` and `time_discovered_*_ns` are `c10::getTime()`, CLOCK_REALTIME ns of the
recording host. Row fields:
- start_ns = time_created_ns: when the work was enqueued on the host, not when its kernel started.
- end_ns = time_discovered_completed_ns: when the watchdog noticed completion, late by its poll.
- duration_ns = duration_ms × 10^6: CUDA-event time of the kernel, only when timing was on.
- seq = collective_seq_id for collectives, p2p_seq = p2p_seq_id for send/recv (what fr_trace matches on).
- n_ranks = the size of the group's `ranks` in pg_config.
- msg_bytes = elements × element size as NCCL counts them: the input buffers, or the output for
  reduce-scatter and recv (NCCL's count is the per-rank receive count there).

Rank: the dump does not record its own rank. In order of trust: a top-level "rank" (a custom
DebugInfoWriter may add one); the one rank common to every group in pg_config (a rank builds only the
groups it belongs to); the number ending the file name (the default writer names files
`nccl_trace_rank_<rank>`, optionally `.json`), with a warning.
"""

from __future__ import annotations

import json
import math
import os
import re
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
)
from diag.ingest.safe_pickle import MAX_ELEMENTS, load_plain
from diag.runtime.errors import BadInput

# Bytes per element, by c10::toString(ScalarType) as the dump writes dtypes (c10/core/ScalarType.h).
_DTYPE_BYTES = {
    "Bool": 1, "Byte": 1, "Char": 1, "QInt8": 1, "QUInt8": 1,
    "Float8_e5m2": 1, "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "Float8_e8m0fnu": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2,
    "Int": 4, "Float": 4, "QInt32": 4, "ComplexHalf": 4, "UInt32": 4,
    "Long": 8, "Double": 8, "ComplexFloat": 8, "UInt64": 8,
    "ComplexDouble": 16,
}  # fmt: skip
# NCCL counts the receive side of these (ncclReduceScatter recvcount, ncclRecv count).
_COUNTED_ON_OUTPUT = frozenset({"reducescatter", "recv"})
_RANKS_TEXT = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)?\s*\]")
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")

Tensor = tuple[int, str | None]  # (number of elements, dtype name)


def parse_pickle(path: str, data: bytes) -> SourceParse:
    return _parse_dump(path, load_plain(path, data))


def parse_json(path: str, data: bytes) -> SourceParse:
    text = decode_text(path, data)
    try:
        dump = loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(
            path, f"Flight Recorder JSON is not valid JSON ({e.msg})", byte_offset(text, e.pos)
        ) from None
    except JsonLimit as e:
        raise BadInput(path, e.reason) from None
    return _parse_dump(path, dump)


def _parse_dump(path: str, dump: object) -> SourceParse:
    if not isinstance(dump, dict):
        raise BadInput(path, f"a Flight Recorder dump is a dict, this is a {type(dump).__name__}")
    entries = dump.get("entries", [])
    if not isinstance(entries, list):
        raise BadInput(path, f"Flight Recorder 'entries' is a {type(entries).__name__}, not a list")
    if len(entries) > MAX_ELEMENTS:
        raise BadInput(path, f"{len(entries)} Flight Recorder entries, more than the {MAX_ELEMENTS} diag reads "
                             "(a dump holds TORCH_NCCL_TRACE_BUFFER_SIZE entries, 2000 by default)")
    warnings: list[str] = []
    version = dump.get("version")
    if not (isinstance(version, str) and version.startswith("2.")):
        warnings.append(f"Flight Recorder dump version {version!r}; this reader follows version 2.x")
    group_ranks = _group_ranks(dump.get("pg_config"))
    fields = Fields()
    rows: list[NcclOp] = []
    for idx, entry in enumerate(entries):
        if isinstance(entry, dict) and isinstance(entry.get("profiling_name"), str):
            rows.append(_op(idx, entry, group_ranks, fields))
        # The dump is this parse's own: each entry let go once its row holds what the store keeps, so
        # the rows grow as the tree shrinks (999,999 entries: the tree alone is ~1.1 GB).
        entries[idx] = None
    if len(rows) < len(entries):
        warnings.append(
            f"skipped {len(entries) - len(rows)} of {len(entries)} entries with no 'profiling_name' "
            "(not Flight Recorder entries)"
        )
    warnings.extend(fields.warnings())
    rank, rank_source, rank_warnings = _rank(path, dump, group_ranks)
    return SourceParse(tuple(rows), rank, rank_source, tuple(warnings + rank_warnings))


def _op(idx: int, entry: Mapping[str, object], group_ranks: Mapping[str, list[int]], f: Fields) -> NcclOp:
    profiling_name = str(entry["profiling_name"])
    # "nccl:all_reduce", "nccl:send 0->1", "gloo:barrier": backend, operation, then peer for P2P.
    operation = profiling_name.split(":", 1)[-1].split(" ", 1)[0]
    collective = normalize_collective(operation)
    pg_name, pg_desc = _process_group(entry, f)
    is_p2p = entry.get("is_p2p")
    if not isinstance(is_p2p, bool):  # absent from older dumps
        is_p2p = collective in ("send", "recv")
    inputs = _tensors(entry, "input_sizes", "input_dtypes", f)
    outputs = _tensors(entry, "output_sizes", "output_dtypes", f)
    counted = outputs if collective in _COUNTED_ON_OUTPUT else inputs
    duration_ms = f.number(entry, "duration_ms")
    ranks = group_ranks.get(pg_name) if pg_name is not None else None
    return NcclOp(
        record_idx=idx,
        record=record_json(entry),
        pg_name=pg_name,
        pg_desc=pg_desc,
        n_ranks=len(ranks) if ranks else None,
        collective=collective,
        seq=None if is_p2p else f.integer(entry, "collective_seq_id"),
        p2p_seq=f.integer(entry, "p2p_seq_id") if is_p2p else None,
        in_nelems=_nelems(inputs),
        out_nelems=_nelems(outputs),
        msg_bytes=_nbytes(counted),
        dtype=_dtypes(counted),
        state=f.text(entry, "state"),
        start_ns=f.integer(entry, "time_created_ns"),
        # The JSON form writes 0 for "not discovered yet".
        end_ns=f.integer(entry, "time_discovered_completed_ns") or None,
        duration_ns=scaled_ns(duration_ms, 1_000_000) if duration_ms is not None else None,
    )


def _process_group(entry: Mapping[str, object], f: Fields) -> tuple[str | None, str | None]:
    pg = entry.get("process_group")
    if isinstance(pg, list | tuple) and len(pg) == 2 and all(isinstance(p, str) for p in pg):
        return pg[0], pg[1]
    if pg is not None:
        f.unusable("process_group")
    return None, None


def _tensors(entry: Mapping[str, object], sizes_key: str, dtypes_key: str, f: Fields) -> list[Tensor] | None:
    sizes, dtypes = entry.get(sizes_key), entry.get(dtypes_key)
    if sizes is None:
        return None
    if not (
        isinstance(sizes, list)
        and all(
            isinstance(s, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in s)
            for s in sizes
        )
    ):
        f.unusable(sizes_key)
        return None
    if not (
        isinstance(dtypes, list) and len(dtypes) == len(sizes) and all(isinstance(d, str) for d in dtypes)
    ):
        if dtypes is not None:
            f.unusable(dtypes_key)
        return [(math.prod(s), None) for s in sizes]
    return [(math.prod(s), d) for s, d in zip(sizes, dtypes, strict=True)]


def _nelems(tensors: list[Tensor] | None) -> int | None:
    return sum(n for n, _ in tensors) if tensors is not None else None


def _nbytes(tensors: list[Tensor] | None) -> int | None:
    if tensors is None:
        return None
    total = 0
    for n, dtype in tensors:
        size = _DTYPE_BYTES.get(dtype) if dtype is not None else None
        if size is None:
            return None
        total += n * size
    return total


def _dtypes(tensors: list[Tensor] | None) -> str | None:
    names = list(dict.fromkeys(d for _, d in tensors or [] if d is not None))
    return ",".join(names) if names else None


def _group_ranks(pg_config: object) -> dict[str, list[int]]:
    """Global ranks of each group by name, from pg_config's "ranks" text ("[0, 1, 2]", TraceUtils ranks_str)."""
    if not isinstance(pg_config, dict):
        return {}
    groups: dict[str, list[int]] = {}
    for name, info in pg_config.items():
        ranks = info.get("ranks") if isinstance(info, dict) else None
        match = _RANKS_TEXT.fullmatch(ranks.strip()) if isinstance(ranks, str) else None
        if isinstance(name, str) and match and match.group(1):
            groups[name] = [int(r) for r in match.group(1).split(",")]
    return groups


def _rank(
    path: str, dump: Mapping[str, object], group_ranks: Mapping[str, list[int]]
) -> tuple[int | None, str | None, list[str]]:
    in_name = _RANK_IN_NAME.search(os.path.basename(path))
    name_rank = int(in_name.group(1)) if in_name else None
    content_rank = _rank_in_content(dump, group_ranks)
    if content_rank is None and name_rank is None:
        return None, None, ["no rank: the dump does not record it and its file name does not end in one"]
    if content_rank is None:
        return (
            name_rank,
            "filename",
            [f"rank {name_rank} taken from the file name: the dump does not record its own rank"],
        )
    warnings = []
    if name_rank is not None and name_rank != content_rank:
        warnings.append(
            f"the dump's content makes it rank {content_rank}, its file name says {name_rank}; kept {content_rank}"
        )
    return content_rank, "content", warnings


def _rank_in_content(dump: Mapping[str, object], group_ranks: Mapping[str, list[int]]) -> int | None:
    named = dump.get("rank")
    if isinstance(named, int) and not isinstance(named, bool):
        return named
    if not group_ranks:
        return None
    common = set.intersection(*(set(ranks) for ranks in group_ranks.values()))
    return common.pop() if len(common) == 1 else None
