"""`diag export --perfetto`: every rank's trace on the aligned clock, with the ledger on it, as one
Chrome trace-event JSON (the format Perfetto's UI and chrome://tracing open). docs/export.md gives
the track layout.

Written streaming: the source events come from the store one rank at a time as JSON text made by
DuckDB (sql/export.sql), and the ledger lanes from one rank's timeline at a time.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import duckdb
import msgspec
import numpy as np

from diag.attribution.critical_path import aligned_offsets
from diag.attribution.digest import name_collectives
from diag.attribution.ledger import BUCKETS
from diag.attribution.mesh import DIM_ORDER, Mesh
from diag.engine.run import Analysis
from diag.runtime import store
from diag.runtime.errors import BadInput
from diag.timeline.collectives import Matched, wait_intervals
from diag.timeline.rank import load_rank
from diag.timeline.states import LANES, ledger_runs

# diag's own tracks in each rank's process (thread ids below the source threads' 10..).
LEDGER_TID, STEPS_TID, FINDINGS_TID, OTHER_TID, PATH_TID = 1, 2, 3, 4, 5
TRACK_NAMES = {LEDGER_TID: "diag.ledger", STEPS_TID: "diag.steps", FINDINGS_TID: "diag.findings",
               OTHER_TID: "trace spans, counters & instants", PATH_TID: "diag.critical_path"}
# A track per process group a rank's collectives ran on (attribution/mesh.py names its dimension):
# the four tids left below the source threads; a rank with traffic on more groups shares the last.
GROUP_TIDS = (6, 7, 8, 9)
# A waiting rank's collective gets an arrow to the late rank's when it waited longer than this.
MIN_FLOW_WAIT_NS = 10_000
# Flow ids of the wait arrows, above the source flows' (file_id · 2^32 + n) range.
WAIT_FLOW_ID0 = 1 << 52
ROWS_PER_FETCH = 50_000


class Cut(msgspec.Struct, frozen=True):
    """What to export: None means all."""

    ranks: frozenset[int] | None = None
    steps: frozenset[int] | None = None


# Ranks and steps an export can name: a million is past any job's ranks (a 100k-GPU job) and steps.
_MAX_LISTED = 1_000_000


def parse_ranges(text: str, what: str) -> frozenset[int]:
    """`0-7,64` → {0..7, 64}. At most _MAX_LISTED numbers: `0-99999999999` was built as a set of
    10^11 integers (OOM-killed)."""
    out: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d{1,30})\s*(?:-\s*(\d{1,30})\s*)?", part)
        if not m or (m[2] is not None and int(m[2]) < int(m[1])):
            raise BadInput(what, f"{text[:80]!r} is not a list of numbers and ranges like 0-7,64")
        first, last = int(m[1]), int(m[2] or m[1])
        if last - first + 1 + len(out) > _MAX_LISTED:
            raise BadInput(what, f"{text[:80]!r} lists more than {_MAX_LISTED:,} numbers")
        out.update(range(first, last + 1))
    return frozenset(out)



@contextmanager
def _open_out(path: Path) -> Iterator[IO[str]]:
    """The export's file; a write that fails (a full disk, /dev/full) is BadInput naming it."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as f:
                yield f
        else:
            with path.open("w", encoding="utf-8") as f:
                yield f
    except OSError as e:
        raise BadInput(str(path), f"cannot write: {e.strerror or e}") from None


class _Writer:
    """The traceEvents array, one event a line."""

    def __init__(self, f: IO[str]) -> None:
        self.f = f
        self.n = 0

    def raw(self, text: str) -> None:
        self.f.write(("\n" if self.n == 0 else ",\n") + text)
        self.n += 1

    def event(self, ev: dict[str, Any]) -> None:
        self.raw(json.dumps(ev, separators=(",", ":"), allow_nan=False))


