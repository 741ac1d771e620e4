"""Where snapshots come from: one analysis of a path (post-mortem), or a directory followed (live).

Both own the store's one writer connection and run in a worker thread; screens read through
their own cursors (`Store.reader`). DuckDB refuses a second process on a file held read-write
(DESIGN.md), so live mode is one process: this writer, and a cursor per reader thread.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import duckdb
import msgspec

from diag.api import Opened, analyze_opened, open_store
from diag.attribution.digest import RankDigest
from diag.engine.run import AnalyzeOptions
from diag.ingest.discover import discover
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.runtime import store
from diag.runtime.errors import BadInput
from diag.runtime.sanitize import printable
from tui import queries
from tui.snapshot import LiveStatus, PendingFile, Snapshot, analyzed, empty

# (what is happening, fraction done or None when unknown)
Progress = Callable[[str, float | None], None]


class Store:
    """The writer connection, and a fresh cursor for each reader (a shared cursor refuses concurrent calls)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    @contextmanager
    def reader(self) -> Iterator[duckdb.DuckDBPyConnection]:
        cur = self.con.cursor()
        try:
            yield cur
        finally:
            cur.close()


class Loader(Protocol):
    """A source analyzed once: `load` runs in a worker thread, then `store` is set."""

    store: Store | None

    def load(self, progress: Progress) -> Snapshot: ...


def _model_beside(path: Path) -> str | None:
    model = (path if path.is_dir() else path.parent) / "model.toml"
    return str(model) if model.is_file() else None


class PostMortem:
    """One trace directory, trace file or diag DuckDB file, analyzed once."""

    def __init__(self, path: str, db: str | None, opts: AnalyzeOptions, ingest_opts: IngestOptions) -> None:
        self.path = path
        self.db = db
        self.opts = opts
        self.ingest_opts = ingest_opts
        self.store: Store | None = None
        self.errors: list[BadInput] = []

    def load(self, progress: Progress) -> Snapshot:
        progress(f"reading {Path(self.path).name}", None)

        def ingested(done: int, total: int, path: str) -> None:
            progress(f"ingesting {done}/{total}: {os.path.basename(path)}", done / max(total, 1))

        try:
            opened: Opened = open_store(self.path, self.db, self.ingest_opts, progress=ingested)
        except duckdb.IOException as e:
            # DuckDB lets one process hold a file read-write and no other open it at all (DESIGN.md).
            raise BadInput(self.db or self.path, f"cannot open the store: {e}; close the other diag using it, "
                           "or open a copy") from e
        self.store = Store(opened.con)
        self.errors = opened.errors
        progress("analyzing: timelines, collectives, ledger, rules", None)
        a, report = analyze_opened(opened.con, self.opts, opened.model_file or _model_beside(Path(self.path)),
                                  len(opened.errors))
        progress("preparing the views", None)
        return analyzed(opened.con, a, report, 1, self.path)


@dataclass(frozen=True)
class _Stat:
    size: int
    mtime_ns: int


@dataclass
class _Failed:
    stat: _Stat
    reason: str
    since_s: float


