"""A pipeline schedule's compute actions, where the framework names them on the host.

torch.distributed.pipelining's runtime schedules (`_PipelineScheduleRuntime`: ScheduleInterleaved1F1B,
ScheduleLoopedBFS, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV) run
every action of a rank's order inside `record_function(f"PP:{action}")` (schedules.py,
`_get_profiler_function_name`), the action written as stage index, computation type and
microbatch: `PP:3F1` is stage 3's forward of microbatch 1, `PP:3I1` its input-gradient backward,
`PP:3W1` its weight-gradient backward, `PP:3B1` a full backward, `PP:(0F4;7I0)OVERLAP_F_B` a
forward and a backward run overlapped (DualPipeV); the transfers are actions of their own
(`PP:3SEND_F1`, `PP:2RECV_B0`), not read here. Megatron-LM and DeepSeek's DualPipe name no
action: their layout is read from the send/recv pattern alone (pipeline_layout.py).

An action's time is the GPU time of the compute kernels launched while it was open, by any thread
of the rank: the autograd engine launches a backward's kernels from its own thread while the
calling thread waits inside the action. These are the F, I (B in Qi et al.), W times the
schedules' bubble formulas take.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

FORWARD, INPUT_GRAD, WEIGHT_GRAD, FULL_BACKWARD, OVERLAPPED = "F", "I", "W", "B", "F&B"
_ONE = re.compile(r"(\d+)(F|I|W|B)(\d+)")
_ACTION = re.compile(r"PP:(\d+)(F|I|W|B)(\d+)")
_OVERLAP = re.compile(r"PP:\((.+)\)OVERLAP_F_B")


class PipeAction(msgspec.Struct, frozen=True):
    stages: tuple[int, ...]    # the stage index (two for an overlapped forward and backward)
    kind: str                  # F | I | W | B | F&B
    microbatch: int            # the forward's, for F&B
    step: int | None           # index into the rank's steps, by the action's host start
    ts_ns: int                 # host start (the rank's own clock)
    gpu_ns: int                # compute kernel time launched inside it


def parse_action(name: str) -> tuple[tuple[int, ...], str, int] | None:
    """(stages, kind, microbatch) of a `PP:` record_function name, None for any other name."""
    if m := _ACTION.fullmatch(name):
        return (int(m[1]),), m[2], int(m[3])
    if m := _OVERLAP.fullmatch(name):
        subs = [s for s in (_ONE.fullmatch(part) for part in m[1].split(";")) if s is not None]
        if len(subs) == 2:
            fwd = next((s for s in subs if s[2] == FORWARD), subs[0])
            return tuple(int(s[1]) for s in subs), OVERLAPPED, int(fwd[3])
    return None


def pipeline_actions(names: list[str | None], op_ts: I64, op_end: I64, launch_ts: I64, compute_ns: I64,
                     step_start: list[int], step_end: list[int]) -> list[PipeAction]:
    """The `PP:` actions among the host ops (names, start, end), each with the compute time of the
    kernels launched inside it: `launch_ts` and `compute_ns` are the compute kernels' launch start
    and duration, sorted by launch. `step_start`/`step_end` are the steps' host windows."""
    out: list[PipeAction] = []
    cum = np.concatenate([[0], np.cumsum(compute_ns)])
    for i, name in enumerate(names):
        parsed = parse_action(name) if name and name.startswith("PP:") else None
        if parsed is None:
            continue
        ts, end = int(op_ts[i]), int(op_end[i])
        lo, hi = np.searchsorted(launch_ts, ts, "left"), np.searchsorted(launch_ts, end, "right")
        step = next((k for k, (a, b) in enumerate(zip(step_start, step_end, strict=True)) if a <= ts < b), None)
        out.append(PipeAction(parsed[0], parsed[1], parsed[2], step, ts, int(cum[hi] - cum[lo])))
    out.sort(key=lambda a: a.ts_ns)
    return out
