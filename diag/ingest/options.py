"""What an ingest is asked and what it answers: IngestOptions, a file's outcome (Skipped, Spilled,
IngestResult), what the store already holds of a path (Prior), the Sink a parse writes into, and
the one-line error for a file that could not be read."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import duckdb
import msgspec
import pyarrow as pa

from diag.ingest.source import DEFAULT_MAX_BYTES
from diag.runtime.errors import BadInput, in_words
from diag.runtime.lifetime import raise_if_stopped

if TYPE_CHECKING:
    pass



class IngestOptions(msgspec.Struct, frozen=True):
    salvage: bool = False
    max_bytes: int = DEFAULT_MAX_BYTES
    rank: int | None = None   # --rank: for a single file whose trace and name carry none
    jobs: int | None = None   # worker processes; default: one per core (local) or per cluster CPU (ray)
    executor: str = "local"   # where workers run: diag.runtime.executor.EXECUTORS
    # Where workers write their Parquet spills (default: the system's temporary directory). With
    # Ray on several machines it must be storage every node and the parent see at the same path.
    spill_dir: str | None = None
    # The last file is checkpointed as it commits (store.FileWriter): for a run after which the store
    # closes, or is only read. Not where more is ingested soon after (diag live: every poll would
    # checkpoint, each costing more as the store grows; docs/scale.md).
    checkpoint_last: bool = True


class Skipped(msgspec.Struct, frozen=True):
    path: str
    reason: str
    duplicate: bool = False   # its content is in the store already


class Spilled(msgspec.Struct, frozen=True):
    """A file parsed in a worker: its row, and its tables as Parquet files to load."""

    path: str
    file_row: dict[str, Any]
    parquet: dict[str, str]
    spill_dir: str


class IngestResult(msgspec.Struct):
    ingested: list[tuple[str, int]] = msgspec.field(default_factory=list)   # (path, file_id)
    skipped: list[Skipped] = msgspec.field(default_factory=list)
    errors: list[BadInput] = msgspec.field(default_factory=list)
    warnings: list[str] = msgspec.field(default_factory=list)
    ambiguous: list[str] = msgspec.field(default_factory=list)   # files that fit two formats: shown by every command


class Prior(msgspec.Struct, frozen=True):
    """A file in the store whose path may hold more by now: an append-only NCCL-side log (read on
    from where it stopped), or a trace salvaged up to damage (replaced by its longer version)."""

    file_id: int
    kind: str
    n_events: int
    read_bytes: int | None
    read_hash: str | None
    read_state: dict[str, Any] | None


def priors(con: duckdb.DuckDBPyConnection) -> dict[str, Prior]:
    """Such files, by path as stored."""
    rows = con.execute(
        "SELECT path, file_id, kind, n_events, read_bytes, read_hash, read_state FROM trace_files "
        "WHERE partial OR read_state IS NOT NULL OR kind IN ('nccl_inspector', 'nccl_profiler') ORDER BY file_id"
    ).fetchall()
    return {r[0]: Prior(r[1], r[2], r[3], r[4], r[5], None if r[6] is None else json.loads(r[6])) for r in rows}


class Sink(Protocol):
    rank: int | None
    file_id: int        # the file the rows belong to: set to an earlier one's when they are appended to it

    def split(self, ranks: list[int]) -> None: ...

    def add(self, tables: dict[str, pa.Table]) -> None: ...

    def flush(self) -> None:
        """Write what `add` has buffered; the parse calls it while it waits on its forked child."""


def failed(path: str, e: Exception) -> BadInput:
    """A file's failure as the one line that names it; the other files go on (issue 15: a file
    nested 10^6 deep or with a 5000-digit integer once stopped every file after it). Not a signal
    that DuckDB turned into an error of its own: that ends the run (lifetime.stopped_by)."""
    raise_if_stopped()
    if isinstance(e, BadInput):
        return e
    if isinstance(e, MemoryError):
        return BadInput(path, "out of memory while parsing; lower --max-bytes or free memory")
    if isinstance(e, RecursionError):
        return BadInput(path, "nested too deeply to be a trace")
    return BadInput(path, f"could not be read: {in_words(e)}")
