"""Steps that are outliers by construction, left out of the means (`--all-steps` keeps them).

Two kinds, each judged within one rank's capture window against the other steps of that window:

- teardown: the last step ends in a tail where neither the CPU (no op but the ProfilerStep span)
  nor the GPU does anything: the profiler stopping and writing its trace inside the step's span.
  Excluded when the tail is at least half the median of the other steps' windows: a gap that
  size after all work is done is not part of any training or serving step. Idle time *before* a
  step's work (waiting for data) is never a tail: it belongs to the step (DESIGN.md "Steps").
  Also excluded whatever its length: a last step in which nothing ran at all (its whole window
  the tail), the stub the profiler records when it stops just after `step()`. Kept, the stub
  counts as a step that is 100% idle: HTA's MI250 capture, a 9.29 ms step and an 86 µs stub, read
  51 points of idle that were the stub's alone.
- warm-up: the first step carries one-time work (cuDNN autotuning, allocator growth, compilation).
  Excluded when its window is more than twice the median of the others AND more than 1.5 × the
  longest of them. The second test keeps legitimately varying runs whole: when another step is
  nearly as long, the first is not an outlier by construction, only the longest of a spread. At
  least two other steps are needed to take a median of.

A step is never excluded on a guess: a window without ProfilerStep spans has one step, and
no test ever leaves a capture window with no steps.
"""

from __future__ import annotations

import statistics

from diag.runtime.durations import duration
from diag.timeline.rank import Steps

TAIL_OF_MEDIAN = 0.5        # teardown: idle tail ≥ this × the median of the other windows
WARMUP_OF_MEDIAN = 2.0      # warm-up: first window > this × the median of the others ...
WARMUP_OF_LONGEST = 1.5     # ... and > this × the longest of them
MIN_OTHERS_WARMUP = 2       # other steps needed to judge a first step


def excluded_steps(steps: Steps) -> dict[int, str]:
    """Index into `steps` → why it is left out."""
    n = len(steps.step)
    if not steps.from_profiler_step or n < 2:
        return {}
    windows = [int(e - s) for s, e in zip(steps.start_ns, steps.end_ns, strict=True)]
    out: dict[int, str] = {}
    last = n - 1
    tail = int(steps.end_ns[last] - steps.busy_end_ns[last])
    typical = statistics.median(windows[:last])
    if tail > 0 and tail >= windows[last]:
        out[last] = (f"teardown: nothing ran in the last step ({_dur(tail)}), no kernel and no op but its "
                     "ProfilerStep span (the profiler stopping)")
    elif tail > 0 and tail >= TAIL_OF_MEDIAN * typical:
        out[last] = (f"teardown: the last {_dur(tail)} of the last step is idle with nothing on the CPU or GPU "
                     f"(the profiler stopping), ≥ {TAIL_OF_MEDIAN:g} × the median step ({_dur(typical)})")
    others = [w for i, w in enumerate(windows[1:], 1) if i not in out]
    if len(others) >= MIN_OTHERS_WARMUP:
        first, median, longest = windows[0], statistics.median(others), max(others)
        if first > WARMUP_OF_MEDIAN * median and first > WARMUP_OF_LONGEST * longest:
            out[0] = (f"warm-up: the first step ({_dur(first)}) is over {WARMUP_OF_MEDIAN:g} × the median of the "
                      f"others ({_dur(median)}) and {WARMUP_OF_LONGEST:g} × the longest ({_dur(longest)}): one-time work")
    return out


def _dur(ns: float) -> str:
    return duration(ns * 1e-9)
