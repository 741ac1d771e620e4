"""What `diag ingest | analyze | demo | gate` do with their parsed arguments (diag/cli.py parses them).

Each handler takes the argparse namespace, does the work through the core (api, gate, report)
and returns an `ExitCode`; bad input is raised as BadInput for cli.main to print as one line.
Heavy modules are imported inside the handlers, so `diag --help` stays quick.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diag.ingest.early import begin_parse
from diag.ingest.source import is_duckdb_file
from diag.runtime import paths
from diag.runtime.durations import data_size
from diag.runtime.errors import BadInput, ExitCode
from diag.runtime.sanitize import printable, terminal

if TYPE_CHECKING:
    from diag.engine.run import AnalyzeOptions
    from diag.ingest.options import IngestOptions
    from diag.outputs.gate import Run


# ----------------------------------------------------------------------------- shared options

def analyze_options(args: argparse.Namespace) -> AnalyzeOptions:
    """The model options, checked before any work: a model that loads, and one whose MFU can be
    computed (a preset carries no tokens per step, and traces do not record it)."""
    from diag.engine.run import AnalyzeOptions
    from diag.knowledge import model

    if args.model is not None and args.tokens_per_step is None:
        spec = model.load_model(args.model)
        if spec.tokens_per_step is None:
            raise BadInput("--model", f"{args.model} gives no tokens per step, and the trace does not record it: "
                                      "pass --tokens-per-step N (global tokens per optimizer step)")
    return AnalyzeOptions(model=args.model, gpu=args.gpu, peak_tflops=args.peak_tflops,
                          tokens_per_step=args.tokens_per_step, all_steps=args.all_steps)


def ingest_options(args: argparse.Namespace) -> IngestOptions:
    from diag.ingest.options import IngestOptions

    return IngestOptions(salvage=args.salvage, max_bytes=args.max_bytes, rank=args.rank, jobs=args.jobs,
                         executor=args.executor, spill_dir=args.spill_dir)


def check_paths(args: argparse.Namespace, reads: list[str], writes: list[str | None]) -> None:
    """Before any work: what the command reads is there and readable (a regular file or a
    directory: no FIFO, no device), what it writes can be written, and --db is a DuckDB file or new."""
    for p in reads:
        paths.input_path(p)
    for out in writes:
        if out is not None:
            paths.output_path(out)
    if getattr(args, "db", None) is not None:
        paths.db_path(args.db)


def has_terminal() -> bool:
    """Both stdin and stdout are a terminal: a UI can be seen and driven."""
    return sys.stdin.isatty() and sys.stdout.isatty()


# ------------------------------------------------------------------------------------ ingest

def _parse_ahead(path: str, args: argparse.Namespace) -> None:
    """The file read ahead, if any, begins its parse now, before this process imports DuckDB and
    the analysis."""
    begin_parse(path, args.max_bytes, args.salvage, args.jobs, args.spill_dir)


def run_ingest(args: argparse.Namespace) -> int:
    check_paths(args, [], [])   # the traces: require_paths below, then each file as it is read
    _parse_ahead(args.paths[0], args)
    from diag.api_ingest import counted_warnings, ingest_paths, print_warnings
    from diag.ingest.discover import require_paths
    from diag.runtime import store
    from diag.runtime.progress import terminal_progress

    opts = ingest_options(args)
    require_paths(args.paths)   # before the store: a missing trace creates no --db file
    con = store.connect(args.db)
    try:
        with terminal_progress() as progress:
            result = ingest_paths(args.paths, con, opts, progress.task("ingest"))
        print_warnings(result.errors, counted_warnings(result))
        for s in result.skipped:
            print(terminal(f"diag: skipped {s.path}: {s.reason}"), file=sys.stderr)
        # One query for all: one per file took ~3 ms each, a tenth of ingesting 2,000 small files.
        rows = {r[0]: r[1:] for r in con.execute("SELECT file_id, rank, n_events, kind FROM trace_files").fetchall()}
        for path, file_id in result.ingested:
            rank, n_events, kind = rows[file_id]
            print(f"{terminal(path)}\trank={rank}\tevents={n_events}\tkind={kind}")   # a line that begins with a name
    finally:
        con.close()
    return ExitCode.OK


# ----------------------------------------------------------------------------------- analyze

def valid(report: dict[str, Any], path: str) -> dict[str, Any]:
    """The report, once the gate's own check (gate.check_report, on it as JSON) accepts it: whatever
    analyze writes, the gate reads. What it refuses is an impossible figure (MFU past 150%: a model
    or a peak that does not describe the run), said as this run's bad input."""
    import json

    from diag.outputs.gate import check_report
    from diag.outputs.report import to_json

    try:
        check_report(json.loads(to_json(report)), path)
    except BadInput as e:
        raise BadInput(path, f"the analysis gives an impossible report ({e.reason.split(': not a valid')[0]}): "
                             "check --model, --tokens-per-step, --gpu and --peak-tflops") from None
    return report


def _store_ahead(path: str, db: str | None) -> None:
    """Traces analyzed without --db: their in-memory store opens in a thread while this process
    imports the analysis (store.connect_ahead)."""
    from diag.runtime import store

    if db is None and not is_duckdb_file(path):
        store.connect_ahead()


def run_analyze(args: argparse.Namespace) -> int:
    check_paths(args, [args.path], [args.out])
    _parse_ahead(args.path, args)
    _store_ahead(args.path, args.db)
    from diag.api import analyze_and_use
    from diag.outputs.report import render

    opts, iopts = analyze_options(args), ingest_options(args)
    if args.format == "html":
        from diag.outputs.html_report import render_html

        # The page reads the store beside the report (top kernels with their achieved TFLOP/s).
        text = analyze_and_use(args.path, args.db, opts, iopts,
                               lambda con, a, report: render_html(valid(report, args.path), a, con,
                                                                  Path(args.path).name),
                               progress=True)
    else:
        text = analyze_and_use(args.path, args.db, opts, iopts,
                               lambda con, a, report: render(valid(report, args.path), args.format), progress=True)
    if args.out:
        _write(args.out, text)
    else:
        sys.stdout.write(text)
    return ExitCode.OK