class Live:
    """Follows the directory a running job's profiler writes into.

    A file is ingested once it is complete, never half-written: torch writes a `.json` to a
    temporary name and renames it (it appears whole), but writes a `.json.gz` in place, visible
    while incomplete (DESIGN.md). So a `.json.gz` must look the same on two polls in a row before
    it is read, and any file that fails to read is retried when it changes — it is reported as
    waiting, not as an error. One left unchanged and unreadable for `settle_s` (a killed run's
    truncated file) is shown as stuck, and kept with --salvage.

    A file read before is read again when it changes: NCCL Inspector logs grow for as long as the
    job runs (each read adds the records appended since the last, diag/ingest/pipeline.py), and
    a salvaged trace that turns out whole after all replaces what was salvaged. A log being
    appended to is read as soon as it changes: its parse stops at the last complete record.
    """

    def __init__(self, directory: str, db: str | None, opts: AnalyzeOptions, ingest_opts: IngestOptions,
                 clock: Callable[[], float] = time.monotonic, settle_s: float = 30.0, idle_s: float = 60.0) -> None:
        self.directory = directory
        self.opts = opts
        # Salvage only what stopped changing: a file still being written is not damaged, just unfinished.
        # Each poll ingests: its last file's rows wait for DuckDB's own checkpoint (IngestOptions).
        self.ingest_opts = msgspec.structs.replace(ingest_opts, salvage=False, checkpoint_last=False)
        self.salvage = ingest_opts.salvage
        self.clock = clock
        self.settle_s = settle_s
        self.idle_s = idle_s
        self.store = Store(store.connect(db))
        # Each file's map-step digest, kept between analyses: a new file costs its own timeline
        # and the cross-rank step, not a re-analysis of every rank (bench/live.py).
        self._digests: dict[int, RankDigest] = {}
        self.generation = 0
        self._snapshot = empty(directory)
        self._seen: dict[str, _Stat] = {}
        self._failed: dict[str, _Failed] = {}
        self._done: dict[str, _Stat] = {}         # read (ingested, skipped, or salvaged) at this size and time
        self._writing: tuple[str, ...] = ()        # seen changing on the last poll
        self._last_change_s: float | None = None
        self._errors = 0

    def poll(self) -> Snapshot | None:
        """One look at the directory: ingest what is complete; a new snapshot when anything changed."""
        now = self.clock()
        ready = self._ready(now)
        # A --db that already holds traces (an earlier session of this run) is shown at once.
        changed = self.generation == 0 and self._traces() > 0
        if ready:
            changed = self._ingest(ready, self.ingest_opts, now) or changed
        stuck = [p for p, f in self._failed.items() if now - f.since_s >= self.settle_s]
        if self.salvage and stuck:
            changed = self._ingest(stuck, msgspec.structs.replace(self.ingest_opts, salvage=True), now) or changed
        if changed:
            self.generation += 1
            a, report = analyze_opened(self.store.con, self.opts, _model_beside(Path(self.directory)), self._errors,
                                       self._digests)
            self._snapshot = analyzed(self.store.con, a, report, self.generation, self.directory)
        status = self._status(now)
        if changed or status != self._snapshot.live:
            self._snapshot = dataclasses.replace(self._snapshot, live=status)
            return self._snapshot
        return None

    def _ready(self, now: float) -> list[str]:
        try:
            files = discover([self.directory]).files
        except BadInput:
            return []                      # the directory is not there (yet)
        ready = []
        writing = []
        appending = self._appending()
        for path in files:
            try:
                st = os.stat(path)
            except OSError:
                continue                   # renamed or removed between the scan and the stat
            stat = _Stat(st.st_size, st.st_mtime_ns)
            if self._done.get(path) == stat:
                continue
            before = self._seen.get(path)
            self._seen[path] = stat
            if before != stat:
                self._last_change_s = now
            # A .json appears whole (renamed into place), and a log is read to its last whole record;
            # anything else must hold still for one poll.
            steady = path.endswith(".json") or before == stat or printable(path) in appending
            failed = self._failed.get(path)
            if steady and (failed is None or failed.stat != stat):
                ready.append(path)
            elif not steady:
                writing.append(path)
        self._writing = tuple(writing)
        return ready

    def _ingest(self, paths: list[str], opts: IngestOptions, now: float) -> bool:
        result = ingest(paths, self.store.con, opts)
        for path in [p for p, _ in result.ingested] + [s.path for s in result.skipped]:
            if path in self._seen:
                self._done[path] = self._seen[path]
            self._failed.pop(path, None)
        for e in result.errors:
            stat = self._seen.get(e.path)
            if stat is None:
                continue
            if opts.salvage:
                self._done[e.path] = stat  # salvage was the last try: count it out, until it changes
                self._failed.pop(e.path, None)
                self._errors += 1
                continue
            prev = self._failed.get(e.path)
            self._failed[e.path] = _Failed(stat, e.reason, prev.since_s if prev and prev.stat == stat else now)
        return bool(result.ingested)

    def _appending(self) -> set[str]:
        """Paths (as stored) of the files read up to their last complete record, to be read on from there."""
        with self.store.reader() as cur:
            return {p for (p,) in cur.execute("SELECT path FROM trace_files WHERE read_state IS NOT NULL").fetchall()}

    def _traces(self) -> int:
        with self.store.reader() as cur:
            n = cur.execute("SELECT count(*) FROM trace_files WHERE kind = 'kineto'").fetchone()
        return int(n[0]) if n else 0

    def _status(self, now: float) -> LiveStatus:
        with self.store.reader() as cur:
            rep = queries.reported(cur)
        idle = None if self._last_change_s is None else now - self._last_change_s
        # Paths as text the screen can draw: a name that is not UTF-8 shows its odd bytes escaped.
        pending = tuple(
            PendingFile(printable(p), self._seen[p].size, "being written", False) for p in self._writing
        ) + tuple(
            PendingFile(printable(p), f.stat.size, f.reason, now - f.since_s >= self.settle_s)
            for p, f in sorted(self._failed.items()) if p not in self._writing
        )
        following = idle is None or idle < self.idle_s
        # Rounded so that a status that only aged does not count as a change: one redraw a second at most.
        return LiveStatus(self.directory, following, self._traces(), rep, pending,
                          None if idle is None else float(int(idle)))
