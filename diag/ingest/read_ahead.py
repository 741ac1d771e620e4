"""A command's one trace file read (inflated, hashed) by a forked process while this one imports
its modules: `diag analyze trace.json.gz` spends its first ~0.4 s importing numpy, pyarrow and
DuckDB on one core while the other waits, then ~0.1 s reading the file. Read ahead, the control
trace's read is off that path (whole processes, imports then read: 0.46 → 0.38 s). A thread
does not do it: the imports hold the GIL, and a thread's inflate waited on them (0.46 → 0.49 s).

The reader inflates into memory shared with this process (an anonymous shared map, sized before
the fork from the file's size or its gzip trailer) and sends back the content's hash. Only a file
of at most source.IN_MEMORY_BYTES is read so: such a file is held whole until it is parsed
anyway, while a bigger one's parsed ranges are handed back to the kernel as the parse goes
(source.SourceBytes.release), which shared memory would not do. A bigger file is read ahead by
a thread of this process instead, into the private memory read_source gives it: its reads and
hashing let go of the GIL, 16 MB at a time, and the 307 MB trace's read (~0.3 s) is off the
imports' path. Anything but a clean read (an error, a warning, a size other than the one
foreseen, a file changed since) and `take` returns None: the file is then read as it always was
(read_source), and what is said of a bad file is the same.

Once the parse's own modules are imported, `begin` takes the read and takes the parse's first
steps too, before the command imports DuckDB and the analysis (~0.1 s): the head decoded and, for
a file parsed on both cores, the forked child already claiming segments
(diag/ingest/forked.py). `diag analyze` of the control trace, whole processes, 21 interleaved
runs: 1.36 → 1.27 s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import mmap
import os
import stat
import threading
from typing import TYPE_CHECKING, NamedTuple

from diag.ingest.source import (
    GZIP_MAGIC,
    IN_MEMORY_BYTES,
    SourceBytes,
    read_source,
    trailer_size,
)
from diag.runtime.errors import BadInput
from diag.runtime.paths import is_duckdb_head

if TYPE_CHECKING:
    from diag.ingest.kineto import Begun


class _Identity(NamedTuple):
    """What a read depends on: the file as stat sees it, and the options."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    max_bytes: int
    salvage: bool


class _Reader:
    """A forked process reading into `buf`, memory it shares with this one."""

    def __init__(self, pid: int, pipe: int, buf: mmap.mmap, key: _Identity) -> None:
        self.pid, self.pipe, self.buf, self.key = pid, pipe, buf, key

    def result(self, path: str) -> SourceBytes | None:
        """The read, once the reader is done; None if it was not clean."""
        with os.fdopen(self.pipe, "rb") as f:
            said = f.read()
        os.waitpid(self.pid, 0)
        if not said:
            return None
        content_hash, compressed = json.loads(said)
        return SourceBytes(path, self.buf, content_hash, compressed)


class _Thread:
    """A thread of this process reading a file too big to share (read_source's own read)."""

    def __init__(self, path: str, max_bytes: int, salvage: bool, key: _Identity) -> None:
        self.key: _Identity = key
        self.read: SourceBytes | None = None
        self.thread = threading.Thread(target=self._read, args=(path, max_bytes, salvage), name="diag-read-ahead",
                                       daemon=True)
        self.thread.start()

    def _read(self, path: str, max_bytes: int, salvage: bool) -> None:
        # Whatever goes wrong is said when the file is read again, as without a read ahead.
        with contextlib.suppress(BadInput, OSError, MemoryError):
            src = read_source(path, max_bytes, salvage)
            self.read = None if src.warnings else src

    def result(self, path: str) -> SourceBytes | None:
        self.thread.join()
        return None if self.read is None else dataclasses.replace(self.read, path=path)


_pending: dict[str, _Reader | _Thread] = {}
_begun: dict[str, tuple[SourceBytes, Begun | None]] = {}


