"""What a finding's evidence ids point at, in words: `act:1:1494` is "rank 1 step 551: gemm
ampere_sgemm_128x64_nn (aten::mm), 812.4 µs". The TUI jumps to the place (tui/views), the HTML page
names it; the ids themselves (diag.attribution.analysis.Finding.evidence) stay the report's contract.
The queries are diag/sql/evidence.sql.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from diag.runtime import store


@dataclass(frozen=True)
class Place:
    """Where a piece of evidence is: a rank's step in the timeline, and/or a collectives row."""

    label: str                                          # what the evidence is, one line
    rank: int | None = None
    step: int | None = None
    ts_ns: int | None = None                            # aligned
    end_ns: int | None = None
    collective_key: tuple[str | None, str | None, int] | None = None
    instance: str | None = None
    name: str | None = None                             # the kernel's full name, for an activity


def _run(cur: duckdb.DuckDBPyConnection, name: str, **params: object) -> list[tuple[object, ...]]:
    return cur.execute(store.named_queries("evidence.sql")[name], params).fetchall()


def resolve(cur: duckdb.DuckDBPyConnection, evidence_id: str) -> Place:
    """An evidence id of a finding (diag.attribution.analysis.Finding) → the place that shows it."""
    kind, _, rest = evidence_id.partition(":")
    try:
        if kind == "act":
            file_id, index = (int(x) for x in rest.split(":"))
            rows = _run(cur, "activity_by_index", file_id=file_id, index=index)
            if rows:
                rank, step, name, kclass, op, ts, end, _ = rows[0]
                what = f"{kclass} {name}" + (f" ({op})" if op else "")
                return Place(f"rank {rank} step {step}: {what}, {(end - ts) / 1e3:.1f} µs",   # type: ignore[operator]
                             rank, step, ts, end, name=name)   # type: ignore[arg-type]
        elif kind == "coll":
            rows = _run(cur, "instance_by_id", instance=rest)
            if rows:
                pg, desc, coll, size_log2, step, last, wait, ts, end, nbytes = rows[0]
                return Place(f"{coll} on {pg_label(pg, desc)}, {fmt_bytes(nbytes)}, step {step}: last rank {last}, "   # type: ignore[arg-type]
                             f"others waited up to {(wait or 0) / 1e6:.2f} ms",   # type: ignore[operator]
                             last, step, ts, end, (pg, coll, int(size_log2)), rest)   # type: ignore[arg-type, call-overload]
        elif kind == "step":
            rank, step = (int(x) for x in rest.split(":"))
            rows = _run(cur, "step_time", rank=rank, step=step)
            took = f", {rows[0][0] / 1e6:.2f} ms" if rows and rows[0][0] is not None else ""   # type: ignore[operator]
            return Place(f"rank {rank} step {step}{took}", rank, step)
    except ValueError:
        pass
    return Place(f"{evidence_id} (not found in the trace)")


def pg_label(name: str | None, desc: str | None) -> str:
    if desc and name and desc != name:
        return f"{desc} ({name})"
    return desc or name or "unknown group"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "size ?"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"
