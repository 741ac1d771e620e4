"""One call from a path to an analysis: what analyze, tui, live and gate share."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import msgspec
from msgspec.structs import replace

from diag.api_ingest import LOOKED_FOR, counted_warnings, ingest_paths, print_warnings
from diag.attribution.digest import RankDigest
from diag.engine.run import Analysis, AnalyzeOptions, analyze
from diag.ingest.discover import require_paths
from diag.ingest.options import IngestOptions
from diag.ingest.source import is_duckdb_file
from diag.outputs.consistency import contradictions
from diag.outputs.report import build_report
from diag.runtime import store
from diag.runtime.errors import BadInput
from diag.runtime.executor import Executor, make_executor
from diag.runtime.progress import Bars, Progress, terminal_progress

T = TypeVar("T")


class Opened(msgspec.Struct):
    con: duckdb.DuckDBPyConnection
    errors: list[BadInput] = msgspec.field(default_factory=list)   # files left out
    model_file: str | None = None      # model.toml found beside the traces
    warnings: list[str] = msgspec.field(default_factory=list)   # for the user whatever the command


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
