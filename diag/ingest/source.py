"""Reading a trace file's bytes safely: gzip with a cap on the decompressed size (no more than the
cap is ever held), a content hash, and no mapping of the file that could fault.

A file is read (or inflated) into this process's own memory, never memory-mapped: a mapped file
cut short while it is read (a job still writing it, a disk cleaner) raises SIGBUS on the next page,
which kills the process with nothing on stderr. Big files go into a private anonymous map, whose
parsed ranges `release` hands back to the kernel, so the resident part shrinks as the parse goes.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import stat
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from isal import isal_zlib

from diag.runtime.errors import BadInput
from diag.runtime.paths import file_kind, is_duckdb


def _default_max_bytes() -> int:
    """4 GiB or a quarter of this machine's memory, whichever is less. A Kineto trace of a real
    job is hundreds of MB per rank; a gzip bomb (1 GB of zeros packs to ~1 MB) is refused at the
    cap, and an accepted file costs about its size in memory (1× while it is parsed), so a cap
    above a quarter of memory would let one file crowd out everything else."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        ram = 16 * 1024**3
    return min(4 * 1024**3, ram // 4)


# `--max-bytes` changes it.
DEFAULT_MAX_BYTES = _default_max_bytes()
# Files up to this size are kept as one bytes object; larger ones go into an anonymous map whose
# parsed ranges are released as the parse moves on.
IN_MEMORY_BYTES = 64 * 1024**2
_CHUNK = 16 * 1024 * 1024
# Inflated in pieces this small, so that each piece's memory is the last one's, already mapped:
# fresh 16 MB pieces cost a page fault per 4 kB, and the 35 MB control trace's read 0.087 s → 0.057.
_INFLATE_PIECE = 1024 * 1024
GZIP_MAGIC = b"\x1f\x8b"
# isal's stubs declare IsalError as an instance; at run time it is the exception class.
_InflateError = cast(type[Exception], isal_zlib.IsalError)

Buffer = bytes | bytearray | mmap.mmap


# Dataclasses, not msgspec Structs as elsewhere, in the modules `diag --help` loads (this one, capture,
# example.launch, mfu, model, hardware): msgspec's import (typing_extensions) would cost it ~20 ms,
# their eight dataclasses cost ~5.
@dataclass(frozen=True)
class SourceBytes:
    path: str
    data: Buffer          # decompressed content (bytes, or a private anonymous map of it)
    content_hash: str     # sha256 of the decompressed bytes: the same trace gzipped or not is one content
    compressed: bool
    warnings: tuple[str, ...] = ()   # a gzip stream salvaged up to its damage says so

    def release(self, start: int, end: int) -> None:
        """Hand a parsed range back to the kernel (it reads as zeros afterwards: call it only for a
        range that is done with for good); a no-op for bytes."""
        if isinstance(self.data, mmap.mmap) and end > start:
            page = mmap.PAGESIZE
            lo = -(-start // page) * page           # whole pages inside the range only
            hi = min(end, len(self.data)) // page * page
            if hi > lo:
                self.data.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def is_duckdb_file(path: str | Path) -> bool:
    """Whether `path` is a DuckDB database (a diag store), not traces (paths.is_duckdb)."""
    return is_duckdb(path)


def read_source(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, salvage: bool = False,
                into: mmap.mmap | None = None) -> SourceBytes:
    """Read and (if gzip) decompress a file, refusing what is not a regular file, empty files,
    corrupt gzip, bombs and files that shrink while they are read; with `salvage`, a gzip stream
    cut off or damaged gives what inflates before the damage (torch writes a .json.gz in place: a
    killed run leaves it truncated), and a warning. `into`: memory the content goes into, which it
    must fill exactly (NotInto if it does not); diag/ingest/read_ahead.py reads a file so."""
    p = str(path)
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            # Opening a FIFO blocks until a writer comes; a device never ends.
            raise BadInput(p, f"not a regular file ({file_kind(st.st_mode)}); give trace files or directories")
        f = open(p, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise BadInput(p, f"cannot read: {e.strerror or e}") from None
    with f:
        size = st.st_size
        head = f.read(2)
        if size == 0 or not head:
            raise BadInput(p, "empty file", 0)
        f.seek(0)
        compressed = head == GZIP_MAGIC
        warnings: tuple[str, ...] = ()
        try:
            if compressed:
                damage: list[BadInput] = []
                data, digest = _gunzip(p, f, size, max_bytes, damage if salvage else None, into)
                if damage:
                    warnings = (f"{damage[0].reason} at byte {damage[0].offset} of the file: read the "
                                f"{len(data)} bytes it inflates to before that",)
            elif size > max_bytes:
                raise BadInput(p, f"larger than the {max_bytes} byte cap (raise it with --max-bytes)")
            else:
                data, digest = _read_plain(p, f, size, into)
        except OSError as e:
            raise BadInput(p, f"cannot read: {e.strerror or e}") from None
    if _blank(data):
        raise BadInput(p, "empty trace (only whitespace)", 0)
    return SourceBytes(p, data, digest, compressed, warnings)


def _blank(data: Buffer) -> bool:
    """Only whitespace, checked a slice at a time (a whitespace bomb is not copied whole)."""
    return not any(c.tobytes().strip() for c in _slices(data))


def _read_plain(path: str, f: io.BufferedReader, size: int, into: mmap.mmap | None = None) -> tuple[Buffer, str]:
    """The file's first `size` bytes (what stat saw: a file still growing is read as it was)."""
    if into is None and size <= IN_MEMORY_BYTES:
        data = f.read(size)
        if len(data) < size:
            raise _shrank(path, len(data), size)
        return data, hashlib.sha256(data).hexdigest()
    buf = _anonymous(size) if into is None else _fits(into, size)
    mv = memoryview(buf)
    h = hashlib.sha256()
    pos = 0
    # Each piece is hashed in a thread while the next is read: both let go of the GIL, and apart
    # they took 0.20 s (read) and 0.17 s (hash) of a 307 MB trace.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="diag-hash") as hasher:
        hashed: Future[None] | None = None
        try:
            while pos < size:
                n = f.readinto(mv[pos : min(pos + _CHUNK, size)])
                if not n:
                    raise _shrank(path, pos, size)
                if hashed is not None:
                    hashed.result()
                hashed = hasher.submit(h.update, mv[pos : pos + n])
                pos += n
        finally:
            if hashed is not None:
                hashed.result()   # the hash has let go of the memory before it is released
            mv.release()
    return buf, h.hexdigest()


def _shrank(path: str, got: int, size: int) -> BadInput:
    return BadInput(path, f"the file shrank while it was read ({got} of {size} bytes): something is still "
                          "writing or truncating it; ingest it once it is complete", got)


class NotInto(Exception):
    """The content does not fill the memory read_source was given (`into`)."""


def _fits(into: mmap.mmap, size: int) -> mmap.mmap:
    if len(into) != size:
        raise NotInto(f"{size} bytes into {len(into)}")
    return into


def _anonymous(size: int) -> mmap.mmap:
    """Memory of this process alone (private, not backed by any file, so nothing can cut it short)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


def _slices(data: Buffer) -> Iterator[memoryview]:
    mv = memoryview(data)
    for i in range(0, len(mv), _CHUNK):
        yield mv[i : i + _CHUNK]


def _gunzip(path: str, f: IO[bytes], size: int, max_bytes: int, damage: list[BadInput] | None,
            into: mmap.mmap | None = None) -> tuple[Buffer, str]:
    """The inflated content and its hash, in memory of exactly its size (no growing buffer, whose
    reallocations peaked at twice its size). The size is first taken from the gzip trailer and the
    content inflated once into it; where the trailer does not tell it (several members, padding,
    4 GiB or more, damage) the content is inflated twice: counted without keeping it, then kept.
    Either way no more than `max_bytes` is ever stored: a bomb is refused at the cap. Once instead
    of twice: 0.03 s of the 35 MB control trace's 0.11 s read."""
    hinted = trailer_size(f, size)
    if hinted is not None and 0 < hinted <= max_bytes:
        try:
            got = _inflate_into(path, f, size, max_bytes, hinted, into=into)
        except BadInput:
            if damage is None:
                raise
            got = None   # salvage: the counting pass finds where the damage begins
        if got is not None:
            return got
        f.seek(0)
    total = sum(len(c) for c in _inflate(path, f, size, max_bytes, damage))
    f.seek(0)
    got = _inflate_into(path, f, size, max_bytes, total, None if damage is None else [], into)
    if got is None:
        raise BadInput(path, "the file changed while it was read; ingest it once it is complete")
    return got


def trailer_size(f: IO[bytes], size: int) -> int | None:
    """ISIZE, the last member's inflated size modulo 2^32, from the file's last 4 bytes (RFC 1952)."""
    if size < 18:   # a 10-byte header and an 8-byte trailer
        return None
    f.seek(size - 4)
    tail = f.read(4)
    f.seek(0)
    return int.from_bytes(tail, "little") if len(tail) == 4 else None


def _inflate_into(path: str, f: IO[bytes], size: int, max_bytes: int, total: int,
                  damage: list[BadInput] | None = None, into: mmap.mmap | None = None) -> tuple[Buffer, str] | None:
    """The content inflated into memory of `total` bytes (`into`, if given) and its sha256, hashed
    in a thread while the next piece inflates (hashlib lets go of the GIL); None if it is not
    `total` bytes long."""
    buf: bytearray | mmap.mmap = _fits(into, total) if into is not None else \
        bytearray(total) if total <= IN_MEMORY_BYTES else _anonymous(total)
    h = hashlib.sha256()
    pos = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="diag-hash") as hasher:
        hashed: Future[None] | None = None
        try:
            for chunk in _inflate(path, f, size, max_bytes, damage):
                if pos + len(chunk) > total:
                    return None
                buf[pos : pos + len(chunk)] = chunk
                if hashed is not None:
                    hashed.result()
                hashed = hasher.submit(h.update, chunk)
                pos += len(chunk)
        finally:
            if hashed is not None:
                hashed.result()
    return (buf, h.hexdigest()) if pos == total else None


def _inflate(path: str, f: IO[bytes], size: int, max_bytes: int, damage: list[BadInput] | None) -> Iterator[bytes]:
    """The decompressed content in pieces of at most _INFLATE_PIECE, in bounded steps (zlib max_length),
    refusing more than `max_bytes` in all, and corrupt or truncated streams: with a `damage` list
    (salvage) the content ends there instead, the damage appended to the list. ISA-L's inflate (zlib's
    interface) takes 0.09 s where zlib takes 0.15 on the 35 MB control trace. Concatenated members
    (`cat a.gz b.gz`) are read one after another."""
    total = 0
    consumed = 0
    d = isal_zlib.decompressobj(wbits=47)
    buf = b""
    eof_input = False
    while True:
        if not buf and not eof_input:
            buf = f.read(_CHUNK)
            consumed += len(buf)
            eof_input = not buf
        try:
            chunk = d.decompress(buf, _INFLATE_PIECE)
        except _InflateError as e:
            bad = BadInput(path, f"corrupt gzip: {e}", consumed - len(buf))
            if damage is None:
                raise bad from None
            damage.append(bad)
            return
        buf = d.unconsumed_tail
        if chunk:
            total += len(chunk)
            if total > max_bytes:
                raise BadInput(path, f"decompresses to more than the {max_bytes} byte cap (raise it with --max-bytes)")
            yield chunk
        if d.eof:
            rest = d.unused_data
            if not rest.strip(b"\x00") and not eof_input:
                rest = f.read(_CHUNK)
                consumed += len(rest)
                eof_input = not rest
            if rest.strip(b"\x00"):  # another gzip member follows
                d = isal_zlib.decompressobj(wbits=47)
                buf = rest
                continue
            return
        if not chunk and not buf and eof_input:
            reason = "truncated gzip stream (the file was cut off while being written)"
            if damage is None:
                raise BadInput(path, f"{reason}; --salvage keeps the events before the cut", size)
            damage.append(BadInput(path, reason, size))
            return
