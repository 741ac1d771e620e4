"""What a view needs from one analysis: an immutable snapshot a worker builds and the app posts.

Live and post-mortem differ only in where snapshots come from (tui/sources.py); the screens take
whatever snapshot arrives and never touch the writer connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import duckdb

from diag.engine.run import Analysis
from diag.knowledge.links import LINKS
from tui import queries
from tui.queries import CollectiveGroup, HeatGrid, Reported


@dataclass(frozen=True)
class LinkRef:
    """The link a collective should run on, one direction per GPU (DESIGN.md figures)."""

    name: str
    gbps: float


def link_for(g: CollectiveGroup, gpus_per_node: int | None, nvlink_gbps: float | None) -> LinkRef | None:
    """NVLink when every member sits on one host, else InfiniBand; None when the trace cannot tell."""
    gpn = gpus_per_node or 8      # deviceProperties lists the host's GPUs; 8 per HGX board otherwise
    if g.group_ranks:
        one_host = len({r // gpn for r in g.group_ranks}) == 1
    elif g.group_size:
        one_host = g.group_size <= gpn
    else:
        return None
    if one_host:
        return None if nvlink_gbps is None else LinkRef("NVLink", nvlink_gbps)
    ib = LINKS["ib-ndr"]
    return LinkRef("IB NDR", ib.gbps)


@dataclass(frozen=True)
class PendingFile:
    """A file seen in the live directory and not ingested yet: still being written, or truncated."""

    path: str
    size_bytes: int          # as last seen
    reason: str              # 'being written', or why the last read failed
    stuck: bool              # unchanged for the settle time and still unreadable (a killed run's leftover)


@dataclass(frozen=True)
class LiveStatus:
    directory: str
    following: bool          # False once nothing changed for the idle time: the run has ended
    files: int               # traces ingested so far
    reported: Reported
    pending: tuple[PendingFile, ...]
    idle_s: float | None     # seconds since a file last appeared or changed


@dataclass(frozen=True)
class Snapshot:
    generation: int                       # bumps when the analysis changes; views re-query on it
    source: str                           # what the user opened
    report: Mapping[str, Any] | None      # the diag.report/1 document; None before the first trace
    heat: HeatGrid | None
    collectives: tuple[CollectiveGroup, ...]
    links: tuple[LinkRef | None, ...]     # per collective row
    live: LiveStatus | None = None


def analyzed(con: duckdb.DuckDBPyConnection, a: Analysis, report: dict[str, Any], generation: int,
             source: str) -> Snapshot:
    """The snapshot of an analysis just written to `con`'s analysis tables."""
    cur = con.cursor()
    try:
        heat = queries.heat_grid(cur)
        groups = queries.collective_groups(cur)
        gpn = queries.gpus_per_node(cur)
    finally:
        cur.close()
    links = tuple(link_for(g, gpn, a.run.peak.nvlink_gbps) for g in groups)
    return Snapshot(generation, source, MappingProxyType(report), heat, groups, links)


def empty(source: str) -> Snapshot:
    return Snapshot(0, source, None, None, (), ())
