"""Reading a trace file's bytes safely: gzip with a cap on the decompressed size, and a content hash."""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path

from diag.errors import BadInput

# A Kineto trace of a real job is hundreds of MB per rank; 8 GiB decompressed is beyond any
# trace we have seen and small enough that a gzip bomb (1 GB of zeros packs to ~1 MB) is refused
# long before it exhausts memory. `--max-bytes` changes it.
DEFAULT_MAX_BYTES = 8 * 1024**3
_CHUNK = 16 * 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class SourceBytes:
    path: str
    data: bytes          # decompressed content
    content_hash: str    # blake2b-128 of `data`: the same trace gzipped or not is the same content
    compressed: bool


def read_source(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> SourceBytes:
    """Read and (if gzip) decompress a file, refusing empty files, corrupt gzip and bombs."""
    p = str(path)
    try:
        raw = Path(p).read_bytes()
    except OSError as e:
        raise BadInput(p, f"cannot read: {e.strerror or e}") from None
    if not raw:
        raise BadInput(p, "empty file", 0)
    compressed = raw[:2] == _GZIP_MAGIC
    data = _gunzip(p, raw, max_bytes) if compressed else raw
    if len(data) > max_bytes:
        raise BadInput(p, f"larger than the {max_bytes} byte cap (raise it with --max-bytes)")
    if not data.strip():
        raise BadInput(p, "empty trace (only whitespace)", 0)
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    return SourceBytes(p, data, digest, compressed)


def _gunzip(path: str, raw: bytes, max_bytes: int) -> bytes:
    # zlib with wbits=47 reads gzip (and concatenated members via unused_data). max_length bounds
    # each step, so a bomb is stopped at the cap instead of being inflated whole.
    out = bytearray()
    d = zlib.decompressobj(wbits=47)
    buf = raw
    while True:
        try:
            chunk = d.decompress(buf, _CHUNK)
        except zlib.error as e:
            raise BadInput(path, f"corrupt gzip: {e}", len(raw) - len(d.unconsumed_tail)) from None
        out += chunk
        if len(out) > max_bytes:
            raise BadInput(
                path, f"decompresses to more than the {max_bytes} byte cap (raise it with --max-bytes)"
            )
        buf = d.unconsumed_tail
        if d.eof:
            if d.unused_data.strip(b"\x00"):  # another gzip member follows
                buf = d.unused_data
                d = zlib.decompressobj(wbits=47)
                continue
            break
        if not buf and not chunk:
            raise BadInput(path, "truncated gzip stream (the file was cut off while being written)", len(raw))
    return bytes(out)
