"""A command's one trace file read (inflated, hashed) by a forked process while this one imports
its modules: `diag analyze trace.json.gz` spends its first ~0.4 s importing numpy, pyarrow and
DuckDB on one core while the other waits, then ~0.1 s reading the file. Read ahead, the control
trace's read is off that path (whole processes, imports then read: 0.46 → 0.38 s). A thread
does not do it: the imports hold the GIL, and a thread's inflate waited on them (0.46 → 0.49 s).

The reader inflates into memory shared with this process (an anonymous shared map, sized before
the fork from the file's size or its gzip trailer) and sends back the content's hash. Only a file
of at most source.IN_MEMORY_BYTES is read ahead: such a file is held whole until it is parsed
anyway, while a bigger one's parsed ranges are handed back to the kernel as the parse goes
(source.SourceBytes.release), which shared memory would not do. Anything but a clean read (an
error, a warning, a size other than the one foreseen, a file changed since) and `take` returns
None: the file is then read as it always was (read_source), and what is said of a bad file is the
same.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
from typing import NamedTuple

from diag.ingest.source import (
    GZIP_MAGIC,
    IN_MEMORY_BYTES,
    SourceBytes,
    is_duckdb_head,
    read_source,
    trailer_size,
)


class _Identity(NamedTuple):
    """What a read depends on: the file as stat sees it, and the options."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    max_bytes: int
    salvage: bool


class _Reader:
    def __init__(self, pid: int, pipe: int, buf: mmap.mmap, key: _Identity) -> None:
        self.pid, self.pipe, self.buf, self.key = pid, pipe, buf, key


_pending: dict[str, _Reader] = {}


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
    """Begin reading `path` in a forked process, if it is a file this is worth doing for."""
    key = _identity(path, max_bytes, salvage)
    if key is None or not hasattr(os, "fork"):
        return
    try:
        size = _content_size(path, key.size)
    except OSError:
        return
    if size is None or not 0 < size <= min(IN_MEMORY_BYTES, max_bytes):
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
            from diag.lifetime import die_with_parent  # here: ctypes and threading cost `diag --help` 4 ms

            die_with_parent(parent)
            src = read_source(path, max_bytes, salvage, into=buf)
            if not src.warnings:
                os.write(w, json.dumps([src.content_hash, src.compressed]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    _pending[os.path.realpath(path)] = _Reader(pid, r, buf, key)


def take(path: str, max_bytes: int, salvage: bool) -> SourceBytes | None:
    """The read of `path` begun by `start` with the same options, once done; None if there is
    none, or it was not clean, or the file changed since."""
    reader = _pending.pop(os.path.realpath(path), None) if _pending else None
    if reader is None:
        return None
    with os.fdopen(reader.pipe, "rb") as f:
        said = f.read()
    os.waitpid(reader.pid, 0)
    if not said or _identity(path, max_bytes, salvage) != reader.key:
        return None
    content_hash, compressed = json.loads(said)
    return SourceBytes(path, reader.buf, content_hash, compressed)
