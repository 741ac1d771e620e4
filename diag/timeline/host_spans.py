"""The host spans of a GPU run's launching threads (HostSpans): the CPU ops, annotations and Python
frames MFU010 names host-bound time by, each of a kind: an op (its time outside children and launches
is the framework's), an annotation (the program's own code between ops), a Python frame.
"""

from __future__ import annotations

import functools
import re

import msgspec
import numpy as np
import pyarrow as pa

from diag.timeline.columns import I64, _ints, _strings
from diag.timeline.nesting import distinct

# Kinds of HostSpans: a CPU op (its time outside children and launches is the framework's), an
# annotation (record_function, ProfilerStep: the program's own code between ops) and a Python
# frame (with_stack=True).
SPAN_OP, SPAN_ANNOTATION, SPAN_FRAME = 0, 1, 2


class HostSpans(msgspec.Struct, frozen=True):
    """A GPU run's host spans on the threads that launch its GPU work, sorted by (tid, ts, -end):
    MFU010 names the host-bound part of each idle gap by the innermost of them at each instant."""

    tid: I64
    start_ns: I64
    end_ns: I64
    kind: I64                     # SPAN_OP | SPAN_ANNOTATION | SPAN_FRAME
    name: list[str]


# A built-in's frame names the object it was called on: `<built-in method mul_ of Parameter object at
# 0x7f3b0768a350>`, one name per tensor and per process. Without the object, one method is one name.
_BOUND_OBJECT = re.compile(r" of .+ object at 0x[0-9a-fA-F]+>$")


def frame_label(name: str) -> str:
    return _BOUND_OBJECT.sub(">", name)


# record_function spans of the framework's own C++ (c10d's collectives): their time outside ops
# and launches is dispatch, not the program's Python.
_FRAMEWORK_ANNOTATIONS = ("nccl:", "gloo:", "c10d::", "record_param_comms")
_PROGRAM_ANNOTATIONS = ("ProfilerStep#", "## ", "Optimizer.step#", "Optimizer.zero_grad#")


def launching_threads(ops: pa.Table, frames: pa.Table, acts: pa.Table) -> HostSpans | None:
    """The ops, annotations and Python frames of the threads that launched GPU activities."""
    threads = distinct(_ints(acts.column("launch_tid").drop_null()))
    if not len(threads):
        return None
    kept = []
    for table, frame in ((ops, False), (frames, True)):
        tid = _ints(table.column("tid"))
        t = table.filter(pa.array(np.isin(tid, threads)))
        names = _strings(t.column("name"))
        if frame:
            kind = np.full(len(names), SPAN_FRAME, np.int64)
        else:
            kind = np.array([_span_kind(c, nm) for c, nm in zip(_strings(t.column("cat")), names, strict=True)],
                            np.int64)
        kept.append((_ints(t.column("tid")), _ints(t.column("ts")), _ints(t.column("end")), kind, names))
    tid, ts, end, kind = (np.concatenate([k[i] for k in kept]) for i in range(4))
    names = kept[0][4] + kept[1][4]
    order = np.lexsort((-end, ts, tid))
    return HostSpans(tid[order], ts[order], end[order], kind[order], [names[i] for i in order.tolist()])


@functools.lru_cache(maxsize=65536)   # a step repeats a few hundred op names thousands of times
def _span_kind(cat: str | None, name: str) -> int:
    """An op, or an annotation: the program's record_function spans, whatever category the trace
    gives them (ProfilerStep#3 is a cpu_op in older Kineto), less the framework's own."""
    if name.startswith(_FRAMEWORK_ANNOTATIONS):
        return SPAN_OP
    if cat in ("cpu_op", "Operator") and not program_annotation(name):
        return SPAN_OP
    return SPAN_ANNOTATION


def program_annotation(name: str) -> bool:
    return name.startswith(_PROGRAM_ANNOTATIONS)
