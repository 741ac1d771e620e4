"""A big trace's events parsed by two processes at once: this one and a forked child.

The events are cut into segments at event boundaries (kineto_split._segments). Both processes claim
them one at a time, in file order, from one counter (Claims), and this process takes the parts in
file order as they are done: its own, and the child's as soon as the child says one is done
(Part). So the rows reach the store while the child still parses, on the two cores, and this
process, which alone writes the store, claims fewer segments than the child: at the end it has a
segment or two to write, not the child's whole half. Claimed from the two ends of the file, the
child's half could only be written once all of it was parsed, on one core: 1.25 s of INSERTs of
the 307 MB trace's ~5 s, then the commit.

The child inherits the file's bytes (copy-on-write, or the same pages of the memory map), parses
the segments it claims and writes each one's tables as Arrow IPC streams, one after another, into
a temporary file (HalfFiles); then it says on a pipe which segment is done, where its parse ended,
what it counted and where its tables are. This process maps each table back (no copy). The child
touches no database and leaves only through os._exit, so nothing of the parent's (DuckDB's
connection, its threads) runs twice. Its file is unlinked from the start and held by both
processes, so nothing is left behind however either ends.

A segment the child could not parse (a boundary inside a string, a bad event), or did not get to
(it failed, or was killed), is parsed by this process in its turn: the same events, the same
errors, as if the file had never been split (kineto_split._two_ends).
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import select
import signal
import struct
import tempfile
from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple

import pyarrow as pa

from diag.runtime.lifetime import die_with_parent, scratch_dir


class Part(NamedTuple):
    """One segment parsed: where its parse ended (its end, or short of it where the end is not
    between two events), its counts (kineto_tabulate.KinetoFile.counts), its values' counts and its tables,
    chunk by chunk."""

    end: int
    counts: dict[str, Any]
    bad: Counter[str]
    tables: list[dict[str, pa.Table]]


# The child's work: segment i parsed, or None where it cannot be (this process then parses it).
Work = Callable[[int], Part | None]


def can_split(jobs: int | None) -> bool:
    """Whether a file may be parsed by two processes: a fork to be had, and more than one core
    (`--jobs 1`: one process)."""
    return hasattr(os, "fork") and (jobs or os.cpu_count() or 1) > 1


class Claims:
    """Segments 0..n-1, claimed one at a time, in order, by two processes. The next one is in
    memory both share; each claim holds a POSIX record lock (fcntl.lockf, held per process: the two
    exclude each other), which the kernel drops if its holder dies."""

    def __init__(self, n: int, where: str | None = None) -> None:
        self.n = n
        self.next_one = mmap.mmap(-1, 8, flags=mmap.MAP_SHARED)
        self.lock = tempfile.TemporaryFile(dir=where or scratch_dir())  # noqa: SIM115 - closed by close()

    def claim(self) -> int | None:
        fcntl.lockf(self.lock, fcntl.LOCK_EX)
        try:
            (i,) = struct.unpack_from("q", self.next_one)
            if i >= self.n:
                return None
            struct.pack_into("q", self.next_one, 0, i + 1)
            return int(i)
        finally:
            fcntl.lockf(self.lock, fcntl.LOCK_UN)

    def close(self) -> None:
        self.next_one.close()
        self.lock.close()


class HalfFiles:
    """What the child writes: its tables, each as an Arrow IPC stream from a page boundary (so
    that each maps alone), and a pipe on which it says each segment done (a line of JSON)."""

    def __init__(self, where: str | None = None) -> None:
        """In `where`, else the run's directory (lifetime.scratch_dir), else the system's."""
        self.tables = tempfile.TemporaryFile(dir=where or scratch_dir())  # noqa: SIM115 - closed by close()
        try:
            self.said, self.say = os.pipe()   # the reading end (this process's), the writing end (the child's)
        except OSError:
            self.tables.close()
            raise

    def keep_end(self, reading: bool) -> None:
        """After the fork, each process closes the end of the pipe that is not its own: the
        child's end closed, a read finds the pipe ended."""
        self.close_fd("say" if reading else "said")

    def close_fd(self, end: str) -> None:
        fd = getattr(self, end)
        if fd >= 0:
            setattr(self, end, -1)
            os.close(fd)

    def close(self) -> None:
        self.tables.close()
        self.close_fd("said")
        self.close_fd("say")

    def write(self, claims: Claims, work: Work) -> None:
        """In the child: claim segments and parse them until none is left, writing each one's
        tables, then saying it done (its line says where the tables are, so it comes after them);
        a segment that cannot be parsed is said as such."""
        out = pa.PythonFile(self.tables, mode="w")
        while (i := claims.claim()) is not None:
            part = work(i)
            if part is None:
                self._say({"segment": i})
                continue
            pieces = []
            for tables in part.tables:
                for name, t in tables.items():
                    if t.num_rows:
                        self.tables.write(bytes(-self.tables.tell() % mmap.ALLOCATIONGRANULARITY))
                        begin = self.tables.tell()
                        with pa.ipc.new_stream(out, t.schema) as w:
                            w.write_table(t)
                        pieces.append((name, begin, self.tables.tell() - begin))
            self.tables.flush()
            self._say({"segment": i, "end": part.end, "counts": part.counts, "bad": part.bad, "pieces": pieces})

    def _say(self, what: dict[str, Any]) -> None:
        line = json.dumps(what).encode() + b"\n"
        while line:
            line = line[os.write(self.say, line):]

    def part(self, said: dict[str, Any]) -> Part | None:
        """A segment the child said done: its tables mapped back (each table of the segment
        whole, its pieces in the order written), or None if it could not parse it."""
        if "end" not in said:
            return None
        fd = self.tables.fileno()

        def piece(begin: int, size: int) -> pa.Table:
            return pa.ipc.open_stream(pa.py_buffer(mmap.mmap(fd, size, offset=begin, access=mmap.ACCESS_READ))).read_all()

        places: dict[str, list[tuple[int, int]]] = {}
        for name, begin, size in said["pieces"]:
            places.setdefault(name, []).append((begin, size))
        tables = {name: pa.concat_tables(piece(*p) for p in parts) for name, parts in places.items()}
        return Part(said["end"], said["counts"], Counter(said["bad"]), [tables] if tables else [])


