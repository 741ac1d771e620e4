"""Ranks for traces that carry none, and the runs a store holds.

The rules (DESIGN.md "Cross-rank reconstruction"), in order: `distributedInfo.rank`; else a rank
in the file name (diag/ingest/discover.py); else by process. A process is its hostname and pid:
the name `<hostname>_<pid>.<time_ns>.pt.trace.json` that tensorboard_trace_handler writes by
default gives both, else the pid its CPU events carry. One process (a lone file, or several
files of one hostname/pid) is rank 0; several are ranks 0..n−1 in (hostname, pid) order, skipping
ranks other files already hold. Several files of one rank are its capture windows (a schedule
with several cycles writes one file per cycle), numbered by their first timestamp.

Files of one store are one run unless they cannot be: different world sizes or GPUs, or captures
of different processes hours apart. Those are refused, not merged.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import msgspec
from msgspec.structs import replace

from diag.ingest.discover import name_parts
from diag.ingest.kineto_tabulate import SCHEMAS
from diag.runtime import store
from diag.runtime.errors import BadInput
from diag.runtime.sanitize import storable

# Captures of one run's ranks overlap, or follow each other by the seconds to minutes between
# profiler cycles; a capture of another process an hour from any other is another run.
RUN_GAP_NS = 3600 * 10**9
# Runs named in the refusal; the message stays one line.
_LISTED = 5


class _Process(msgspec.Struct, frozen=True):
    file_id: int
    path: str
    host: str
    pid: int | None

    @property
    def key(self) -> tuple[str, int, str]:
        """Hostname, pid; a file whose pid is unknown is a process of its own."""
        return (self.host, -1, self.path) if self.pid is None else (self.host, self.pid, "")

    def describe(self) -> str:
        who = [f"host {self.host}"] if self.host else []
        return " ".join(who + ([f"pid {self.pid}"] if self.pid is not None else [])) or "pid unknown"


def assign_by_process(con: duckdb.DuckDBPyConnection, file_ids: list[int]) -> list[str]:
    """Give each of these rank-less Kineto files the rank of its process (rank_source 'process'):
    the rank an earlier file of that process holds (a live run's next cycle), else the next free one.
    Returns one warning per file, `<path>: <what it was given>` (also kept with the file)."""
    if not file_ids:
        return []
    ids = store.id_set(file_ids)
    pending = [p for p, _ in _processes(con, f"file_id IN ({ids})")]
    known = {p.key: r for p, r in _processes(con, f"rank_source = 'process' AND file_id NOT IN ({ids})")}
    taken = {r for (r,) in con.execute("SELECT DISTINCT rank FROM trace_files WHERE kind = 'kineto' "
                                       f"AND rank IS NOT NULL AND file_id NOT IN ({ids})").fetchall()}
    new = sorted({p.key for p in pending} - known.keys())
    free = (r for r in range(len(taken) + len(new)) if r not in taken)
    rank_of = {**known, **dict(zip(new, free, strict=False))}
    processes = len({p.key for p in pending} | known.keys())
    how = "the only process" if processes == 1 else f"of {processes} processes numbered by hostname, then pid"
    warnings = []
    for p in pending:
        warning = f"no rank in the trace or its name: rank {rank_of[p.key]}, {how} ({p.describe()})"
        _add_warning(con, p.file_id, warning)
        warnings.append(f"{p.path}: {warning}")
    cases = " ".join(f"WHEN {p.file_id} THEN {rank_of[p.key]}" for p in pending)
    for table in (*SCHEMAS, "trace_files"):
        con.execute(f"UPDATE {table} SET rank = CASE file_id {cases} END WHERE file_id IN ({ids})")
    con.execute(f"UPDATE trace_files SET rank_source = 'process' WHERE file_id IN ({ids})")
    return warnings


def _processes(con: duckdb.DuckDBPyConnection, where: str) -> list[tuple[_Process, int]]:
    """The process and rank of each Kineto file matching `where`: hostname and pid from the name
    tensorboard_trace_handler gives it, else the pid its CPU events (or runtime calls) carry."""
    rows = con.execute(
        f"""
        SELECT f.file_id, f.path, f.rank,
               coalesce((SELECT mode(pid) FROM cpu_ops c WHERE c.file_id = f.file_id),
                        (SELECT mode(pid) FROM runtime_calls r WHERE r.file_id = f.file_id))
        FROM trace_files f WHERE kind = 'kineto' AND {where} ORDER BY f.file_id
        """
    ).fetchall()
    out = []
    for file_id, path, rank, content_pid in rows:
        name = name_parts(path)
        out.append((_Process(file_id, path, name.host or "", name.pid if name.pid is not None else content_pid), rank))
    return out


def _add_warning(con: duckdb.DuckDBPyConnection, file_id: int, warning: str) -> None:
    row = con.execute("SELECT warnings FROM trace_files WHERE file_id = ?", [file_id]).fetchall()[0]
    warnings = json.loads(row[0]) if row[0] else []
    con.execute("UPDATE trace_files SET warnings = ? WHERE file_id = ?", [storable(json.dumps([*warnings, warning], ensure_ascii=False)), file_id])


class _Capture(msgspec.Struct, frozen=True):
    file_id: int
    path: str
    world: int | None
    device: str | None
    first_ns: int
    last_ns: int
    process: tuple[str, int] | None     # (hostname, pid) where known


def check_one_run(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a store whose Kineto files are several unrelated runs, naming each."""
    captures = [
        _Capture(f, path, world, device, first, last, None)
        for f, path, world, device, first, last in con.execute(
            "SELECT file_id, path, world_size, device_name, coalesce(first_ts_ns, 0), coalesce(last_ts_ns, 0) "
            "FROM trace_files WHERE kind = 'kineto' ORDER BY first_ts_ns, file_id"
        ).fetchall()
    ]
    runs = _runs(captures)
    if len(runs) > 1:
        # Only now does it matter who wrote each capture (a process's cycles hours apart are one
        # run): its pid is a scan of the file's CPU events, too slow to make for every analysis.
        process = {p.file_id: p for p, _ in _processes(con, "TRUE")}
        captures = [replace(c, process=process[c.file_id].key[:2] if process[c.file_id].pid is not None else None)
                    for c in captures]
        runs = _runs(captures)
    if len(runs) > 1:
        listed = " | ".join(f"run {i + 1}: {_describe(r)}" for i, r in enumerate(runs[:_LISTED]))
        if len(runs) > _LISTED:
            listed += f" | and {len(runs) - _LISTED} more"
        raise BadInput(captures[0].path, f"{len(runs)} unrelated runs in one input ({listed}); they differ in "
                                         "world size, GPU or time (hours apart): analyze each run on its own")


def _runs(captures: list[_Capture]) -> list[list[_Capture]]:
    """Captures in time order, joined while each starts within RUN_GAP_NS of those before it, and
    wherever one process wrote them; then split where world sizes or GPUs differ."""
    parent = list(range(len(captures)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    reach: int | None = None
    seen: dict[tuple[str, int], int] = {}
    for i, c in enumerate(captures):
        if reach is not None and c.first_ns - reach <= RUN_GAP_NS:
            parent[find(i)] = find(i - 1)
        reach = c.last_ns if reach is None else max(reach, c.last_ns)
        if c.process is not None:
            if c.process in seen:
                parent[find(i)] = find(seen[c.process])
            seen[c.process] = i
    runs: dict[tuple[int, int | None, str | None], list[_Capture]] = {}
    for i, c in enumerate(captures):
        runs.setdefault((find(i), c.world, c.device), []).append(c)
    # A file that does not say its world size or GPU belongs with the one run beside it that does.
    out: dict[tuple[int, int | None, str | None], list[_Capture]] = {}
    for key, group in runs.items():
        root, world, device = key
        fits = [k for k in runs if k[0] == root and k != key and (world is None or k[1] == world)
                and (device is None or k[2] == device) and (k[1] is not None or k[2] is not None)]
        out.setdefault(fits[0] if (world is None or device is None) and len(fits) == 1 else key, []).extend(group)
    return list(out.values())


def _describe(run: list[_Capture]) -> str:
    worlds = sorted({c.world for c in run if c.world is not None})
    devices = sorted({c.device for c in run if c.device is not None})
    names = [Path(c.path).name for c in run]
    what = [f"{len(names)} file(s): " + ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")]
    if worlds:
        what.append(f"world size {'/'.join(map(str, worlds))}")
    if devices:
        what.append("/".join(devices))
    return "; ".join(what)


def rank_notes(con: duckdb.DuckDBPyConnection) -> list[str]:
    """What the report says about ranks that no trace named, merged files and capture windows."""
    notes = []
    process = con.execute(
        "SELECT rank, min(path) FROM trace_files WHERE kind = 'kineto' AND rank_source = 'process' "
        "GROUP BY rank ORDER BY rank"
    ).fetchall()
    if len(process) > 1:
        shown = ", ".join(f"rank {r} = {Path(p).name}" for r, p in process)
        notes.append(f"no trace or file name gave a rank: ranks {process[0][0]}..{process[-1][0]} numbered by "
                     f"process (hostname, then pid): {shown}")
    elif process:
        notes.append(f"no trace or file name gave a rank: one process, taken as rank {process[0][0]}")
    for path, n, lo, hi in con.execute(
        "SELECT path, count(*), min(rank), max(rank) FROM trace_files WHERE kind = 'kineto' AND rank_source = 'merged' "
        "GROUP BY path ORDER BY path"
    ).fetchall():
        notes.append(f"{Path(path).name} merges {n} ranks ({lo}..{hi}): split into one timeline per rank")
    windows = con.execute(
        "SELECT count(*), min(n), max(n) FROM (SELECT count(*) AS n FROM trace_files WHERE kind = 'kineto' "
        "GROUP BY rank HAVING count(*) > 1)"
    ).fetchall()[0]
    if windows[0]:
        each = str(windows[1]) if windows[1] == windows[2] else f"{windows[1]}–{windows[2]}"
        notes.append(f"{windows[0]} rank(s) with {each} capture windows each (one file per profiler cycle), "
                     "analyzed together")
    return notes
