"""Paths checked before any work (issue 40, items 4, 6 and 7): what a command reads is a regular
file or a directory it can read, what it writes goes where it can write, and `--db` names a DuckDB
file or nothing yet. Each failure is one BadInput line naming the path, exit 2.

Found by trying: `diag gate --baseline /dev/zero` read until the OOM killer came (24 GB), a FIFO
as the baseline blocked forever, `--db x.json` opened the JSON as a view in an in-memory database
(nothing stored, exit 0), `export --perfetto DIR` failed after the whole analysis, and an
unreadable file or a name past PATH_MAX raised PermissionError/OSError (exit 3).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from diag.runtime.errors import BadInput

_DUCKDB_MAGIC = b"DUCK"   # bytes 8..12 of a DuckDB database file
NOT_A_STORE = "not a DuckDB database file (a diag store is one); give a new file name or a store diag made"


def is_duckdb_head(head: bytes) -> bool:
    """Whether a file that begins with `head` (its first 12 bytes or more) is a DuckDB database."""
    return head[8:12] == _DUCKDB_MAGIC


def _stat(path: str) -> os.stat_result | None:
    """The path's stat (following links), None if nothing is there; any other failure (no
    permission on a directory above it, a name longer than the system allows) is BadInput."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as e:
        raise BadInput(path, f"cannot be looked at: {e.strerror or e}") from None


def file_kind(mode: int) -> str:
    """What a path that is no regular file or directory is, for a message."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def input_path(path: str, dirs: bool = True) -> os.stat_result:
    """A path a command reads: there, a regular file it may read (or, with `dirs`, a directory),
    never a FIFO or a device (a read that blocks forever, or never ends)."""
    st = _stat(path)
    if st is None:
        raise BadInput(path, "no such file or directory")
    if stat.S_ISDIR(st.st_mode) and dirs:
        return st
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else file_kind(st.st_mode)
        raise BadInput(path, f"{what}: diag reads regular files{' and directories' if dirs else ''}")
    if not os.access(path, os.R_OK):
        raise BadInput(path, "cannot read: Permission denied")
    return st


def read_capped(path: str, cap_bytes: int, what: str) -> bytes:
    """A small input (a report, a budget) read whole, refused past `cap_bytes` whatever its size
    says (a file growing while it is read): never more than that in memory."""
    input_path(path, dirs=False)
    try:
        with open(path, "rb") as f:
            data = f.read(cap_bytes + 1)
    except OSError as e:
        raise BadInput(path, f"cannot read: {e.strerror or e}") from None
    if len(data) > cap_bytes:
        raise BadInput(path, f"larger than {cap_bytes >> 20} MiB: too large to be {what}")
    return data


def output_path(path: str) -> None:
    """A file a command will write: not a directory, in a directory that exists and can be written
    (checked before the analysis, not after it). A device (/dev/stdout) is taken as given: a write
    that fails there (/dev/full) is the write's BadInput."""
    st = _stat(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise BadInput(path, "is a directory: give a file name to write")
    if st is not None and not stat.S_ISREG(st.st_mode):
        return
    parent = os.path.dirname(os.path.abspath(path))
    pst = _stat(parent)
    if pst is None or not stat.S_ISDIR(pst.st_mode):
        raise BadInput(path, f"cannot be written: no such directory {parent}")
    if not os.access(path if st is not None else parent, os.W_OK):
        raise BadInput(path, "cannot be written: Permission denied")


def db_path(path: str) -> None:
    """`--db`: a DuckDB file (by its header, not its name), or a new one (store.connect says why it
    cannot be made). DuckDB opens a .json, .csv or .parquet file given as a database as an
    in-memory database with a view over it: nothing would be stored, and exit 0."""
    st = _stat(path)
    if st is None:
        return
    input_path(path, dirs=False)
    if st.st_size == 0:
        return   # an empty file: DuckDB makes it a database
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError as e:
        raise BadInput(path, f"cannot read: {e.strerror or e}") from None
    if not is_duckdb_head(head):
        raise BadInput(path, f"cannot open the store: {NOT_A_STORE}")
    if not os.access(path, os.W_OK):
        raise BadInput(path, "cannot be written: Permission denied (--db is written to)")


def is_duckdb(path: str | Path) -> bool:
    """Whether `path` is a DuckDB database (a diag store): a regular file whose header says so.
    One that cannot be read is BadInput, not an internal error."""
    st = _stat(str(path))
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    try:
        with open(path, "rb") as f:
            return is_duckdb_head(f.read(12))
    except OSError as e:
        raise BadInput(str(path), f"cannot read: {e.strerror or e}") from None