class SecondHalf:
    """A forked child claiming segments and doing `work` on them from construction; `part(i)`
    gives what it made of segment i. `where`: the directory of its file (HalfFiles)."""

    def __init__(self, claims: Claims, work: Work, where: str | None = None) -> None:
        # Imported here so the child inherits it: pyarrow imports numpy.ma lazily at its first
        # conversion of a NumPy array, which both processes make at once after the fork (10 ms each).
        import numpy.ma  # noqa: F401

        self.files = HalfFiles(where)
        self.done: dict[int, dict[str, Any]] = {}   # what the child said of each segment, not yet taken
        self.heard = b""   # the pipe's last line, until it is whole
        self.ended = False   # the child's end of the pipe is closed: it will say no more
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
                self.files.keep_end(reading=False)
                self.files.write(claims, work)
                code = 0
            finally:
                os._exit(code)
        self.files.keep_end(reading=True)

    def ready(self, i: int) -> bool:
        """Whether the child has said segment i done (what it has said so far is read, without waiting)."""
        if i not in self.done and not self.ended:
            self._hear(wait=False)
        return i in self.done

    def part(self, i: int) -> Part | None:
        """Segment i as the child parsed it, once it is done; None if the child could not parse
        it or ended without saying it done (this process then parses it)."""
        while i not in self.done and not self.ended:
            self._hear(wait=True)
        said = self.done.pop(i, None)
        return None if said is None else self.files.part(said)

    def _hear(self, wait: bool) -> None:
        if not wait and not select.select([self.files.said], [], [], 0)[0]:
            return
        got = os.read(self.files.said, 1 << 16)
        if not got:
            self.ended = True
            return
        *lines, self.heard = (self.heard + got).split(b"\n")
        for line in lines:
            said = json.loads(line)
            self.done[said["segment"]] = said

    def __enter__(self) -> SecondHalf:
        return self

    def cancel(self) -> None:
        """End the child: nothing more of it will be wanted."""
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0

    def close(self) -> None:
        self.cancel()
        self.files.close()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
