"""The subcommands beyond `ingest`, each registered from the module that implements it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from diag.errors import ExitCode

Register = Callable[[argparse._SubParsersAction], None]  # type: ignore[type-arg]


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The options analyze, tui, live and gate share (DESIGN.md contract)."""
    p.add_argument("--db", default=None, help="DuckDB file to ingest into and keep (default: in memory)")
    p.add_argument("--model", default=None,
                   help="llama3-8b | llama3-70b | llama3-405b | FILE.toml (default: model.toml beside the traces, "
                        "else FLOPs inferred from the trace)")
    p.add_argument("--gpu", default=None, help="hardware part: h100-sxm, h100-pcie, h100-nvl, h200, a100, b200, ...")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="override the dense peak (still checked against 'with sparsity' figures)")
    p.add_argument("--tokens-per-step", type=float, default=None,
                   help="global tokens per optimizer step (what a --model preset needs for MFU)")
    p.add_argument("--all-steps", action="store_true",
                   help="keep warm-up and teardown steps in the means (left out and listed by default)")


def analyze_options(args: argparse.Namespace) -> object:
    from diag.engine import AnalyzeOptions

    return AnalyzeOptions(model=args.model, gpu=args.gpu, peak_tflops=args.peak_tflops,
                          tokens_per_step=args.tokens_per_step, all_steps=args.all_steps)


def _register_analyze(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from diag.cli import add_ingest_options

    p = sub.add_parser("analyze", help="ingest what is new, attribute every step, print the report")
    p.add_argument("path", help="trace directory, trace file, or a diag DuckDB file")
    add_model_options(p)
    add_ingest_options(p)
    p.add_argument("--format", choices=("text", "json", "markdown", "html"), default="text",
                   help="html: one self-contained page with charts (no network)")
    p.add_argument("--out", default=None, help="write the report here instead of stdout")
    p.set_defaults(handler=_run_analyze)


def _run_analyze(args: argparse.Namespace) -> int:
    from diag.api import analyze_path
    from diag.cli import ingest_options
    from diag.engine import AnalyzeOptions
    from diag.ingest.pipeline import IngestOptions
    from diag.report import render

    opts = analyze_options(args)
    iopts = ingest_options(args)
    assert isinstance(opts, AnalyzeOptions) and isinstance(iopts, IngestOptions)
    if args.format == "html":
        text = _html_report(args.path, args.db, opts, iopts)
    else:
        _, report = analyze_path(args.path, args.db, opts, iopts)
        text = render(report, args.format)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return ExitCode.OK


def _html_report(path: str, db: str | None, opts: object, iopts: object) -> str:
    """The HTML page needs the store beside the report (top kernels): analyzed on an open store."""
    from diag.api import analyze_opened, open_store
    from diag.engine import AnalyzeOptions
    from diag.html_report import render_html
    from diag.ingest.pipeline import IngestOptions

    assert isinstance(opts, AnalyzeOptions) and isinstance(iopts, IngestOptions)
    opened = open_store(path, db, iopts)
    for e in opened.errors:
        print(f"diag: warning: {e.one_line()}; analyzing the other files", file=sys.stderr)
    try:
        a, report = analyze_opened(opened.con, opts, opened.model_file, len(opened.errors))
        return render_html(report, a, opened.con, Path(path).name)
    finally:
        opened.con.close()


def _register_mfu(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from diag.mfu import add_mfu_arguments, run_mfu

    p = sub.add_parser("mfu", help="MFU from tokens/s (or tokens/s from MFU) for a model and GPU count")
    add_mfu_arguments(p)
    p.set_defaults(handler=run_mfu)


def _register_demo(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("demo", help="generate a small 8-rank H100 run with known causes, analyze it, open the UI")
    p.add_argument("--out", default=None, help="keep the generated traces here (default: a temporary directory)")
    p.add_argument("--no-tui", action="store_true", help="print the report instead of opening the UI")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    """The fixture generator's `demo` case: exposed all-reduce, a straggler (rank 5) and a slow
    data loader, on 8 H100 SXM ranks, with the model.toml that describes it."""
    import tempfile

    from fixtures.generate import generate

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="diag-demo-"))
    truth = generate("demo", out)
    print(f"diag demo: {truth.world_size} ranks × {truth.steps} steps written to {out}", file=sys.stderr)
    if not args.no_tui:
        from diag.engine import AnalyzeOptions
        from diag.ingest.pipeline import IngestOptions
        from tui.app import DiagApp
        from tui.sources import PostMortem

        return int(DiagApp(PostMortem(str(out), None, AnalyzeOptions(), IngestOptions())).run() or 0)
    from diag.api import analyze_path
    from diag.report import render

    _, report = analyze_path(str(out))
    sys.stdout.write(render(report, args.format))
    return ExitCode.OK


def _register_export(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from diag.cli import add_ingest_options

    p = sub.add_parser("export", help="all ranks on the aligned clock with the ledger, for Perfetto (docs/export.md)")
    p.add_argument("path", help="trace directory, trace file, or a diag DuckDB file")
    p.add_argument("--perfetto", required=True, metavar="OUT.json[.gz]",
                   help="Chrome trace-event JSON to write (gzip when the name ends in .gz); open it in ui.perfetto.dev")
    p.add_argument("--ranks", default=None, help="ranks to export, e.g. 0-7,64 (default: all)")
    p.add_argument("--steps", default=None, help="steps to export, e.g. 10-12 (default: all)")
    add_model_options(p)
    add_ingest_options(p)
    p.set_defaults(handler=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    from diag.api import analyze_opened, open_store
    from diag.cli import ingest_options
    from diag.engine import AnalyzeOptions
    from diag.errors import printable
    from diag.ingest.pipeline import IngestOptions
    from diag.perfetto import Cut, export_perfetto, parse_ranges

    opts = analyze_options(args)
    iopts = ingest_options(args)
    assert isinstance(opts, AnalyzeOptions) and isinstance(iopts, IngestOptions)
    cut = Cut(parse_ranges(args.ranks, "--ranks") if args.ranks else None,
              parse_ranges(args.steps, "--steps") if args.steps else None)
    opened = open_store(args.path, args.db, iopts)
    for e in opened.errors:
        print(f"diag: warning: {e.one_line()}; exporting the other files", file=sys.stderr)
    try:
        a, report = analyze_opened(opened.con, opts, opened.model_file, len(opened.errors))
        out = Path(args.perfetto)
        n = export_perfetto(opened.con, a, report, out, cut)
    finally:
        opened.con.close()
    print(f"{printable(str(out))}\t{n} events\t{out.stat().st_size / 1e6:.1f} MB")
    return ExitCode.OK


def _register_gate(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from diag.gate import register_gate

    register_gate(sub)


def _register_capture(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from diag.capture import add_capture_arguments, run_capture_command

    p = sub.add_parser("capture", help="run a training command with the profiler settings diag needs")
    add_capture_arguments(p)
    p.set_defaults(handler=run_capture_command)


def _register_example(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from diag.example import add_example_arguments, run_example_command

    p = sub.add_parser("example", help="run the example GPT job (gloo on CPU, NCCL on GPUs), captured into --out")
    add_example_arguments(p)
    p.set_defaults(handler=run_example_command)


def _register_ui(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    # The UI registers its own commands; Textual is imported only when one of them runs.
    from tui.commands import register_live, register_tui

    register_tui(sub)
    register_live(sub)


REGISTER: tuple[Register, ...] = (
    _register_analyze, _register_export, _register_demo, _register_mfu, _register_gate, _register_capture, _register_example, _register_ui,
)
