"""diag in a notebook: one call from traces (or a diag DuckDB file) to the report and its tables.

    import diag
    run = diag.open("path/to/trace_dir")   # ingest (in memory) and analyze, as `diag analyze` does
    run.report.mfu                          # the typed report (diag/outputs/report_types.py)
    run.ledger()                            # polars DataFrame: rank × step × bucket
    run.sql("SELECT ...")                   # any query on the store (diag/sql/*.sql document the tables)

docs/notebook.md is a worked session. The tables come from DuckDB as Arrow and polars takes their
buffers as they are (no row passes through Python); findings() is the report's own list.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import TYPE_CHECKING, Any

from diag.api import analyze_opened, open_store
from diag.api_ingest import print_warnings
from diag.engine.run import AnalyzeOptions, gpu_part
from diag.outputs.report import render_markdown, render_text, to_json
from diag.outputs.report_types import Report
from diag.runtime import store

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from diag.engine.run import Analysis


def open(path: str | os.PathLike[str], db: str | os.PathLike[str] | None = None, *,  # noqa: A001
         model: str | None = None, gpu: str | None = None, peak_tflops: float | None = None,
         tokens_per_step: float | None = None, all_steps: bool = False) -> Run:
    """PATH (a trace file, a trace directory or a diag DuckDB file) ingested and analyzed, with the
    options `diag analyze` takes (`--model` is `model=`, and so on). Traces go into `db` when given
    (kept for `diag tui DB`), else into memory. Files that cannot be read are said on stderr, as the
    command says them; bad input raises diag.runtime.errors.BadInput (its message is the CLI's line)."""
    part = gpu_part(gpu)   # as typed: 'h100', 'H100-SXM', the trace's device name
    opts = AnalyzeOptions(model=model, gpu=part.key if part else None, peak_tflops=peak_tflops,
                          tokens_per_step=tokens_per_step, all_steps=all_steps)
    path = os.fspath(path)
    opened = open_store(path, None if db is None else os.fspath(db))
    try:
        analysis, document = analyze_opened(opened.con, opts, opened.model_file, len(opened.errors))
    except BaseException:
        opened.con.close()
        raise
    print_warnings(opened.errors, opened.warnings)
    return Run(path, opened.con, analysis, document)


class Run:
    """An analyzed run, its store open: close() it, or use it in a `with` block."""

    def __init__(self, path: str, con: duckdb.DuckDBPyConnection, analysis: Analysis,
                 document: dict[str, Any]) -> None:
        self.path = path
        self.con = con
        self.analysis = analysis      # the engine's result (diag/engine/run.py), for what the report leaves out
        self.document = document      # the report as `diag analyze --format json` prints it (a dict)
        self._typed: Report | None = None

    @property
    def report(self) -> Report:
        """The report as typed records: run.report.mfu, run.report.findings[0].advice, ..."""
        if self._typed is None:
            # Through the JSON the CLI prints: the same numbers, and NumPy scalars become Python's.
            import msgspec

            self._typed = msgspec.json.decode(to_json(self.document), type=Report)
        return self._typed

    def text(self) -> str:
        """The text report `diag analyze` prints."""
        return render_text(self.document)

    def ledger(self) -> pl.DataFrame:
        """rank, step, bucket, seconds, fraction: the twelve buckets of every rank-step the means keep."""
        return self._frame("ledger")

    def steps(self) -> pl.DataFrame:
        """One row per rank and step: the GPU window and its states in ns; in_means false where the
        report leaves the step out (warm-up, teardown)."""
        return self._frame("steps")

    def kernels(self) -> pl.DataFrame:
        """GPU activities by name over all ranks, most time first: calls, seconds, share, TFLOP/s achieved."""
        return self._frame("kernels")

    def collectives(self) -> pl.DataFrame:
        """Every collective call on every rank, matched across ranks (instance), with its wait and bandwidth."""
        return self._frame("collectives")

    def critical_path(self) -> pl.DataFrame:
        """Each step's cross-rank critical path, one row per segment, aligned clock."""
        return self._frame("critical_path")

    def findings(self) -> pl.DataFrame:
        """The report's findings, in its order (what a fix can win), one row each; details stay in
        run.report.findings[i].details."""
        import polars as pl

        columns = ("code", "slug", "severity", "bucket", "mfu_points", "recoverable_fraction", "lost_fraction",
                   "lost_s", "what_if_mfu", "ranks", "steps", "summary", "advice")
        rows = [{c: f[c] for c in columns} for f in self.document["findings"]]
        schema: dict[str, Any] = {"code": pl.String, "slug": pl.String, "severity": pl.String, "bucket": pl.String,
                  "mfu_points": pl.Float64, "recoverable_fraction": pl.Float64, "lost_fraction": pl.Float64,
                  "lost_s": pl.Float64, "what_if_mfu": pl.Float64, "ranks": pl.List(pl.Int64),
                  "steps": pl.List(pl.Int64), "summary": pl.String, "advice": pl.String}
        return pl.DataFrame(rows, schema=schema)

    def sql(self, query: str, params: Any = None) -> pl.DataFrame:
        """Any query on the store: the event tables (diag/sql/schema.sql) and the analysis tables
        (rank_tables.sql, analysis.sql)."""
        import polars as pl

        # A cursor of its own: a query the user left unfinished on run.con does not block this one.
        with self.con.cursor() as cur:
            return pl.from_arrow(store.arrow_table(cur, query, params))   # type: ignore[return-value]

    def _frame(self, name: str) -> pl.DataFrame:
        return self.sql(store.named_queries("notebook.sql")[name])

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        r = self.document
        return f"<diag.Run {self.path!r}: {len(r['ranks'])} of {r['world_size']} ranks, {r['steps']} steps, " \
               f"MFU {'unknown' if r['mfu'] is None else format(r['mfu'], '.1%')}, {len(r['findings'])} findings>"

    def _repr_markdown_(self) -> str:
        """Jupyter shows the Markdown report for a cell that ends in `run`."""
        return render_markdown(self.document)


__all__ = ["Run", "open"]