def export_perfetto(con: duckdb.DuckDBPyConnection, a: Analysis, report: dict[str, Any], out: Path,
                    cut: Cut = Cut()) -> int:
    """Write the export of an analyzed store to `out`; returns the number of events written."""
    run = a.run
    ranks = sorted({r.rank for r in run.ranks if cut.ranks is None or r.rank in cut.ranks})
    if not ranks:
        raise BadInput("--ranks", f"none of the ranks {sorted(cut.ranks or [])} is in the trace "
                                  f"(it has {sorted({r.rank for r in run.ranks})})")
    offset = {r: (run.offsets[r].offset_ns if r in run.offsets else 0) for r in ranks}
    windows = _windows(con, ranks, cut.steps)
    ranks = [r for r in ranks if r in windows]   # --steps: a rank without those steps has nothing to show
    origin = min(lo + offset[r] for r, (lo, _) in windows.items())
    con.execute(store.sql_text("export.sql"))
    waits = wait_intervals(run.matched)
    aligned = aligned_offsets(run)   # the critical path's clock: a rank no match links stays unshifted
    by_rank: dict[int, list[Matched]] = defaultdict(list)
    for m in run.matched:
        if m.call.pg_name != "unknown" and (cut.steps is None or m.call.step in cut.steps):
            by_rank[m.call.rank].append(m)
    with _open_out(out) as f:
        f.write('{"displayTimeUnit":"ns","otherData":')
        f.write(json.dumps({
            "diag": "diag export --perfetto", "origin_ns": origin,
            # as the report writes them: null for a rank no collective links to the others (left unshifted)
            "clock_offsets_us": {str(r): offset[r] / 1000 if r in run.offsets and run.offsets[r].linked else None
                                 for r in ranks},
            "mfu": report.get("mfu"), "hfu": report.get("hfu"), "device": report.get("device"),
        }, separators=(",", ":")))
        f.write(',"traceEvents":[')
        w = _Writer(f)
        for r in ranks:
            _process(con, w, r, ranks.index(r))
            lo, hi = windows[r]
            cur = con.execute("SELECT e FROM export_events(?, ?, ?, ?, ?)", [r, offset[r], origin, lo, hi])
            while rows := cur.fetchmany(ROWS_PER_FETCH):
                for (e,) in rows:
                    w.raw(e)
            _ledger_track(con, w, a, waits, r, offset[r], origin, cut.steps)
            _steps_track(w, a, r, offset[r], origin, cut.steps)
            _findings_track(con, w, a, r, offset[r], origin, cut.steps)
            _path_track(con, w, r, offset[r] - aligned.get(r, 0), origin, cut.steps)
            _group_tracks(w, run.mesh, r, by_rank.get(r, []), offset[r], origin)
        _wait_flows(con, w, set(ranks), offset, origin, cut.steps)
        f.write("\n]}\n")
    return w.n


def _windows(con: duckdb.DuckDBPyConnection, ranks: list[int], steps: frozenset[int] | None) -> dict[int, tuple[int, int]]:
    """Per rank, the span of its own clock to export: the whole trace, or the chosen steps' GPU
    windows and CPU spans."""
    if steps is None:
        # Kineto's own spans and instants (other_events) can lie outside the typed events' extent.
        rows = con.execute(
            "SELECT rank, min(lo), max(hi) FROM (SELECT rank, first_ts_ns AS lo, last_ts_ns AS hi FROM trace_files "
            "WHERE kind = 'kineto' UNION ALL SELECT rank, ts_ns, ts_ns + coalesce(dur_ns, 0) FROM other_events "
            "WHERE ph IN ('X', 'C', 'i', 'I')) GROUP BY rank").fetchall()
    else:
        rows = con.execute(
            "SELECT rank, min(least(start_ns, cpu_start_ns)), max(greatest(end_ns, cpu_end_ns)) FROM steps "
            "WHERE list_contains(?, step) GROUP BY rank", [sorted(steps)]).fetchall()
    got = {int(r): (int(lo), int(hi) + 1) for r, lo, hi in rows if r in ranks and lo is not None}
    if not got:
        raise BadInput("--steps", f"no step {sorted(steps or [])} on ranks {ranks}")
    return got


