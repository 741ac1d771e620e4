"""One call from a path to an analysis: what analyze, tui, live and gate share."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import msgspec
from msgspec.structs import replace

from diag.attribution.digest import RankDigest
from diag.engine.run import Analysis, AnalyzeOptions, analyze
from diag.ingest.discover import require_paths
from diag.ingest.options import IngestOptions, IngestResult
from diag.ingest.pipeline import ingest
from diag.ingest.source import is_duckdb_file
from diag.outputs.consistency import contradictions
from diag.outputs.report import build_report
from diag.runtime import store
from diag.runtime.errors import BadInput
from diag.runtime.executor import Executor, make_executor
from diag.runtime.progress import Bars, Progress, terminal_progress
from diag.runtime.sanitize import printable

T = TypeVar("T")


class Opened(msgspec.Struct):
    con: duckdb.DuckDBPyConnection
    errors: list[BadInput] = msgspec.field(default_factory=list)   # files left out
    model_file: str | None = None      # model.toml found beside the traces
    warnings: list[str] = msgspec.field(default_factory=list)   # for the user whatever the command


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


def open_store(path: str, db: str | None, ingest_opts: IngestOptions = IngestOptions(),
               progress: Progress | None = None) -> Opened:
    """A store holding PATH: the DuckDB file itself, or PATH's traces ingested into `db`
    (in memory when None). Files that cannot be read are returned, not raised, unless none can."""
    if is_duckdb_file(path):
        return Opened(store.connect(path))
    require_paths([path])   # before the store: a missing trace creates no --db file
    con = store.connect(db)
    try:
        result = ingest_paths([path], con, ingest_opts, progress)
        if not con.execute("SELECT count(*) FROM trace_files WHERE kind = 'kineto'").fetchall()[0][0]:
            raise BadInput(path, f"no Kineto traces found (looked for {LOOKED_FOR}); NCCL-side dumps alone "
                                 "cannot be analyzed")
    except BaseException:
        con.close()
        raise
    model = Path(path) / "model.toml" if Path(path).is_dir() else Path(path).parent / "model.toml"
    return Opened(con, result.errors, str(model) if model.is_file() else None, counted_warnings(result))


def _ingest_notes(con: duckdb.DuckDBPyConnection) -> list[str]:
    """What ingest did to the traces' values (kept with a counted warning, never silently) and
    which traces were salvaged up to damage: the report says it beside the numbers they feed."""
    # Only the files with something to say reach Python (10,000 small ranks: 0.6 s for all).
    rows = con.execute(
        """
        SELECT rank, path, partial, damage_offset, n_events, v FROM (
            SELECT *, list_filter(from_json(coalesce(warnings, '[]'), '["VARCHAR"]'), lambda w: starts_with(w, 'values: '))
                   AS v
            FROM trace_files WHERE kind = 'kineto'
        ) WHERE partial OR len(v) > 0 ORDER BY rank, capture_window, file_id
        """
    ).fetchall()
    notes = []
    for rank, path, partial, damage, n_events, values in rows:
        name = Path(path).name
        if partial:
            notes.append(f"rank {rank} ({name}): damaged at byte {damage}; analyzed the {n_events} complete "
                         "events before it (--salvage)")
        notes.extend(f"rank {rank} ({name}): {w.removeprefix('values: ')}" for w in values)
    return notes


def analyze_path(path: str, db: str | None = None, opts: AnalyzeOptions = AnalyzeOptions(),
                 ingest_opts: IngestOptions = IngestOptions(), warn: bool = True,
                 progress: bool = False) -> tuple[Analysis, dict[str, Any]]:
    """PATH ingested and analyzed, the files left out said on stderr; with `progress`, bars for
    both on a terminal (diag/runtime/progress.py)."""
    return analyze_and_use(path, db, opts, ingest_opts, lambda con, a, report: (a, report), warn, progress)


def analyze_and_use(path: str, db: str | None, opts: AnalyzeOptions, ingest_opts: IngestOptions,
                    use: Callable[[duckdb.DuckDBPyConnection, Analysis, dict[str, Any]], T],
                    warn: bool = True, progress: bool = False) -> T:
    """As analyze_path, with `use` called on the store while it is still open: outputs that read
    the store beside the report (the HTML page's top kernels, the Perfetto export)."""
    # --executor ray: one Ray for the parse and the analysis map (the ingest joins it). Locally the
    # map runs in this process, or in a pool for many small files (engine._map_pool).
    with make_executor("ray", ingest_opts.jobs) if ingest_opts.executor == "ray" else nullcontext() as executor, \
            terminal_progress() if progress else nullcontext(Bars(None)) as bars:
        opened = open_store(path, db, ingest_opts, bars.task("ingest"))
        try:
            a, report = analyze_opened(opened.con, opts, opened.model_file, len(opened.errors),
                                       executor=executor, spill_dir=ingest_opts.spill_dir,
                                       progress=bars.task("ranks"), jobs=ingest_opts.jobs)
            used = use(opened.con, a, report)
        finally:
            opened.con.close()
    # After the analysis: when it fails (exit 2) its one line is all stderr says.
    if warn:
        print_warnings(opened.errors, opened.warnings)
    return used


def analyze_opened(con: duckdb.DuckDBPyConnection, opts: AnalyzeOptions, model_file: str | None = None,
                   unreadable: int = 0, cache: dict[int, RankDigest] | None = None,
                   executor: Executor[Any] | None = None, spill_dir: str | None = None,
                   progress: Progress | None = None, jobs: int | None = None) -> tuple[Analysis, dict[str, Any]]:
    """Rebuild the analysis tables and the report (engine.analyze: readers on other cursors see
    the old run tables or the new ones, never a mix); the connection stays open. `cache`: see
    engine.analyze (kept by the caller across analyses of this store with the same options), as
    `executor`, `spill_dir` and `jobs` (where the map runs), and `progress` (called per rank file
    mapped)."""
    if opts.model is None and model_file:
        opts = replace(opts, model=model_file)
    if opts.model is None and opts.tokens_per_step is not None:   # it would be ignored without a word
        raise BadInput("--tokens-per-step", "needs a model to apply to: --model PRESET|FILE.toml, or a model.toml "
                                            "beside the traces (without one, model FLOPs come from the trace)")
    try:
        a = analyze(con, opts, cache, executor, spill_dir, progress, jobs)
    except BaseException:
        if cache is not None:
            cache.clear()   # whatever failed, the next analysis starts over: every file mapped again
        raise
    if unreadable:
        a.run.notes.append(f"{unreadable} file(s) could not be read and were left out")
    a.run.notes.extend(_ingest_notes(con))
    if model_file and opts.model == model_file:
        a.run.notes.append(f"model description from {model_file}")
    report = build_report(a)
    # One truth per report (diag/outputs/consistency.py): a disagreement is a bug, said where it is read.
    report["notes"].extend(f"internal check failed: {c} (a bug in diag; please report it with this note)"
                           for c in contradictions(report, a))
    return a, report
