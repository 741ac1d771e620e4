"""Finding trace files under the paths a user gives, and reading a rank from a file name."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

import msgspec

from diag.runtime.errors import BadInput, in_words

# .log: NCCL Inspector writes `<hostname>-pid<pid>.log`; content decides whether it is one.
_TRACE_SUFFIXES = (".json", ".json.gz", ".ndjson", ".jsonl", ".log", ".log.gz")
# Flight Recorder dumps are named `nccl_trace_rank_N` (prefix configurable), no extension.
_EXTENSIONLESS_DUMP = re.compile(r"(^|_)trace_rank_\d+$")
# Files the tools beside diag write into a trace directory and that are never traces.
_NOT_TRACES = frozenset({"truth.json", "expected.json"})

# A rank in a name has at most 6 digits: world sizes reach the hundreds of thousands, not 10^6. A
# longer number is a date (`trace_20240101.json`), a timestamp or a pid, never a rank.
_RANK = r"(\d{1,6})"
# `rank-3.json`, `rank_3.pt.trace.json.gz`, `rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz`,
# `nccl_trace_rank_5`, `trace_rank3.json`; `worker3.<time_ns>.pt.trace.json` (a worker_name chosen
# for tensorboard_trace_handler).
_RANK_IN_NAME = re.compile(rf"(?:^|[^a-z])(?:rank|worker)[-_]?{_RANK}(?:[^0-9]|$)", re.IGNORECASE)
# sglang's per-rank files (python/sglang/srt/managers/scheduler_profiler_mixin.py):
# `[<prefix>-]<time.time()>-TP-<tp rank>[-DP-<dp>][-PP-<pp>][-EP-<ep>][-<stage>].trace.json.gz`. With
# only TP (and EP, a split inside the TP group) the TP rank is the rank; with DP or PP in the name
# the global rank needs sizes the name does not give, so the name says none.
_SGLANG_TP = re.compile(rf"-TP-{_RANK}(?:-EP-\d+)?(?:-[A-Za-z]+)?\.trace\.json(?:\.gz)?$")
# The weakest form, `profile_3.json`: a number after the last underscore, just before the extension.
_NUMBER_BEFORE_SUFFIX = re.compile(rf"_{_RANK}\.(?:pt\.trace\.)?json(?:\.gz)?$")
# torch.profiler.tensorboard_trace_handler writes `<worker_name>.<time.time_ns()>.pt.trace.json[.gz]`,
# worker_name defaulting to `<hostname>_<pid>` (torch/profiler/profiler.py): that number is a pid,
# never a rank. A hostname may hold dots and underscores; time_ns has 19 digits today.
_TENSORBOARD_NAME = re.compile(r"^(?P<worker>.+)\.(?P<time_ns>\d{16,})\.pt\.trace\.json(?:\.gz)?$")
_DEFAULT_WORKER = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)$")


class NameParts(msgspec.Struct, frozen=True):
    """What a trace file's name says about who wrote it."""

    rank: int | None
    host: str | None     # from tensorboard_trace_handler's default worker name
    pid: int | None

class Found(NamedTuple):
    files: list[str]             # to ingest
    explicit: list[str]          # of those, the files named themselves
    unreadable: list[BadInput]   # directories that could not be listed: their traces, if any, left out


def discover(paths: list[str]) -> Found:
    """The files to ingest from files and directories (searched recursively).

    Directory scans take names ending .json/.json.gz/.ndjson/.jsonl and extension-less
    Flight Recorder dumps, in a stable order, whatever they are (what is not a regular file is
    then left out with a warning); files named explicitly are always taken. A directory that
    cannot be listed (permissions) is returned as a BadInput, for the caller to warn about: rglob
    passes over it without a word.
    """
    found: list[str] = []
    explicit: list[str] = []
    unreadable: list[BadInput] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            for f in [path, *sorted(path.rglob("*"))]:
                if f.is_dir():
                    reason = _unlistable(f)
                    if reason:
                        unreadable.append(BadInput(str(f), f"directory not read ({reason}); its traces, if any, "
                                                            "left out"))
                # Not only regular files: a FIFO, a device or a link to one (/dev/zero) under a
                # trace's name was skipped without a word; read_source refuses it, as a warning.
                elif _looks_like_trace(f):
                    found.append(_as_found(f))
        elif path.exists():
            # Named explicitly: read_source says what it is if not a regular file (a FIFO, a device).
            found.append(str(path.resolve()))
            explicit.append(str(path.resolve()))
        else:
            raise BadInput(p, "no such file or directory")
    unique = list(dict.fromkeys(found))
    return Found(unique, explicit, unreadable)


def _unlistable(directory: Path) -> str | None:
    """Why `directory` cannot be listed, or None."""
    try:
        with os.scandir(directory):
            return None
    except OSError as e:
        return in_words(e)


def _as_found(f: Path) -> str:
    """The file's resolved path (one file reached by two links is read once); a link to what is not a
    regular file (/dev/zero, a FIFO) by its own name, which its warning then names."""
    resolved = f.resolve()
    return str(resolved) if resolved.is_file() or not f.is_symlink() else str(f.absolute())


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
    return name_parts(path).rank


def name_parts(path: str) -> NameParts:
    """The rank a file name carries (`rank3`, `rank-3`, `rank_3`, `worker3`, sglang's `-TP-3`, else
    `_3.` before the extension; at most 6 digits), or the hostname and pid of tensorboard_trace_handler's default name."""
    name = Path(path).name
    tb = _TENSORBOARD_NAME.match(name)
    if tb is None:
        m = _RANK_IN_NAME.search(name) or _SGLANG_TP.search(name) or _NUMBER_BEFORE_SUFFIX.search(name)
        return NameParts(int(m.group(1)) if m else None, None, None)
    worker = tb.group("worker")
    m = _RANK_IN_NAME.search(worker)
    if m and m.span(1)[1] == len(worker):   # `rank_3`, `worker3`: a worker_name chosen by rank
        return NameParts(int(m.group(1)), None, None)
    # The default `<hostname>_<pid>`: a hostname such as `job-worker-3` names a machine, not a rank.
    default = _DEFAULT_WORKER.match(worker)
    if default:
        return NameParts(None, default.group("host"), int(default.group("pid")))
    return NameParts(int(m.group(1)) if m else None, None, None)
