"""An independent GPU-state split of one Kineto file, from the JSON alone (stdlib only: no diag,
no numpy), written from DESIGN.md's definitions to check diag's ledger against (issue 13).

- Activities: kernels, memcpys and memsets (`cat` kernel / gpu_memcpy / gpu_memset, or the 2021
  schema's Kernel / Memcpy / Memset). A kernel whose name says NCCL or RCCL is communication.
  A file with none of them is a CPU-only run: its host timeline stands in (docs/ledger.md
  "CPU-only runs"): `aten::` CPU ops are compute, `gloo:` spans communication.
- States at each instant: computing (any non-communication kernel), else communicating, else
  copying, else idle.
- Steps (DESIGN.md "Steps"): the CPU `ProfilerStep#N` spans; an activity belongs to the step whose
  span holds its launch call (found by `correlation`; a host op is its own launch); a step's
  window ends when the last activity it launched ends, or its span ends if later, never before
  the previous window's end, and begins where the previous one ended (the first at its span's
  start). A file without ProfilerStep spans is one window from its first timed event to its last.
- A rank's split is the mean over its steps of each step's state fractions.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from pathlib import Path
from typing import Any

STATES = ("compute", "comm", "copy", "idle")
_KERNEL = {"kernel"}
_COPY = {"gpu_memcpy", "gpu_memset", "memcpy", "memset"}
# Timed host categories; `Trace`-like spans and flow/instant events carry no work.
_TIMED = {"cpu_op", "operator", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "runtime",
          "kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "gpu_user_annotation"}


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        doc: dict[str, Any] = json.load(f)
    return doc


def _ns(us: float) -> int:
    return round(float(us) * 1000)


def _span(e: dict[str, Any]) -> tuple[int, int]:
    start = _ns(e["ts"])
    return start, start + _ns(e.get("dur", 0))


def activities(events: list[dict[str, Any]]) -> tuple[list[tuple[int, int, str, int | None]], bool]:
    """(start, end, state, launch ts) per activity, and whether they are GPU activities."""
    xs = [e for e in events if e.get("ph") == "X" and "ts" in e]
    gpu = [e for e in xs if str(e.get("cat", "")).lower() in _KERNEL | _COPY]
    if gpu:
        launch = {}
        for e in xs:
            cat = str(e.get("cat", "")).lower()
            corr = (e.get("args") or {}).get("correlation")
            if cat in ("cuda_runtime", "cuda_driver", "runtime") and corr:
                launch[corr] = _ns(e["ts"])
        out: list[tuple[int, int, str, int | None]] = []
        for e in gpu:
            cat = str(e["cat"]).lower()
            name = str(e.get("name", "")).lower()
            state = "copy" if cat in _COPY else "comm" if ("nccl" in name or "rccl" in name) else "compute"
            out.append((*_span(e), state, launch.get((e.get("args") or {}).get("correlation"))))
        return out, True
    host: list[tuple[int, int, str, int | None]] = []
    for e in xs:
        name, cat = str(e.get("name", "")), str(e.get("cat", "")).lower()
        if cat in ("cpu_op", "operator") and name.startswith("aten::"):
            host.append((*_span(e), "compute", _ns(e["ts"])))
        elif name.startswith("gloo:"):
            host.append((*_span(e), "comm", _ns(e["ts"])))
    return host, False


def step_windows(events: list[dict[str, Any]], acts: list[tuple[int, int, str, int | None]]) -> list[tuple[int, int, int]]:
    """(ProfilerStep number, window start, window end) per step, per DESIGN.md "Steps"."""
    spans = sorted(
        (*_span(e), int(e["name"].split("#")[1]))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
        and "gpu" not in str(e.get("cat", "")).lower()
    )
    if not spans:
        timed = [_span(e) for e in events if e.get("ph") == "X" and "ts" in e
                 and str(e.get("cat", "")).lower() in _TIMED]
        return [(0, min(s for s, _ in timed), max(t for _, t in timed))]
    starts = [s for s, _, _ in spans]
    last_end = [t for _, t, _ in spans]
    for _, end, _, launch in acts:
        if launch is None:
            continue
        i = bisect.bisect_right(starts, launch) - 1
        if i >= 0 and launch <= spans[i][1]:
            last_end[i] = max(last_end[i], end)
    out, prev = [], spans[0][0]
    for (_, _, number), end in zip(spans, last_end, strict=True):
        end = max(end, prev)
        out.append((number, prev, end))
        prev = end
    return out


def state_time(acts: list[tuple[int, int, str, int | None]], lo: int, hi: int) -> dict[str, int]:
    """ns in each state within [lo, hi): a sweep over the activities' start and end points."""
    points = sorted({lo, hi} | {t for s, e, _, _ in acts for t in (s, e) if lo < t < hi})
    clipped = sorted((max(s, lo), min(e, hi), state) for s, e, state, _ in acts if s < hi and e > lo and e > s)
    out = dict.fromkeys(STATES, 0)
    running: list[tuple[int, str]] = []     # (end, state) of the activities begun so far
    j = 0
    for a, b in zip(points, points[1:], strict=False):
        while j < len(clipped) and clipped[j][0] <= a:
            running.append((clipped[j][1], clipped[j][2]))
            j += 1
        running = [r for r in running if r[0] > a]
        live = {state for _, state in running}
        state = next((s for s in STATES[:3] if s in live), "idle")
        out[state] += b - a
    return out


