"""Finding trace files under the paths a user gives, and reading a rank from a file name."""

from __future__ import annotations

import os
import re
from pathlib import Path

from diag.errors import BadInput

# .log: NCCL Inspector writes `<hostname>-pid<pid>.log`; content decides whether it is one.
_TRACE_SUFFIXES = (".json", ".json.gz", ".ndjson", ".jsonl", ".log", ".log.gz")
# Flight Recorder dumps are named `nccl_trace_rank_N` (prefix configurable), no extension.
_EXTENSIONLESS_DUMP = re.compile(r"(^|_)trace_rank_\d+$")
# Files the tools beside diag write into a trace directory and that are never traces.
_NOT_TRACES = frozenset({"truth.json", "expected.json"})

# `rank-3.json`, `rank_3.pt.trace.json.gz`, `rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz`,
# `nccl_trace_rank_5`, `trace_rank3.json`.
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?:[^0-9]|$)", re.IGNORECASE)


def discover(paths: list[str]) -> tuple[list[str], list[str]]:
    """(files to ingest, explicitly named files) from files and directories (searched recursively).

    Directory scans take names ending .json/.json.gz/.ndjson/.jsonl and extension-less
    Flight Recorder dumps, in a stable order; files named explicitly are always taken.
    """
    found: list[str] = []
    explicit: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            for f in sorted(path.rglob("*")):
                if f.is_file() and _looks_like_trace(f):
                    found.append(str(f.resolve()))
        elif path.exists():
            # Named explicitly: read_source says what it is if not a regular file (a FIFO, a device).
            found.append(str(path.resolve()))
            explicit.append(str(path.resolve()))
        else:
            raise BadInput(p, "no such file or directory")
    unique = list(dict.fromkeys(found))
    return unique, explicit


def require_paths(paths: list[str]) -> None:
    """Refuse a path that does not exist before anything (a store file) is created for it."""
    for p in paths:
        if not os.path.lexists(p):
            raise BadInput(p, "no such file or directory")


def _looks_like_trace(f: Path) -> bool:
    name = f.name
    if name in _NOT_TRACES or name.startswith("."):
        return False
    return name.endswith(_TRACE_SUFFIXES) or bool(_EXTENSIONLESS_DUMP.search(name))


def rank_from_name(path: str) -> int | None:
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None