def _identity(path: str, max_bytes: int, salvage: bool) -> _Identity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return _Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, max_bytes, salvage)


def _content_size(path: str, size: int) -> int | None:
    """The content's size, foreseen: the file's, or a gzip's trailer (source.trailer_size); None
    for a DuckDB file (`diag analyze STORE`), which is not read as a trace."""
    with open(path, "rb") as f:
        head = f.read(12)
        if is_duckdb_head(head):
            return None
        if head[:2] != GZIP_MAGIC:
            return size
        hinted = trailer_size(f, size)
        return size if hinted is None else hinted


def start(path: str, max_bytes: int, salvage: bool) -> None:
    """Begin reading `path` in a forked process (a thread for a big file), if it is a file this is
    worth doing for."""
    key = _identity(path, max_bytes, salvage)
    if key is None or not hasattr(os, "fork"):
        return
    try:
        size = _content_size(path, key.size)
    except OSError:
        return
    if size is None or not 0 < size <= max_bytes:
        return
    if size > IN_MEMORY_BYTES:
        _pending[os.path.realpath(path)] = _Thread(path, max_bytes, salvage, key)
        return
    buf = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
    r, w = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return
    if pid == 0:   # the reader: one line of JSON on the pipe if the read is clean, nothing if not
        code = 1
        try:
            os.close(r)
            from diag.runtime.lifetime import (
                die_with_parent,  # here: ctypes and threading cost `diag --help` 4 ms
            )

            die_with_parent(parent)
            src = read_source(path, max_bytes, salvage, into=buf)
            if not src.warnings:
                os.write(w, json.dumps([src.content_hash, src.compressed]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    _pending[os.path.realpath(path)] = _Reader(pid, r, buf, key)


def take(path: str, max_bytes: int, salvage: bool) -> tuple[SourceBytes, Begun | None] | None:
    """The read of `path` begun by `start` with the same options, once done, and its parse's first
    steps if `begin` took them (a `with` block closes them); None if there is no read, or it was
    not clean, or the file changed since."""
    key = os.path.realpath(path)
    if key in _begun:
        return _begun.pop(key)
    reader = _pending.pop(key, None) if _pending else None
    if reader is None:
        return None
    src = reader.result(path)
    if src is None or _identity(path, max_bytes, salvage) != reader.key:
        return None
    return src, None


def begin(path: str, max_bytes: int, salvage: bool, jobs: int | None, where: str | None) -> None:
    """For a file read ahead, once the parse's modules may be imported: the read taken and the
    parse's first steps (kineto.begin: the head decoded and, if it may be split, a big file's child
    forked), while this process imports the rest of the command's modules (DuckDB, the analysis).
    The child then parses ~0.1 s sooner, with the same rows and messages:
    `diag/ingest/pipeline.py` takes them as it would have taken them itself, or closes them."""
    if os.path.realpath(path) not in _pending:
        return
    # Imported before the read is taken: the reader is still inflating (~0.1 s for the 35 MB
    # control trace) while they import.
    from diag.ingest import kineto
    from diag.ingest.forked import can_split
    from diag.ingest.merged import rank_map
    from diag.ingest.sniff import trace_format

    taken = take(path, max_bytes, salvage)
    if taken is None:
        return
    src, begun = taken[0], None
    if trace_format(src.data).kind == "kineto":
        with contextlib.suppress(BadInput):   # said where it would have been without a read ahead
            begun = kineto.begin(path, src.data, salvage, src.release, can_split(jobs), where)
    # Only for a trace that merges no ranks (parse_file.parse_into then looks for none: a merged file
    # is read as before, its ranks told apart and never split). Looked for once the child parses:
    # the search for process names reads the whole file (~0.15 s of the 307 MB trace's).
    if begun is not None and rank_map(src.data) is not None:
        begun.close()
        begun = None
    _begun[os.path.realpath(path)] = src, begun
