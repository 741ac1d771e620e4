"""The map step of an analysis: one rank's timeline built from the store, its digest (what the
reduce and the rules keep of it) and its rows of the per-file tables. Runs in the analyzing
process (run.analyze), in a pool or on an executor (rank_map): the same function everywhere, so
every executor gives the same report.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import duckdb
import pyarrow as pa

from diag.attribution import tables
from diag.attribution.analysis import RankContext
from diag.attribution.digest import RankDigest, digest_rank
from diag.knowledge import hardware
from diag.runtime.errors import BadInput
from diag.timeline.rank import RankTimeline, load_ranks
from rules.base import Rule


def gpu_part(key: str | None) -> hardware.Part | None:
    if not key:
        return None
    try:
        return hardware.resolve_part(key).part
    except ValueError as e:
        raise BadInput("--gpu", str(e)) from None


def map_ranks(con: duckdb.DuckDBPyConnection, files: list[int], rules: list[Rule[Any]],
              gpu: hardware.Part | None) -> Generator[tuple[RankDigest, dict[str, pa.Table]], None, None]:
    """Each file's digest and its rows of the per-file tables, in order, in this process: the next
    file's rows are read while this one is mapped (timeline.load_ranks)."""
    for tl in load_ranks(con, files):
        mapped = _map_timeline(con, tl, rules, gpu)
        del tl   # one timeline at a time: this one goes before the next is built
        yield mapped


def _map_timeline(con: duckdb.DuckDBPyConnection, tl: RankTimeline, rules: list[Rule[Any]],
                  gpu: hardware.Part | None) -> tuple[RankDigest, dict[str, pa.Table]]:
    digest, runs = digest_rank(con, tl)
    part = gpu or (ident.part if tl.device_props and (ident := hardware.identify(tl.device_props)) else None)
    ctx = RankContext(tl, part.hbm_gbps if part else None, part)
    digest.rules = {r.code: d for r in rules if (d := r.digest(ctx)) is not None}
    return digest, tables.rank_rows(tl, runs)
