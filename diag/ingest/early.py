"""The one door the command layer uses to start a big file's work early: its read, in a process of
its own, while the command imports; then its parse, before DuckDB and the analysis are imported
(diag/ingest/read_ahead.py does both)."""

from __future__ import annotations


def start_reading(path: str, max_bytes: int, salvage: bool) -> None:
    """`analyze FILE` or `ingest FILE`: the file's read begins now, in a process of its own, while
    the command imports what it needs (diag/ingest/read_ahead.py)."""
    from diag.ingest import read_ahead

    read_ahead.start(path, max_bytes, salvage)


def begin_parse(path: str, max_bytes: int, salvage: bool, jobs: int | None, where: str | None) -> None:
    """The file read ahead, if any, begins its parse now (a big file's child forked), before the
    command imports DuckDB and the analysis; the ingest then takes what was begun."""
    from diag.ingest import read_ahead

    read_ahead.begin(path, max_bytes, salvage, jobs, where)
