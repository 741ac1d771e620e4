"""Which format a trace file is, told by the structure of its content, never by its name or its
first key alone.

A Kineto trace is one JSON object with a `traceEvents` list, wherever the key sits: re-saved or
pretty-printed copies put `"metadata"`, `"schemaVersion"` or `"deviceProperties"` first, and a
merge tool may write `traceEvents` last. The NCCL-side formats (diag/ingest/nccl.py) are told by
their first few KB; where such a start is also a file that holds `traceEvents`, the whole document
is read to decide: an NCCL Inspector log is one JSON object per line, never one document.
"""

from __future__ import annotations

from typing import Any

import msgspec

from diag.ingest import nccl

# How much of the (decompressed) start the NCCL signatures look at.
HEAD_BYTES = 65536
_TRACE_EVENTS = b'"traceEvents"'
# Top-level keys that only an NCCL-side record carries (Inspector lines; Flight Recorder dumps).
_NCCL_KEYS = frozenset({"header", "coll_perf", "entries", "comm_lib_version"})
_top_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
# How a warning about a file that fits two formats begins: every command shows it (api.open_store).
AMBIGUOUS = "ambiguous format: "


class Format(msgspec.Struct, frozen=True):
    kind: str | None          # 'kineto', an NCCL kind (nccl.SOURCE_OF_KIND), or None: not a trace
    warning: str | None = None


def trace_format(data: Any) -> Format:
    """The format of a decompressed file's content."""
    nccl_kind = nccl.detect_kind(bytes(data[:HEAD_BYTES]))
    has_events = data.find(_TRACE_EVENTS) >= 0
    if not has_events or nccl_kind is None:
        return Format("kineto" if has_events else nccl_kind)
    # Both: an NCCL-looking start in a file that holds "traceEvents" somewhere.
    top = _keys(data)
    if top is None:
        # Not one JSON document: JSON lines (an Inspector log), or a damaged document. A line
        # that is a whole object without traceEvents is a log's; anything else is left to the
        # Kineto reader, which names the damage and its offset.
        first = _keys(data[: _line_end(data)])
        return Format(nccl_kind if first is not None and "traceEvents" not in first else "kineto")
    if "traceEvents" not in top:
        return Format(nccl_kind)
    if top.keys() & _NCCL_KEYS:
        return Format("kineto", f"{AMBIGUOUS}holds both a traceEvents list and the {nccl_kind} keys "
                                f"{sorted(top.keys() & _NCCL_KEYS)}; read as a Kineto trace")
    return Format("kineto")


def _keys(data: Any) -> dict[str, msgspec.Raw] | None:
    """The top-level object of a JSON document (values left as raw text), or None when the bytes
    are not exactly one JSON object."""
    try:
        return _top_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None


def _line_end(data: Any) -> int:
    end = data.find(b"\n")
    return len(data) if end < 0 else end
