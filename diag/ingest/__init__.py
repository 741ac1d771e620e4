"""Decode and store: trace files found by content (discover, sniff), read within their caps
(source, read_ahead), parsed into Arrow tables shaped like diag/sql/schema.sql (the Kineto parse:
kineto, kineto_decode, kineto_tabulate, kineto_split with its forked half; merged ranks; the three
NCCL-side formats behind nccl), their ranks assigned, and written into the store one file at a
time (pipeline, parse_file, options).

Imports diag.knowledge and diag.runtime only. The command layer starts a big file's read and
parse early through the two functions below, and knows nothing else of how it is done.
"""

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