def split(paths: list[Path], skip_steps: set[int] | None = None) -> dict[str, float]:
    """Each state's share of the summed step windows of one rank's files (its capture windows),
    less `skip_steps`: seconds over seconds, as the report's ledger is (docs/ledger.md)."""
    rows = []
    for path in paths:
        events = load(path)["traceEvents"]
        acts, _ = activities(events)
        for number, lo, hi in step_windows(events, acts):
            if number in (skip_steps or set()) or hi <= lo:
                continue
            t = state_time(acts, lo, hi)
            rows.append({**{s: t[s] for s in STATES}, "window": hi - lo})
    total = sum(r["window"] for r in rows)
    return {s: sum(r[s] for r in rows) / total for s in STATES}


def python_frames_in_gaps(path: Path, skip_steps: set[int] | None = None) -> dict[str, int]:
    """A CPU-only file's idle time (no host activity on any thread) in its steps, less
    `skip_steps`, by the innermost `python_function` frame of the thread with the most aten op
    time, "" where none holds it; a built-in's name without the object it was called on (MFU013,
    docs/ledger.md). No data loader spans: the captures checked with it have none."""
    events = load(path)["traceEvents"]
    acts, gpu = activities(events)
    assert not gpu
    busy: dict[Any, int] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "operator") and str(e.get("name")).startswith("aten::"):
            busy[e.get("tid")] = busy.get(e.get("tid"), 0) + _ns(e.get("dur", 0))
    thread = max(busy, key=lambda t: busy[t])
    frames = [(*_span(e), str(e["name"])) for e in events
              if e.get("ph") == "X" and e.get("cat") == "python_function" and e.get("tid") == thread]
    out: dict[str, int] = {}
    for number, lo, hi in step_windows(events, acts):
        if number in (skip_steps or set()):
            continue
        edges = {t for s, e, _, _ in acts for t in (s, e)} | {t for s, e, _ in frames for t in (s, e)}
        points = sorted({lo, hi} | {t for t in edges if lo < t < hi})
        for a, b in zip(points, points[1:], strict=False):
            if any(s <= a < e for s, e, _, _ in acts):
                continue
            holding = [(s, -e, name) for s, e, name in frames if s <= a < e]
            name = re.sub(r" of .+ object at 0x[0-9a-fA-F]+>$", ">", max(holding)[2]) if holding else ""
            out[name] = out.get(name, 0) + b - a
    return out


# The ledger's buckets by the state each claims from (DESIGN.md's ledger table): the compute pool
# is split by FLOPs, stragglers wait inside communication, the rest of idle is split by cause.
# The pipeline bubble claims both idle and send/recv-only time, so with a bubble the two are
# compared together.
COMPUTE = ("model_compute", "recompute", "thin_gemm", "gemm_inefficiency", "non_matmul")
COMM = ("exposed_comm", "straggler")
IDLE = ("dataloader", "host_bound", "idle_other")


def ledger_states(ledger: dict[str, float]) -> dict[str, float]:
    return {"compute": sum(ledger[b] for b in COMPUTE), "comm": sum(ledger[b] for b in COMM),
            "copy": ledger["memcpy"], "idle": sum(ledger[b] for b in IDLE), "bubble": ledger["pipeline_bubble"]}


def mismatch(report: dict[str, Any], files_by_rank: dict[int, list[Path]]) -> dict[int, dict[str, tuple[float, float]]]:
    """{rank: {state: (diag's points, the independent sweep's points)}} where the two differ by
    more than half a point (issue 13's bar); empty when every rank agrees."""
    assert sorted(files_by_rank) == report["ranks"]
    out = {}
    for rank, files in files_by_rank.items():
        skip = {e["step"] for e in report["steps_excluded"] if e["rank"] == rank}
        ours, theirs = ledger_states(report["ledger_by_rank"][str(rank)]), split(files, skip)
        bubble = ours.pop("bubble")
        if bubble:
            ours["idle"] += ours.pop("comm") + bubble
            theirs["idle"] += theirs.pop("comm")
        bad = {s: (100 * ours[s], 100 * theirs[s]) for s in ours if abs(ours[s] - theirs[s]) > 0.005}
        if bad:
            out[rank] = bad
    return out
