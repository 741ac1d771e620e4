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
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text")
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
    _, report = analyze_path(args.path, args.db, opts, iopts)
    text = render(report, args.format)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return ExitCode.OK


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
    data loader, on 8 H100 SXM ranks, with the model.toml that describes it. The run is generated
    into a temporary directory removed at the end, unless --out keeps it."""
    import tempfile

    if args.out:
        return _demo(Path(args.out), args)
    with tempfile.TemporaryDirectory(prefix="diag-demo-") as tmp:
        return _demo(Path(tmp), args)


def _demo(out: Path, args: argparse.Namespace) -> int:
    from fixtures.generate import generate

    truth = generate("demo", out)
    where = str(out) if args.out else "a temporary directory (removed at the end; --out DIR keeps it)"
    print(f"diag demo: {truth.world_size} ranks × {truth.steps} steps written to {where}", file=sys.stderr)
    # Nobody can see a UI without a terminal on both ends (a pipe, a CI log, `</dev/null`): print instead.
    if not args.no_tui and has_terminal():
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


def has_terminal() -> bool:
    """Both stdin and stdout are a terminal: a Textual UI can be seen and driven."""
    return sys.stdin.isatty() and sys.stdout.isatty()


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
    _register_analyze, _register_demo, _register_mfu, _register_gate, _register_capture, _register_example, _register_ui,
)