def _process(con: duckdb.DuckDBPyConnection, w: _Writer, rank: int, order: int) -> None:
    row = con.execute("SELECT any_value(path), any_value(device_name) FROM trace_files "
                      "WHERE kind = 'kineto' AND rank = ?", [rank]).fetchone()
    path, device = row if row else (None, None)
    host = _host(path)
    label = ", ".join(x for x in (host, device) if x)
    w.event({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
             "args": {"name": f"rank {rank} ({label})" if label else f"rank {rank}"}})
    w.event({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": order}})
    for tid, name in TRACK_NAMES.items():
        _thread(w, rank, tid, name)
    threads = con.execute("SELECT gpu, a, b, out_tid FROM _export_threads WHERE rank = ? ORDER BY out_tid",
                          [rank]).fetchall()
    for gpu, a, b, tid in threads:
        _thread(w, rank, int(tid), f"stream {b} (GPU {a})" if gpu else f"thread {b} (pid {a})")


def _thread(w: _Writer, rank: int, tid: int, name: str) -> None:
    w.event({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
    w.event({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}})


def _host(path: str | None) -> str | None:
    """The host of a tensorboard_trace_handler file name `{hostname}_{pid}.{time_ns}.pt.trace.json`."""
    m = re.fullmatch(r"(.+)_\d+\.\d+\.pt\.trace\.json(?:\.gz)?", Path(path).name) if path else None
    return m[1] if m else None


def _us(ns: int, offset: int, origin: int) -> float:
    return (ns + offset - origin) / 1000.0


def _ledger_track(con: duckdb.DuckDBPyConnection, w: _Writer, a: Analysis, waits: dict[tuple[int, int], Any],
                  rank: int, offset: int, origin: int, steps: frozenset[int] | None) -> None:
    """Each instant of each step labelled with its ledger bucket (states.ledger_runs); `waits` are
    collectives.wait_intervals of the run."""
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    for d in (d for d in a.run.ranks if d.rank == rank):
        tl = load_rank(con, d.file_id)
        name_collectives(con, tl)   # as the analysis names them: a send/recv kernel may be an all-to-all
        runs = ledger_runs(tl, waits.get((d.rank, d.capture_window), none))
        step_no = np.asarray(tl.steps.step, np.int64)
        for i, s, e, lane in zip(runs.step.tolist(), runs.start_ns.tolist(), runs.end_ns.tolist(),
                                 runs.state.tolist(), strict=True):
            if steps is None or int(step_no[i]) in steps:
                w.event({"ph": "X", "cat": "diag.ledger", "name": LANES[lane], "pid": rank, "tid": LEDGER_TID,
                         "ts": _us(s, offset, origin), "dur": (e - s) / 1000.0})
        del tl


def _group_tracks(w: _Writer, mesh: Mesh | None, rank: int, calls: list[Matched], offset: int, origin: int) -> None:
    """This rank's collective calls, a track per process group (`diag.pg <name> (<dim>, <desc>)`), each
    call a slice with its instance, size and wait for the last rank."""
    if not calls:
        return
    dim = mesh.dim_of if mesh is not None else (lambda _: "other")
    names = sorted({m.call.pg_name for m in calls}, key=lambda n: (DIM_ORDER.get(dim(n), 99), len(n), n))
    tid = {n: GROUP_TIDS[min(i, len(GROUP_TIDS) - 1)] for i, n in enumerate(names)}
    desc = {m.call.pg_name: m.call.pg_desc for m in calls}
    for i, n in enumerate(names[:len(GROUP_TIDS)]):
        shared = i == len(GROUP_TIDS) - 1 and len(names) > len(GROUP_TIDS)
        _thread(w, rank, GROUP_TIDS[i], f"diag.pg: {len(names) - i} more groups" if shared else
                f"diag.pg {n} ({', '.join(x for x in (dim(n), desc[n]) if x)})")
    for m in calls:
        c = m.call
        w.event({"ph": "X", "cat": "diag.pg", "name": c.collective, "pid": rank, "tid": tid[c.pg_name],
                 "ts": _us(c.ts_ns, offset, origin), "dur": (c.end_ns - c.ts_ns) / 1000.0,
                 "args": {"pg": c.pg_name, "dim": dim(c.pg_name), "instance": m.instance, "step": c.step,
                          "msg_bytes": c.msg_bytes, "wait_us": m.wait_ns / 1000}})


def _steps_track(w: _Writer, a: Analysis, rank: int, offset: int, origin: int, steps: frozenset[int] | None) -> None:
    ledgers = {(lg.rank, lg.step): lg for lg in a.run.ledgers}
    for d in (d for d in a.run.ranks if d.rank == rank):
        st = d.steps
        for i, step in enumerate(st.step):
            if steps is not None and step not in steps:
                continue
            lg = ledgers.get((rank, step))
            args: dict[str, Any] = {"step": step, "window_s": (st.end_ns[i] - st.start_ns[i]) * 1e-9}
            if lg is not None:
                args["ledger_s"] = {b: lg.buckets[b] for b in BUCKETS}
                args["ledger_fraction"] = lg.fractions()
            w.event({"ph": "X", "cat": "diag.steps", "name": f"step {step}", "pid": rank, "tid": STEPS_TID,
                     "ts": _us(int(st.start_ns[i]), offset, origin), "dur": (st.end_ns[i] - st.start_ns[i]) / 1000.0,
                     "args": args})


def _findings_track(con: duckdb.DuckDBPyConnection, w: _Writer, a: Analysis, rank: int, offset: int, origin: int,
                    steps: frozenset[int] | None) -> None:
    """A slice per finding instance on this rank: each activity and collective its evidence names
    (act:<file>:<i>, coll:<instance>), else each step it names (step:<rank>:<step>), else an instant at the first step it involves."""
    files = {d.file_id for d in a.run.ranks if d.rank == rank}
    windows = {(d.rank, s): (int(d.steps.start_ns[i]), int(d.steps.end_ns[i]))
               for d in a.run.ranks if d.rank == rank for i, s in enumerate(d.steps.step)}
    for f in a.findings:
        args = {"code": f.code, "slug": f.slug, "severity": f.severity, "summary": f.summary, "advice": f.advice,
                "lost_fraction": f.lost_fraction}
        spans: list[tuple[int, int]] = []
        acts = [(int(fid), int(i)) for e in f.evidence if (m := re.fullmatch(r"act:(\d+):(\d+)", e))
                for fid, i in [m.groups()] if int(fid) in files]
        for fid, i in acts:
            row = con.execute("SELECT ts_ns, end_ns, step FROM activities WHERE file_id = ? AND idx = ?",
                              [fid, i]).fetchone()
            if row and (steps is None or row[2] in steps):
                spans.append((int(row[0]), int(row[1])))
        for inst in (e.removeprefix("coll:") for e in f.evidence if e.startswith("coll:")):
            spans.extend((int(s), int(e)) for s, e, step in con.execute(
                "SELECT ts_ns, end_ns, step FROM collectives WHERE instance = ? AND rank = ?", [inst, rank]).fetchall()
                if steps is None or step in steps)
        if not acts and not spans:
            named = [(int(r), int(s)) for e in f.evidence if (m := re.fullmatch(r"step:(\d+):(\d+)", e))
                     for r, s in [m.groups()]]
            spans = [windows[k] for k in named if k in windows and (steps is None or k[1] in steps)]
        if not acts and not spans and rank in f.ranks:
            first = [windows[(rank, s)] for s in f.steps if (rank, s) in windows and (steps is None or s in steps)]
            if first:
                w.event({"ph": "i", "s": "t", "cat": "diag.findings", "name": f.code, "pid": rank,
                         "tid": FINDINGS_TID, "ts": _us(first[0][0], offset, origin), "args": args})
        for s, e in spans:
            w.event({"ph": "X", "cat": "diag.findings", "name": f.code, "pid": rank, "tid": FINDINGS_TID,
                     "ts": _us(s, offset, origin), "dur": (e - s) / 1000.0, "args": args})


def _path_track(con: duckdb.DuckDBPyConnection, w: _Writer, rank: int, shift: int, origin: int,
                steps: frozenset[int] | None) -> None:
    """The part of each step's critical path on this rank (the store's `critical_path`), one slice
    per segment named after its kind; `shift` takes the path's clock to the export's."""
    for step, seq, kind, s, e, what in con.execute(
            "SELECT step, seq, kind, start_ns, end_ns, what FROM critical_path WHERE rank = ? ORDER BY step, seq",
            [rank]).fetchall():
        if steps is None or step in steps:
            w.event({"ph": "X", "cat": "diag.critical_path", "name": kind, "pid": rank, "tid": PATH_TID,
                     "ts": _us(int(s), shift, origin), "dur": (e - s) / 1000.0,
                     "args": {"step": step, "seq": seq, "what": what}})


def _wait_flows(con: duckdb.DuckDBPyConnection, w: _Writer, ranks: set[int], offset: dict[int, int], origin: int,
                steps: frozenset[int] | None) -> None:
    """An arrow from each waiting rank's collective to the late rank's, per matched instance with a
    wait over MIN_FLOW_WAIT_NS, both ends on the streams the kernels ran on."""
    rows = con.execute(
        """
        WITH c AS (
            SELECT c.rank, c.step, c.instance, c.collective, c.ts_ns, c.wait_ns, c.last_rank, t.out_tid
            FROM collectives c
            JOIN activities a ON a.file_id = c.file_id AND a.ts_ns = c.ts_ns AND a.end_ns = c.end_ns
                             AND a.kclass = 'comm'
            JOIN kernels k ON k.file_id = a.file_id AND k.ts_ns = a.ts_ns AND k.correlation IS NOT DISTINCT FROM a.correlation
            JOIN _export_threads t ON t.rank = c.rank AND t.gpu AND t.a = k.device AND t.b = k.stream
        )
        SELECT DISTINCT ON (w.rank, w.instance) w.rank, w.ts_ns, w.wait_ns, w.out_tid, w.instance, w.collective,
               l.rank, l.ts_ns, l.out_tid, w.step
        FROM c w JOIN c l ON l.instance = w.instance AND l.rank = w.last_rank
        WHERE w.wait_ns > ? AND w.rank <> w.last_rank
        ORDER BY w.rank, w.instance
        """, [MIN_FLOW_WAIT_NS]).fetchall()
    n = WAIT_FLOW_ID0
    for wr, wts, wait, wtid, inst, coll, lr, lts, ltid, step in rows:
        if wr not in ranks or lr not in ranks or (steps is not None and step not in steps):
            continue
        n += 1
        common = {"cat": "diag.wait", "name": f"waited {wait / 1000:.0f} µs for rank {lr}", "id": n}
        w.event({**common, "ph": "s", "pid": wr, "tid": int(wtid), "ts": _us(int(wts), offset[wr], origin),
                 "args": {"instance": inst, "collective": coll, "wait_us": wait / 1000}})
        w.event({**common, "ph": "f", "bp": "e", "pid": lr, "tid": int(ltid), "ts": _us(int(lts), offset[lr], origin)})
