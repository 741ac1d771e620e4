"""NCCL-side traces → rows of the `nccl_ops` table (diag/sql/schema.sql).

Three sources, told apart by content, never by file name (`detect_kind`):

| kind                     | writer                                          | one row per               | clock of `start_ns`/`end_ns`          |
|--------------------------|-------------------------------------------------|---------------------------|---------------------------------------|
| flight_recorder_pickle   | PyTorch Flight Recorder, `nccl_trace_rank_N`    | FR entry                  | CLOCK_REALTIME ns (`c10::getTime()`)  |
| flight_recorder_json     | the same dump as JSON (`_dump_fr_trace_json`)   | FR entry                  | CLOCK_REALTIME ns                     |
| nccl_inspector           | NCCL Inspector plugin, `<host>-pid<pid>.log`    | `coll_perf` line          | gettimeofday µs × 1000 (verbose only) |
| nccl_profiler            | NCCL example profiler plugin (Chrome-trace-ish) | COLL / P2P / CE_COLL span | CLOCK_MONOTONIC µs since plugin init  |

Each parser module documents its own fields; what they share (the row type, the Arrow schema of
the table, collective-name normalization and typed field reads) is diag/ingest/nccl_rows.py.
`parse_nccl_file` returns the table without `file_id` and `rank`, which the store adds to every table
(the rank from `NcclParse.rank`), as it does for Kineto tables.
"""

from __future__ import annotations

import re

from diag.ingest import flight_recorder, nccl_inspector, nccl_profiler
from diag.ingest.nccl_rows import NcclParse, Resume, ops_table
from diag.runtime.errors import BadInput

# detect_kind looks at this much of the (decompressed) file.
HEAD_BYTES = 4096

# trace_files.kind and nccl_ops.source, by detected kind.
SOURCE_OF_KIND = {
    "flight_recorder_pickle": "flight_recorder",
    "flight_recorder_json": "flight_recorder",
    "nccl_inspector": "nccl_inspector",
    "nccl_profiler": "nccl_profiler",
}

def detect_kind(head: bytes) -> str | None:
    """The NCCL-side format of a file from its first few KB of content, or None when it is none of them."""
    head = head[:HEAD_BYTES]
    if _is_flight_recorder_pickle(head):
        return "flight_recorder_pickle"
    if _INSPECTOR_HEAD.match(head):
        return "nccl_inspector"
    if _is_flight_recorder_json(head):
        return "flight_recorder_json"
    if _PROFILER_HEAD.match(head):
        return "nccl_profiler"
    return None


# FR pickles are protocol 2 (torch's pickle_str); their top-level keys are plain strings in the bytes.
_FR_PICKLE_KEYS = (b"pg_config", b"pg_status", b"comm_lib_version", b"entries")


def _is_flight_recorder_pickle(head: bytes) -> bool:
    return len(head) > 2 and head[0] == 0x80 and 2 <= head[1] <= 5 and any(k in head for k in _FR_PICKLE_KEYS)


def _is_flight_recorder_json(head: bytes) -> bool:
    # nlohmann::json sorts keys, so a dump starts {"comm_lib_version":..,"entries":[{"collective_seq_id"..
    # A Kineto trace also carries "pg_config" (in distributedInfo), so that key alone proves nothing.
    if not head.lstrip().startswith(b"{") or b'"traceEvents"' in head:
        return False
    return (
        b'"comm_lib_version"' in head
        or (b'"profiling_name"' in head and b'"collective_seq_id"' in head)
        or (b'"pg_status"' in head and b'"version"' in head)
    )


# Every Inspector line is {"header":{..},"metadata":{..},"coll_perf":{..}} (inspector.cc, inspectorCommInfoDump).
_INSPECTOR_HEAD = re.compile(rb'\s*\{\s*"(?:header|metadata|coll_perf)"\s*:')
# The example profiler writes "[\n", then {"name": .., "cat": <category>, "ph": "b", .. per event (headers
# first), then "{}]\n" (ext-profiler/example plugin.cc exampleProfilerFinalize, print_event.cc).
_PROFILER_CATEGORIES = rb"GROUP_API|COLL_API|P2P_API|KERNEL_LAUNCH|GROUP|COLL|P2P|PROXY|NET|NET_IB|NET_SOCK|GPU|CE_COLL|CE_SYNC|CE_BATCH"
_PROFILER_HEAD = re.compile(
    rb'\s*\[\s*(?:\{\s*"name"\s*:\s*"[^"]*"\s*,\s*"cat"\s*:\s*"(?:'
    + _PROFILER_CATEGORIES
    + rb')"\s*,\s*"ph"\s*:\s*"b"|\{\}\]\s*$)'
)


def parse_nccl_file(path: str, data: bytes, *, rank: int | None = None, resume: Resume | None = None) -> NcclParse:
    """Parse a Flight Recorder dump, NCCL Inspector log or NCCL profiler trace (decompressed bytes).

    `rank` (from the command line) overrides whatever rank the file names for itself. `resume`: an
    NCCL Inspector log read before, parsed on from where that read stopped (the table holds the new rows).
    """
    kind = detect_kind(data[:HEAD_BYTES])
    if kind is None:
        raise BadInput(
            path,
            "not a Flight Recorder dump, NCCL Inspector log or NCCL profiler trace "
            "(checked the first 4 KB of content)",
            0,
        )
    if kind == "flight_recorder_pickle":
        parsed = flight_recorder.parse_pickle(path, data)
    elif kind == "flight_recorder_json":
        parsed = flight_recorder.parse_json(path, data)
    elif kind == "nccl_inspector":
        parsed = nccl_inspector.parse(path, data, resume)
    else:
        parsed = nccl_profiler.parse(path, data)

    warnings = list(parsed.warnings)
    file_rank, rank_source = parsed.rank, parsed.rank_source
    if rank is not None:
        if file_rank is not None and file_rank != rank:
            warnings.append(f"rank {rank} given overrides rank {file_rank} found in the file ({rank_source})")
        file_rank, rank_source = rank, "option"
    source = SOURCE_OF_KIND[kind]
    table, table_warnings = ops_table(parsed.rows, source)
    return NcclParse(source, file_rank, rank_source, table, tuple(warnings + table_warnings), parsed.resume)
