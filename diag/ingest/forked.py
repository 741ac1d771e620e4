"""A big trace's events parsed by two processes at once: this one and a forked child.

The events are cut into segments at event boundaries (kineto._segments). This process claims
them one at a time from the front, the child from the back, until the two meet (Claims): however
the cost of a byte varies along the file (Kineto writes the host's events, then the GPU's, then
the flows), both are busy to the end, give or take a segment. A fixed split at 42% of the control
trace's bytes left this process waiting ~0.13 s for a child whose part parsed slower.

The child inherits the file's bytes (copy-on-write, or the same pages of the memory map), parses
its segments and writes each chunk's tables as Arrow IPC streams, one after another, into a
temporary file (HalfFiles); this process, done with its own segments, maps them back a table at
a time, in file order (memory holds the mapped pages of one table's part rather than a half's
Python objects). The child touches no database and leaves only through os._exit, so nothing of
the parent's (DuckDB's connection, its threads) runs twice. Its files are unlinked from the start
and held by both processes, so nothing is left behind however either ends.

If the child fails in any way, this process parses the child's segments itself: the same events,
the same errors, as if it had never been split.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import signal
import struct
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import IO, TYPE_CHECKING, NamedTuple

import pyarrow as pa

from diag.lifetime import die_with_parent, scratch_dir

if TYPE_CHECKING:
    from diag.ingest.kineto import KinetoFile

# This process's fallback: the child's events parsed here, into `info` and `bad`.
Parse = Callable[["KinetoFile", Counter[str]], Iterator[dict[str, pa.Table]]]
# The child's work: each chunk's tables with its segment's number and that segment's own counts
# (one KinetoFile per segment, so that this process adds them up in file order).
Work = Callable[[Counter[str]], Iterator[tuple[int, "KinetoFile", dict[str, pa.Table]]]]


def can_split(jobs: int | None) -> bool:
    """Whether a file may be parsed by two processes: a fork to be had, and more than one core
    (`--jobs 1`: one process)."""
    return hasattr(os, "fork") and (jobs or os.cpu_count() or 1) > 1


class Claims:
    """Segments 0..n-1, claimed one at a time by two processes: this one from the front, the
    child from the back, until none is left. The two ends are in memory both processes share;
    each claim holds a POSIX record lock (fcntl.lockf, held per process: the two exclude each
    other), which the kernel drops if its holder dies."""

    def __init__(self, n: int, where: str | None = None) -> None:
        self.ends = mmap.mmap(-1, 16, flags=mmap.MAP_SHARED)
        struct.pack_into("qq", self.ends, 0, 0, n)
        self.lock = tempfile.TemporaryFile(dir=where or scratch_dir())  # noqa: SIM115 - closed by close()

    def front(self) -> int | None:
        return self._claim(0)

    def back(self) -> int | None:
        return self._claim(1)

    def _claim(self, end: int) -> int | None:
        fcntl.lockf(self.lock, fcntl.LOCK_EX)
        try:
            lo, hi = struct.unpack_from("qq", self.ends)
            if lo >= hi:
                return None
            struct.pack_into("q", self.ends, 8 * end, hi - 1 if end else lo + 1)
            return hi - 1 if end else lo
        finally:
            fcntl.lockf(self.lock, fcntl.LOCK_UN)

    def front_end(self) -> int:
        """The first segment not claimed from the front (yet)."""
        return int(struct.unpack_from("q", self.ends)[0])

    def close(self) -> None:
        self.ends.close()
        self.lock.close()


class HalfFiles(NamedTuple):
    """What the child writes: its tables, each chunk's as Arrow IPC streams from page boundaries
    (so that each maps alone), and a JSON of where they are and what the parse counted."""

    tables: IO[bytes]
    counts: IO[bytes]

    @classmethod
    def open(cls, where: str | None = None) -> HalfFiles:
        """In `where`, else the run's directory (lifetime.scratch_dir), else the system's."""
        where = where or scratch_dir()
        tables = tempfile.TemporaryFile(dir=where)  # noqa: SIM115 - closed by close(), or below
        try:
            return cls(tables, tempfile.TemporaryFile(dir=where))
        except OSError:
            tables.close()
            raise

    def close(self) -> None:
        self.tables.close()
        self.counts.close()

    def write(self, work: Work) -> None:
        """In the child: do the work, writing the tables as they come, then the counts (last, so
        that they are there only if every table is)."""
        bad = Counter[str]()
        segments: dict[int, KinetoFile] = {}
        out, pieces = pa.PythonFile(self.tables, mode="w"), []
        for segment, info, tables in work(bad):
            segments[segment] = info
            for name, t in tables.items():
                if t.num_rows:
                    self.tables.write(bytes(-self.tables.tell() % mmap.ALLOCATIONGRANULARITY))
                    begin = self.tables.tell()
                    with pa.ipc.new_stream(out, t.schema) as w:
                        w.write_table(t)
                    pieces.append((segment, name, begin, self.tables.tell() - begin))
        self.tables.flush()
        counts = {"segments": [[s, info.counts()] for s, info in segments.items()], "bad": bad, "pieces": pieces}
        self.counts.write(json.dumps(counts).encode())
        self.counts.flush()

    def read(self, info: KinetoFile, bad: Counter[str]) -> Iterator[dict[str, pa.Table]] | None:
        """The child's tables in file order, a table at a time (its segments' counts added to
        `info` in file order, and to `bad`); None if the child did not finish writing them."""
        said = os.pread(self.counts.fileno(), os.fstat(self.counts.fileno()).st_size, 0)
        if not said:
            return None
        out = json.loads(said)
        for _, counts in sorted(out["segments"], key=lambda s: s[0]):
            info.add_counts(counts)
        bad.update(out["bad"])
        places: dict[str, list[tuple[int, int]]] = {}
        # In file order: by segment, and within one in the order written (a stable sort).
        for _, name, begin, size in sorted(out["pieces"], key=lambda p: p[0]):
            places.setdefault(name, []).append((begin, size))
        fd = self.tables.fileno()

        def piece(begin: int, size: int) -> pa.Table:
            return pa.ipc.open_stream(pa.py_buffer(mmap.mmap(fd, size, offset=begin, access=mmap.ACCESS_READ))).read_all()

        # A table's whole part at once, mapped rather than read (no copy): the store then inserts
        # it in one statement, not a batch at a time. Inserting the second half of the 307 MB
        # trace one 16 MB flush at a time took 0.45 s of INSERTs, at once 0.30 s.
        return ({name: pa.concat_tables(piece(*p) for p in parts)} for name, parts in places.items())


class SecondHalf:
    """`work` run in a forked child from construction; `tables` yields its output. `where`: the
    directory of its files (HalfFiles.open)."""

    def __init__(self, work: Work, where: str | None = None) -> None:
        # Imported here so the child inherits it: pyarrow imports numpy.ma lazily at its first
        # conversion of a NumPy array, which both processes make at once after the fork (10 ms each).
        import numpy.ma  # noqa: F401

        self.files = HalfFiles.open(where)
        self.status = -1   # the child's wait status, once reaped
        parent = os.getpid()
        try:
            self.pid = os.fork()
        except OSError:
            self.files.close()
            raise
        if self.pid == 0:
            code = 1
            try:
                die_with_parent(parent)
                self.files.write(work)
                code = 0
            finally:
                os._exit(code)

    def running(self) -> bool:
        """Whether the child is still parsing (if it has ended, it is reaped here and its status kept)."""
        if self.pid:
            pid, self.status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return True
            self.pid = 0
        return False

    def tables(self, info: KinetoFile, bad: Counter[str], fallback: Parse) -> Iterator[dict[str, pa.Table]]:
        """The child's tables (adding its counts to `info` and `bad`), once it is done; if it
        failed, `fallback`'s."""
        if self.pid:
            _, self.status = os.waitpid(self.pid, 0)
            self.pid = 0
        written = self.files.read(info, bad) if self.status == 0 else None
        yield from fallback(info, bad) if written is None else written

    def __enter__(self) -> SecondHalf:
        return self

    def cancel(self) -> None:
        """End the child: its tables will not be wanted."""
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0

    def close(self) -> None:
        self.cancel()   # left before the child's tables were wanted: it has nothing more to do
        self.files.close()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
