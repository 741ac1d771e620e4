"""The TUI's SQL (tui/sql/views.sql), run on a reader cursor, returned as frozen results.

Nothing here imports Textual: the queries are tested and timed without a terminal, and every
result is immutable so a worker can hand it to a widget as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt

from diag.attribution.ledger import BUCKETS

# A DataTable fills at ~6k rows/s (DESIGN.md: 10k rows ≈ 1.6 s): ≤ 1k rows stays under ~0.2 s.
MAX_ROWS = 1000
STEP_TIME = "step_time"
METRICS = (STEP_TIME, *BUCKETS)

# A kernel launch call takes ~2–10 µs; one that takes 50 µs or more had the host waiting in the
# runtime (a synchronizing copy, a full launch queue): the host lane shows it as 'sync'.
SYNC_NS = 50_000

_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def _queries() -> dict[str, str]:
    text = (resources.files("tui") / "sql" / "views.sql").read_text()
    parts = _BLOCK.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def run(cur: duckdb.DuckDBPyConnection, name: str, **params: Any) -> list[tuple[Any, ...]]:
    return cur.execute(_queries()[name], params).fetchall()


# --- heatmap -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeatGrid:
    """Rank × step values of each metric: step time in seconds, buckets as fractions of the step."""

    ranks: tuple[int, ...]
    steps: tuple[int, ...]
    values: dict[str, npt.NDArray[np.float64]]    # metric → (ranks × steps), NaN where a rank lacks a step

    def value(self, metric: str, row: int, col: int) -> float | None:
        v = float(self.values[metric][row, col])
        return None if np.isnan(v) else v


def heat_grid(cur: duckdb.DuckDBPyConnection) -> HeatGrid:
    rows = run(cur, "heat_cells")
    ranks = tuple(sorted({r[0] for r in rows}))
    steps = tuple(sorted({r[1] for r in rows}))
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: i for i, s in enumerate(steps)}
    values = {m: np.full((len(ranks), len(steps)), np.nan) for m in METRICS}
    for rank, step, metric, value in rows:
        if metric in values and value is not None:
            values[metric][ri[rank], si[step]] = value
    for a in values.values():
        a.flags.writeable = False
    return HeatGrid(ranks, steps, values)


# --- timeline ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spans:
    """Intervals of one lane, aligned ns, sorted by start, each with a label (state or phase)."""

    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    label: tuple[str, ...]


@dataclass(frozen=True)
class Lanes:
    """One step of some ranks: what the timeline draws."""

    step: int
    ranks: tuple[int, ...]
    window_ns: dict[int, tuple[int, int]]         # rank → its aligned step window
    gpu: dict[int, Spans]                         # rank → GPU-state runs
    cpu: dict[int, Spans]                         # rank → host phases
    offsets_ns: dict[int, int]                    # rank → clock offset (aligned − own clock)
    path: dict[int, Spans] = field(default_factory=dict)   # rank → its part of the step's critical path

    @property
    def span_ns(self) -> tuple[int, int]:
        """From the earliest window start to the latest window end over the loaded ranks."""
        if not self.window_ns:
            return (0, 1)
        return (min(s for s, _ in self.window_ns.values()), max(e for _, e in self.window_ns.values()))


def _spans(rows: list[tuple[Any, ...]]) -> dict[int, Spans]:
    by_rank: dict[int, list[tuple[int, int, str]]] = {}
    for rank, *rest in rows:
        if rest[0] is not None and rest[1] is not None and rest[-1] is not None:
            by_rank.setdefault(rank, []).append((int(rest[0]), int(rest[1]), str(rest[-1])))
    out = {}
    for rank, items in by_rank.items():
        items.sort()
        out[rank] = Spans(np.array([i[0] for i in items], np.int64), np.array([i[1] for i in items], np.int64),
                          tuple(i[2] for i in items))
    return out


def lanes(cur: duckdb.DuckDBPyConnection, step: int, ranks: tuple[int, ...]) -> Lanes:
    windows = {r: (int(s), int(e)) for r, s, e in run(cur, "step_windows", step=step) if r in set(ranks)}
    segs = run(cur, "lane_segments", step=step, ranks=list(ranks))
    # lane_phases returns (rank, phase, start, end): reorder to (rank, start, end, label).
    phases = [(r, s, e, p) for r, p, s, e in run(cur, "lane_phases", step=step, ranks=list(ranks), sync_ns=SYNC_NS)]
    offsets = dict(cur.execute("SELECT rank, offset_ns FROM clock_offsets").fetchall())
    path = run(cur, "lane_path", step=step, ranks=list(ranks))
    return Lanes(step, ranks, windows, _spans(segs), _spans(phases),
                 {r: int(offsets.get(r, 0) or 0) for r in ranks}, _spans(path))


@dataclass(frozen=True)
class Activity:
    name: str
    op_name: str | None
    kclass: str
    collective: str | None
    phase: str | None
    stream: int | None
    ts_ns: int                 # the rank's own clock
    end_ns: int
    flops: float | None

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.ts_ns

    @property
    def tflops_per_s(self) -> float | None:
        return self.flops / self.dur_ns * 1e-3 if self.flops and self.dur_ns > 0 else None


@dataclass(frozen=True)
class UnderCursor:
    rank: int
    t0_ns: int                 # aligned
    t1_ns: int
    activities: tuple[Activity, ...]
    total: int                 # how many overlap, of which `activities` are the longest overlaps


def under_cursor(cur: duckdb.DuckDBPyConnection, rank: int, t0_ns: int, t1_ns: int, offset_ns: int,
                 limit: int = 50) -> UnderCursor:
    rows = run(cur, "under_cursor", rank=rank, t0_ns=t0_ns - offset_ns, t1_ns=t1_ns - offset_ns, limit=limit)
    acts = tuple(Activity(r[0] or "?", r[1], r[2] or "other", r[3], r[4], r[5], int(r[6]), int(r[7]),
                          None if r[8] is None or np.isnan(r[8]) else float(r[8])) for r in rows)
    return UnderCursor(rank, t0_ns, t1_ns, acts, int(rows[0][9]) if rows else 0)


# --- collectives ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectiveGroup:
    pg_name: str | None
    pg_desc: str | None
    collective: str | None
    size_log2: int             # power-of-two bucket of msg_bytes; -1: size unknown
    min_bytes: int | None
    max_bytes: int | None
    calls: int
    instances: int
    ranks: int
    group_size: int | None
    group_ranks: tuple[int, ...]   # empty when the trace does not list them
    time_s: float
    exposed_s: float
    wait_s: float
    busbw_gbps: float | None   # median over the calls
    last_rank: int | None      # arrived last most often
    last_count: int            # in that many instances

    @property
    def key(self) -> tuple[str | None, str | None, int]:
        return (self.pg_name, self.collective, self.size_log2)


def collective_groups(cur: duckdb.DuckDBPyConnection, limit: int = MAX_ROWS) -> tuple[CollectiveGroup, ...]:
    rows = run(cur, "collective_groups", limit=limit)
    return tuple(
        CollectiveGroup(r[0], r[1], r[2], int(r[3]), r[4], r[5], int(r[6]), int(r[7]), int(r[8]), r[9],
                        _rank_list(r[10]),
                        (r[11] or 0) * 1e-9, (r[12] or 0) * 1e-9, (r[13] or 0) * 1e-9, _num(r[14]), r[15],
                        int(r[16] or 0))
        for r in rows
    )


@dataclass(frozen=True)
class CollectiveInstance:
    instance: str
    step: int | None
    ranks: int
    msg_bytes: int | None
    max_dur_s: float
    max_wait_s: float
    wait_s: float             # summed over the ranks
    last_rank: int | None
    busbw_gbps: float | None
    aligned_ts_ns: int | None
    aligned_end_ns: int | None


def collective_instances(cur: duckdb.DuckDBPyConnection, key: tuple[str | None, str | None, int],
                         limit: int = MAX_ROWS) -> tuple[CollectiveInstance, ...]:
    rows = run(cur, "collective_instances", pg_name=key[0], collective=key[1], size_log2=key[2], limit=limit)
    return tuple(
        CollectiveInstance(r[0], r[1], int(r[2]), r[3], (r[4] or 0) * 1e-9, (r[5] or 0) * 1e-9, (r[6] or 0) * 1e-9,
                           r[7], _num(r[8]), r[9], r[10])
        for r in rows
    )


def _rank_list(text: str | None) -> tuple[int, ...]:
    # record_param_comms writes "[0, 1, 2, 3]"; long lists are cut with "..." and tell us nothing exact.
    if not text or "..." in text:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", text))


def _num(x: Any) -> float | None:
    return None if x is None or np.isnan(x) else float(x)


# --- live ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reported:
    """Which ranks have a trace for the latest capture window."""

    window: int | None
    ranks: tuple[int, ...]
    world_size: int | None

    @property
    def missing(self) -> tuple[int, ...]:
        if self.world_size is None:
            return ()
        return tuple(sorted(set(range(self.world_size)) - set(self.ranks)))


def reported(cur: duckdb.DuckDBPyConnection) -> Reported:
    rows = run(cur, "capture_windows")
    if not rows:
        return Reported(None, (), None)
    window = max(r[0] for r in rows if r[0] is not None) if any(r[0] is not None for r in rows) else None
    ranks = tuple(sorted({r[1] for r in rows if r[0] == window}))
    worlds = [r[2] for r in rows if r[2]]
    return Reported(window, ranks, max(worlds) if worlds else None)


def gpus_per_node(cur: duckdb.DuckDBPyConnection) -> int | None:
    row = run(cur, "gpus_per_node")
    return int(row[0][0]) if row and row[0][0] else None


# --- formatting shared by the views ----------------------------------------------------------------


def fmt_ranks(xs: tuple[int, ...] | list[int], limit: int = 8) -> str:
    """Sorted integers as runs: 0–3, 8, 10–15; at most `limit` runs, then how many more there are."""
    runs: list[tuple[int, int]] = []
    for x in sorted(set(xs)):
        if runs and x == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    text = ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs[:limit])
    if len(runs) > limit:
        rest = sum(b - a + 1 for a, b in runs[limit:])
        text += f" … (+{rest})"
    return text or "–"


def fmt_seconds(s: float | None) -> str:
    """A duration in the unit that keeps 3–4 significant digits: 1.23 s, 12.3 ms, 45.6 µs, 789 ns."""
    if s is None:
        return "–"
    if s == 0:
        return "0"
    a = abs(s)
    if a >= 1:
        return f"{s:.3g} s" if a < 100 else f"{s:.0f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.3g} ms" if a < 0.1 else f"{s * 1e3:.0f} ms"
    if a >= 1e-6:
        return f"{s * 1e6:.3g} µs" if a < 1e-4 else f"{s * 1e6:.0f} µs"
    return f"{s * 1e9:.0f} ns"
