"""NCCL Inspector logs (newline-delimited JSON) → nccl_ops rows.

The plugin's dump thread appends one compact JSON object per line to `<dir>/<hostname>-pid<pid>.log`
(NVIDIA/nccl ext-profiler/inspector/inspector.cc `inspectorCommInfoDump`, writer json.cc):

    {"header":{"id":"0x7f8c496ae9f661","rank":2,"n_ranks":8,"nnodes":1},
     "metadata":{"inspector_output_format_version":"v4.0","git_rev":"","rec_mechanism":"nccl_profiler_interface",
                 "dump_timestamp_us":1748030377748202,"hostname":"node-1","pid":1639453},
     "coll_perf":{"coll":"AllReduce","coll_sn":1407,"coll_msg_size_bytes":17179869184,"coll_exec_time_us":61974,
                  "coll_timing_source":"kernel_gpu","coll_algobw_gbs":277.210914,"coll_busbw_gbs":485.119099,
                  "event_trace_sn":{..}, "event_trace_ts":{"coll_start_ts":..,"coll_stop_ts":..,
                  "kernel_events":[{"channel_id":0,"kernel_start_ts":..,"kernel_stop_ts":..,"kernel_record_ts":..}]}}}

The event_trace_* objects appear only with NCCL_INSPECTOR_DUMP_VERBOSE=1. The log is a sample, not a
trace: each dump interval writes the latest completed collective of each communicator, so `coll_sn`
has gaps. Every line written by the plugin carries its communicator's header; a line with a header and
no coll_perf is kept as the context for following coll_perf lines that have none.

Row fields:
- comm_id = pg_name = header.id, the communicator hash as the plugin prints it ("0x%lx").
- n_ranks = header.n_ranks; seq = coll_sn, NCCL's sequence number within the communicator.
- msg_bytes = coll_msg_size_bytes = NCCL count × element size (per rank; send side, receive side for
  ReduceScatter).
- duration_ns = coll_exec_time_us × 1000: the slowest channel's kernel time from the GPU globaltimer
  (coll_timing_source "kernel_gpu"), else from host timestamps ("kernel_cpu", "collective_cpu").
- start_ns / end_ns, verbose logs only: gettimeofday µs × 1000 (CLOCK_REALTIME) when the host saw the
  first channel's kernel start and the last one stop. n_channels = len(kernel_events), verbose only.
- algo_bw_gbps / bus_bw_gbps = coll_algobw_gbs / coll_busbw_gbs, in GB/s (10^9 bytes per second).
Rank: header.rank is the rank within that communicator; it is the file's rank when all lines agree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from diag.ingest.nccl_rows import (
    Fields,
    JsonLimit,
    NcclOp,
    Resume,
    SourceParse,
    byte_offset,
    loads,
    normalize_collective,
    single_rank,
)
from diag.runtime.errors import BadInput


def parse(path: str, data: bytes, resume: Resume | None = None) -> SourceParse:
    """The rows of the lines from `resume.offset` on (the whole file without it). The plugin appends
    while the job runs: the parse stops after the last complete line, and its `state` carries on
    what the next read needs (the last header, the next line's number) and the counts its
    warnings are made of, so a file read in pieces has the rows and warnings of one read whole."""
    state: Mapping[str, Any] = resume.state if resume is not None else {}
    start = resume.offset if resume is not None else 0
    fields = Fields(state.get("unusable"))
    rows: list[NcclOp] = []
    ranks: set[int] = set(state.get("ranks", []))
    context: Mapping[str, object] | None = state.get("context")
    skipped, headerless = int(state.get("skipped", 0)), int(state.get("headerless", 0))
    line_idx = int(state.get("next_line", 0))
    unfinished: list[str] = []
    pos = start + (state.get("mid_line") is True and data[start : start + 1] == b"\n")
    read, mid_line = pos, False
    while pos < len(data):
        newline = data.find(b"\n", pos)
        complete = newline >= 0
        line_end = newline if complete else len(data)
        line = data[pos:line_end]
        if not complete and not line.strip():
            break   # the start of a line still being written: read it whole next time
        if line.strip():
            try:
                text, record = _load_line(line)
            except _LineError as e:
                if not complete:
                    # No newline after it: the dump thread was still writing this line.
                    unfinished.append(f"ignored the unfinished last line ({len(line)} bytes, no newline after it)")
                    break
                raise BadInput(path, f"line {line_idx + 1} is not JSON ({e.reason})", pos + e.column) from None
            row = _record(line_idx, text, record, context, fields) if isinstance(record, dict) else None
            if row is None:
                skipped += 1
            else:
                context, op = row
                if op is not None:
                    headerless += not (isinstance(record, dict) and isinstance(record.get("header"), dict))
                    rows.append(op)
                    comm_rank = fields.integer(context, "rank", bits=32) if context is not None else None
                    if comm_rank is not None:
                        ranks.add(comm_rank)
        # A last line complete as JSON but without its newline yet is read; its newline, when it
        # comes, is not a line of its own.
        pos = read = line_end + 1 if complete else line_end
        mid_line = not complete
        line_idx += 1
    warnings = []
    if skipped:
        warnings.append(f"skipped {skipped} line(s) with neither 'coll_perf' nor 'header'")
    if headerless:
        warnings.append(
            f"{headerless} coll_perf line(s) without a header took the last header seen before them"
        )
    warnings.extend(fields.warnings())
    rank, rank_warnings = single_rank(ranks, "communicator ranks")
    after = {"next_line": line_idx, "mid_line": mid_line, "context": context, "ranks": sorted(ranks),
             "skipped": skipped, "headerless": headerless, "unusable": fields.counts()}
    return SourceParse(
        tuple(rows), rank, "content" if rank is not None else None, tuple(unfinished + warnings + rank_warnings),
        Resume(read, after),
    )


def _record(
    line_idx: int, text: str, record: Mapping[str, object], context: Mapping[str, object] | None, f: Fields
) -> tuple[Mapping[str, object] | None, NcclOp | None] | None:
    """(the header in force after this line, its row if it has a coll_perf), or None when the line
    has neither a header nor a coll_perf."""
    header = f.mapping(record, "header")
    context = header or context
    perf = f.mapping(record, "coll_perf")
    if perf is None:
        return None if header is None else (context, None)
    return context, _op(line_idx, text, context, perf, f)


def _op(
    line_idx: int,
    line_text: str,
    header: Mapping[str, object] | None,
    perf: Mapping[str, object],
    f: Fields,
) -> NcclOp:
    comm_id = f.text(header, "id") if header is not None else None
    coll = f.text(perf, "coll")
    exec_us = f.integer(perf, "coll_exec_time_us")
    start_ns, end_ns, n_channels = _kernel_span(f.mapping(perf, "event_trace_ts"), f)
    return NcclOp(
        record_idx=line_idx,
        record=line_text,  # already the record as compact JSON
        pg_name=comm_id,
        comm_id=comm_id,
        n_ranks=f.integer(header, "n_ranks", bits=32) if header is not None else None,
        collective=normalize_collective(coll) if coll is not None else None,
        seq=f.integer(perf, "coll_sn"),
        msg_bytes=f.integer(perf, "coll_msg_size_bytes"),
        start_ns=start_ns,
        end_ns=end_ns,
        duration_ns=exec_us * 1000 if exec_us is not None else None,
        algo_bw_gbps=f.number(perf, "coll_algobw_gbs"),
        bus_bw_gbps=f.number(perf, "coll_busbw_gbs"),
        n_channels=n_channels,
    )


def _kernel_span(
    trace_ts: Mapping[str, object] | None, f: Fields
) -> tuple[int | None, int | None, int | None]:
    """(first kernel start, last kernel stop) in ns and the channel count, from a verbose record."""
    kernels = trace_ts.get("kernel_events") if trace_ts is not None else None
    if not isinstance(kernels, list):
        if kernels is not None:
            f.unusable("kernel_events")
        return None, None, None
    # A channel's timestamps stay 0 until the plugin records that event.
    starts = [t for k in kernels if isinstance(k, dict) and (t := f.integer(k, "kernel_start_ts"))]
    stops = [t for k in kernels if isinstance(k, dict) and (t := f.integer(k, "kernel_stop_ts"))]
    return (
        min(starts) * 1000 if starts else None,
        max(stops) * 1000 if stops else None,
        len(kernels),
    )


class _LineError(Exception):
    def __init__(self, reason: str, column: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.column = column  # bytes into the line


def _load_line(line: bytes) -> tuple[str, object]:
    """The line's text (less a trailing \\r) and its JSON value."""
    try:
        text = line.decode("utf-8").rstrip()
    except UnicodeDecodeError as e:
        raise _LineError(f"not UTF-8: {e.reason}", e.start) from None
    try:
        return text, loads(text)
    except json.JSONDecodeError as e:
        raise _LineError(e.msg, byte_offset(text, e.pos)) from None
    except JsonLimit as e:
        raise _LineError(e.reason, 0) from None
