"""The ingest that `diag ingest` and every analyzing command share: paths into a store, and what
is said about the files on stderr. Apart from diag/api.py so that `diag ingest` imports no analysis
(the engine, the rules, the report: 0.1 s of CPU in every ingest, `python -X importtime`)."""

from __future__ import annotations

import re
import sys

import duckdb

from diag.ingest.options import IngestOptions, IngestResult
from diag.ingest.pipeline import ingest
from diag.runtime.errors import BadInput
from diag.runtime.progress import Progress
from diag.runtime.sanitize import printable

# discover.py's names, as a user would type them.
LOOKED_FOR = "*.json, *.json.gz, *.pt.trace.json[.gz]"


def ingest_paths(paths: list[str], con: duckdb.DuckDBPyConnection, opts: IngestOptions = IngestOptions(),
                 progress: Progress | None = None) -> IngestResult:
    """PATHS ingested into `con`: what `diag ingest` and every analyzing command share. Each file is
    its own unit: one that cannot be read is left out (the caller warns) while another made it in,
    now or before; when none did, each is said on stderr and the last raised (exit 2), and when
    there was nothing to read at all, that none was found."""
    result = ingest(paths, con, opts, progress=progress)
    if result.ingested or any(s.duplicate for s in result.skipped):
        return result
    if result.errors:
        for e in result.errors[:-1]:
            print(e.message(), file=sys.stderr)
        raise result.errors[-1]
    raise BadInput(", ".join(paths), f"no Kineto traces found (looked for {LOOKED_FOR})")


def counted_warnings(result: IngestResult) -> list[str]:
    """The ingest's per-file warnings, one line per distinct reason: a thousand CPU-only ranks give
    one line that counts them and names the first, not a thousand lines."""
    paths = {p for p, _ in result.ingested}
    by_reason: dict[str, list[str]] = {}
    for w in result.warnings:
        # `<path>: <reason>`; a path may hold ": " itself, so the longest prefix that is a path wins
        # (a set lookup per ": ", not a scan of every path: 10,000 ranks warn 10,000 times).
        cuts = [m.start() for m in re.finditer(": ", w)]
        path = next((w[:i] for i in reversed(cuts) if w[:i] in paths), "")
        by_reason.setdefault(w[len(path) + 2:] if path else w, []).append(path)
    lines = []
    for reason, files in by_reason.items():
        if not files[0]:
            lines.append(reason)                 # a warning about no one file
        elif len(files) == 1:
            lines.append(f"{files[0]}: {reason}")
        else:
            lines.append(f"{len(files)} files: {reason} (the first: {files[0]})")
    return lines


def print_warnings(errors: list[BadInput], warnings: list[str]) -> None:
    """On stderr, alike for every command: `diag: warning: …`, one line each."""
    for w in warnings:
        print(f"diag: warning: {printable(w)}", file=sys.stderr)
    for e in errors:
        print(f"diag: warning: {e.one_line()}; left out, the other files read", file=sys.stderr)