# ------------------------------------------------------------------------------------ export

def run_export(args: argparse.Namespace) -> int:
    check_paths(args, [args.path], [args.perfetto])
    _store_ahead(args.path, args.db)
    from diag.api import analyze_and_use
    from diag.outputs.perfetto import Cut, export_perfetto, parse_ranges

    cut = Cut(parse_ranges(args.ranks, "--ranks") if args.ranks else None,
              parse_ranges(args.steps, "--steps") if args.steps else None)
    out = Path(args.perfetto)
    n = analyze_and_use(args.path, args.db, analyze_options(args), ingest_options(args),
                        lambda con, a, report: export_perfetto(con, a, report, out, cut), progress=True)
    print(f"{terminal(str(out))}\t{n} events\t{out.stat().st_size / 1e6:.1f} MB")
    return ExitCode.OK


def run_demo(args: argparse.Namespace) -> int:
    """The fixture generator's `demo` case: exposed all-reduce, a straggler (rank 5) and a slow
    data loader, on 8 H100 SXM ranks, with the model.toml that describes it. The run is generated
    into a temporary directory removed at the end, unless --out keeps it."""
    if args.out:
        return _demo(Path(args.out), args)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="diag-demo-") as tmp:
        return _demo(Path(tmp), args)


def _demo(out: Path, args: argparse.Namespace) -> int:
    from fixtures.generate import generate

    truth = generate("demo", out)
    where = printable(str(out)) if args.out else "a temporary directory (removed at the end; --out DIR keeps it)"
    print(f"diag demo: {truth.world_size} ranks × {truth.steps} steps written to {where}", file=sys.stderr)
    # Nobody can see a UI without a terminal on both ends (a pipe, a CI log, `</dev/null`): print instead.
    if not args.no_tui and has_terminal():
        from diag.engine.run import AnalyzeOptions
        from diag.ingest.options import IngestOptions
        from tui.app import DiagApp
        from tui.sources import PostMortem

        return int(DiagApp(PostMortem(str(out), None, AnalyzeOptions(), IngestOptions())).run() or 0)
    from diag.api import analyze_path
    from diag.outputs.report import render

    _, report = analyze_path(str(out))
    sys.stdout.write(render(report, args.format))
    return ExitCode.OK


# -------------------------------------------------------------------------------------- gate

def run_gate(args: argparse.Namespace) -> int:
    from diag.outputs import gate, gate_output

    github = os.environ.get("GITHUB_ACTIONS") == "true"
    try:
        check_paths(args, [args.baseline, args.current], [args.junit])
        budget = gate.load_budget(args.budget)
        opts, iopts = analyze_options(args), ingest_options(args)
        base = load_run(args.baseline, opts, iopts)
        cur = load_run(args.current, opts, iopts, args.db)   # --db keeps the current run's store for `diag tui`
        found = tuple(gate.mismatches(base.report, cur.report))
        if found and not args.allow_mismatch:
            raise BadInput(cur.path, f"not comparable with the baseline {base.path}: {'; '.join(found)}; "
                                     "pass --allow-mismatch to compare anyway")
        result = gate.compare(base, cur, budget, found)
    except BadInput as e:
        # CI still gets its annotation and its JUnit error before the one line on stderr (cli.main).
        if github:
            print(gate_output.annotation("error", "diag gate: bad input", e.one_line()), file=sys.stderr)
        if args.junit:
            _write(args.junit, gate_output.render_junit_error(e))
        raise
    sys.stdout.write(gate_output.render(result, args.format))
    if args.junit:
        _write(args.junit, gate_output.render_junit(result))
    if github:
        for line in gate_output.github_annotations(result):
            print(line, file=sys.stderr)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            _write(summary, gate_output.render_markdown(result), append=True)
    return ExitCode.GATE_FAILED if result.failed else ExitCode.OK


def _write(path: str, text: str, append: bool = False) -> None:
    """`text` into PATH; a file the user named (--out, --junit) is said on stderr, "wrote PATH (size)",
    so a run that prints nothing else on stdout still tells where its output went."""
    try:
        with open(path, "a" if append else "w", encoding="utf-8") as f:
            f.write(text)
        size = os.stat(path).st_size
    except OSError as e:
        raise BadInput(path, f"cannot write: {e.strerror or e}") from e
    if not append:
        print(f"wrote {printable(path)} ({data_size(size)})", file=sys.stderr)


def load_run(path: str, opts: AnalyzeOptions, ingest_opts: IngestOptions, db: str | None = None) -> Run:
    """A report from PATH for the gate: read as a `diag.report/1` JSON (the fast path: no DuckDB, no
    analysis imported), or analyzed from traces or a diag DuckDB file; `db` keeps what is ingested."""
    from diag.outputs.gate import Run, check_report, read_report_json

    p = Path(path)
    paths.input_path(path)   # there, and a regular file or a directory: a FIFO blocked the read forever
    doc = None if p.is_dir() or is_duckdb_file(p) else read_report_json(p)
    if doc is None or (isinstance(doc, dict) and "traceEvents" in doc):
        import json

        from diag.api import analyze_path
        from diag.outputs.report import to_json

        _, report = analyze_path(path, db, opts, ingest_opts)
        # Through JSON, so the gate sees exactly what `diag analyze --format json` would have written.
        doc = json.loads(to_json(report))
    return Run(path, check_report(doc, path))
