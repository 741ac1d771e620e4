"""`diag` command line: the one place that builds the parser, registers every command and holds
the options commands share. stdout is data, stderr is diagnostics; exit codes are `ExitCode`.

Imports flow one way: this module imports the commands (diag/commands.py, diag/tui_commands.py and the
modules whose switches a second program parses too: mfu, capture, example); nothing imports it.
It imports each only when its command is the one run (`build_parser`): `diag --help` loads none.
Every option value is checked while parsing (diag/runtime/option_types.py): a bad one is one line naming
the option and the value, exit 2, before any work starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from diag import __version__
from diag.runtime.arrow_memory import use_system_allocator
from diag.runtime.batch import collect_seldom, exit_now
from diag.runtime.blas_threads import one_blas_thread
from diag.runtime.errors import BadInput, ExitCode, Stopped, in_words
from diag.runtime.no_pandas import keep_pandas_out
from diag.runtime.option_types import (
    NEGATIVE_NUMBER,
    jobs,
    non_negative_int,
    peak_tflops,
    positive_float,
    positive_int,
)
from diag.runtime.sanitize import printable

FORMATS = ("text", "json", "markdown")


class DiagParser(argparse.ArgumentParser):
    """argparse, with the CLI contract's errors: one line on stderr, exit 2."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        # "argument --jobs: must be …" → "diag analyze: --jobs: must be …"
        self.exit(ExitCode.BAD_INPUT, f"{self.prog}: {message.removeprefix('argument ')}\n")


# ------------------------------------------------------------------------------ shared options

def add_ingest_options(p: argparse.ArgumentParser) -> None:
    """What every command that reads traces takes: how to read them."""
    from diag.ingest.source import DEFAULT_MAX_BYTES

    p.add_argument("--salvage", action="store_true",
                   help="keep the complete events before damage in a truncated/corrupt file (marked partial)")
    p.add_argument("--max-bytes", type=positive_int, default=DEFAULT_MAX_BYTES,
                   help=f"refuse files that decompress beyond this many bytes (default {DEFAULT_MAX_BYTES})")
    p.add_argument("--rank", type=non_negative_int, default=None,
                   help="rank of a single file whose trace and name carry none")
    p.add_argument("--jobs", type=jobs, default=None,
                   help="parallel workers, ≥ 1, for the parse and, with many small files, the analysis map "
                        "(default: one per core; with --executor ray, the cluster's CPUs)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where parse workers run: local processes, or Ray tasks on the cluster RAY_ADDRESS names "
                        "(else a local Ray); with ray, analyze maps each rank's timeline on Ray too")
    p.add_argument("--spill-dir", default=None,
                   help="where workers write Parquet for the store to load (default: the temporary directory); "
                        "with Ray on several machines, storage every node mounts at the same path")


def add_model_options(p: argparse.ArgumentParser) -> None:
    """What every command that analyzes takes: the store, the model and the peak (DESIGN.md contract)."""
    p.add_argument("--db", default=None, help="DuckDB file to ingest into and keep (default: in memory)")
    p.add_argument("--model", default=None,
                   help="llama3-8b | llama3-70b | llama3-405b | FILE.toml (default: model.toml beside the traces, "
                        "else FLOPs inferred from the trace); a preset needs --tokens-per-step")
    p.add_argument("--gpu", default=None,
                   help="hardware part as you would say it: h100, H100-SXM, h100-pcie, h200, a100, b200, or the "
                        "trace's own device name ('NVIDIA H100 80GB HBM3')")
    p.add_argument("--peak-tflops", type=peak_tflops, default=None,
                   help="override the dense peak, > 0 (still checked against 'with sparsity' figures)")
    p.add_argument("--tokens-per-step", type=positive_float, default=None,
                   help="global tokens per optimizer step, > 0 (what a --model preset needs for MFU)")
    p.add_argument("--all-steps", action="store_true",
                   help="keep warm-up and teardown steps in the means (left out and listed by default)")


def _add_report_options(p: argparse.ArgumentParser, html: bool = False) -> None:
    p.add_argument("--format", choices=FORMATS + ("html",) if html else FORMATS, default="text",
                   help="text for a terminal, json for programs and diag gate, markdown for a PR comment" + ("; html: one self-contained page with charts (no network)" if html else "")
                        + " (default text)")


def _add_ui_options(p: argparse.ArgumentParser) -> None:
    from diag import tui_commands as ui

    add_model_options(p)
    add_ingest_options(p)
    p.add_argument("--theme", choices=tuple(ui.THEMES), default="dark", help="colours (T toggles them in the app)")


# ------------------------------------------------------------------------------------ commands

# Each takes the command's parser (made by build_parser, with the command's one-line help) and adds
# its arguments and handler, importing the modules only that command needs.

def _ingest(p: argparse.ArgumentParser) -> None:
    from diag import commands

    p.add_argument("paths", nargs="+", help="trace files or directories (searched recursively)")
    p.add_argument("--db", required=True, help="DuckDB file to create or add to")
    add_ingest_options(p)
    p.set_defaults(handler=commands.run_ingest)


def _analyze(p: argparse.ArgumentParser) -> None:
    from diag import commands

    p.add_argument("path", help="trace directory, trace file, or a diag DuckDB file")
    add_model_options(p)
    add_ingest_options(p)
    _add_report_options(p, html=True)
    p.add_argument("--out", default=None, help="write the report here instead of stdout")
    p.set_defaults(handler=commands.run_analyze)


def _export(p: argparse.ArgumentParser) -> None:
    from diag import commands

    p.add_argument("path", help="trace directory, trace file, or a diag DuckDB file")
    p.add_argument("--perfetto", required=True, metavar="OUT.json[.gz]",
                   help="Chrome trace-event JSON to write (gzip when the name ends in .gz); open it in ui.perfetto.dev")
    p.add_argument("--ranks", default=None, help="ranks to export, e.g. 0-7,64 (default: all)")
    p.add_argument("--steps", default=None, help="steps to export, e.g. 10-12 (default: all)")
    add_model_options(p)
    add_ingest_options(p)
    p.set_defaults(handler=commands.run_export)


def _demo(p: argparse.ArgumentParser) -> None:
    from diag import commands

    p.add_argument("--out", default=None, help="keep the generated traces here (default: a temporary directory, "
                                               "removed at the end)")
    p.add_argument("--no-tui", action="store_true",
                   help="print the report instead of opening the UI (the default without a terminal)")
    _add_report_options(p)
    p.set_defaults(handler=commands.run_demo)


def _tui(p: argparse.ArgumentParser) -> None:
    from diag import tui_commands as ui

    p.add_argument("path", help="trace directory, trace file, or a diag DuckDB file")
    _add_ui_options(p)
    p.set_defaults(handler=ui.run_tui)


def _live(p: argparse.ArgumentParser) -> None:
    from diag import tui_commands as ui

    p.add_argument("dir", help="the directory torch.profiler's trace handler writes into")
    _add_ui_options(p)
    p.add_argument("--poll", type=positive_float, default=0.4,
                   help="seconds between looks at the directory, > 0 (default 0.4)")
    p.add_argument("--idle", type=positive_float, default=60.0,
                   help="seconds without a new file after which the run counts as ended, > 0 (default 60)")
    p.set_defaults(handler=ui.run_live)


def _gate(p: argparse.ArgumentParser) -> None:
    from diag import commands

    p.add_argument("current", help="the new run: a diag.report/1 JSON (diag analyze --format json), a trace "
                                   "directory, or a diag DuckDB file")
    p.add_argument("--baseline", required=True, help="the reference run, in any of the same forms")
    p.add_argument("--budget", default=None, help="budget TOML (default: 1 MFU point, 1 point per bucket, "
                                                                 "new findings at medium fail; see docs/gate.md)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare runs of a different world size, model or device instead of refusing (exit 2)")
    _add_report_options(p, html=True)
    p.add_argument("--junit", default=None, metavar="FILE",
                   help="also write a JUnit XML report: one test case per check")
    add_model_options(p)
    add_ingest_options(p)
    p.set_defaults(handler=commands.run_gate)


def _mfu(p: argparse.ArgumentParser) -> None:
    from diag.knowledge.mfu import add_mfu_arguments, run_mfu

    add_mfu_arguments(p)
    p.set_defaults(handler=run_mfu)


def _capture(p: argparse.ArgumentParser) -> None:
    from diag.capture.profiler import add_capture_arguments, run_capture_command

    add_capture_arguments(p)
    p.set_defaults(handler=run_capture_command)


def _example(p: argparse.ArgumentParser) -> None:
    from diag.capture.example import add_example_arguments, run_example_command

    add_example_arguments(p)
    p.set_defaults(handler=run_example_command)


# name → (one line for `diag --help`, what adds the command's arguments), in the order --help lists them.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "ingest": ("ingest Kineto traces (and NCCL-side dumps) into a DuckDB file", _ingest),
    "analyze": ("ingest what is new, attribute every step, print the report", _analyze),
    "export": ("all ranks on the aligned clock with the ledger, for Perfetto (docs/export.md)", _export),
    "tui": ("explore an analysis: overview, findings, rank heatmap, timeline, collectives", _tui),
    "live": ("follow the directory a running job's profiler writes into", _live),
    "gate": ("exit 1 when CURRENT's attribution regresses against a baseline past a budget", _gate),
    "mfu": ("MFU from tokens/s (or tokens/s from MFU) for a model and GPU count", _mfu),
    "demo": ("generate a small 8-rank H100 run with known causes, analyze it, open the UI", _demo),
    "capture": ("run a training command with the profiler settings diag needs", _capture),
    "example": ("run the example GPT job (gloo on CPU, NCCL on GPUs), captured into --out", _example),
}


# name → what `diag NAME --help` says above the options: what it does, what it reads and writes, and
# examples. Written wrapped (RawDescriptionHelpFormatter keeps the examples' lines as they are).
DESCRIPTIONS: dict[str, str] = {
    "ingest": """\
Read traces into a DuckDB file, once: Kineto traces (.json, .json.gz, any layout torch's
tensorboard_trace_handler writes) and NCCL-side dumps (Flight Recorder, NCCL Inspector, the NCCL
profiler plugin), told apart by content. Atomic and idempotent per file; prints one line per
file stored (path, rank, events, kind). analyze, tui and gate then read the DuckDB file.

examples:
  diag ingest traces/ --db run.duckdb
  diag ingest rank0.json.gz rank1.json.gz --db run.duckdb --salvage""",
    "analyze": """\
Ingest what is new under PATH (or read a diag DuckDB file), split every step of every rank into
the twelve buckets of the ledger, run the rules and print the report: MFU, the waterfall from the
dense peak down to it, and the findings ordered by what a fix can win, each with its advice.

examples:
  diag analyze traces/
  diag analyze traces/ --model llama3-8b --tokens-per-step 65536 --gpu h100
  diag analyze traces/ --format json --out report.json
  diag analyze traces/ --format html --out report.html""",
    "export": """\
Write every rank's trace on one aligned clock as Chrome trace-event JSON, with the ledger, the
steps and the findings as tracks and arrows from waiting ranks to the late one. Open it at
ui.perfetto.dev (Open trace file). docs/export.md describes the tracks.

examples:
  diag export traces/ --perfetto run.json.gz
  diag export traces/ --perfetto cut.json --ranks 0-7 --steps 10-12""",
    "tui": """\
Explore an analysis in the terminal: overview, findings, rank x step heatmap, timeline and
collectives. ? lists the keys; q quits.

examples:
  diag tui traces/
  diag tui run.duckdb""",
    "live": """\
Follow the directory a running job's torch.profiler writes into: each new trace file is ingested
once it is complete and the views update. The run counts as ended after --idle seconds without a
new file.

examples:
  diag live /checkpoints/job42/traces""",
    "gate": """\
Compare CURRENT with --baseline BASE and fail (exit 1) when MFU, a ledger bucket or a rule's
findings got worse beyond the budget and beyond the baseline's step-to-step noise. Exit 2: bad
input. See docs/gate.md.

examples:
  diag analyze main_traces/ --format json --out base.json
  diag gate --baseline base.json pr_traces/ --junit gate.xml""",
    "mfu": """\
MFU from throughput, or throughput from MFU, for a model on a number of GPUs, with the model FLOPs
per token 6N (+ 12*L*H*Q*T with the attention sizes) against the part's dense peak. Give the model
(--params or --model), the hardware (--gpus and --gpu or --peak-tflops) and exactly one known
quantity.

examples:
  diag mfu --params 70e9 --gpus 1024 --gpu h100-sxm --tokens-per-s 12000
  diag mfu --model llama3-8b --gpus 64 --gpu h100 --mfu 0.40 --format json""",
    "demo": """\
Generate a small run of 8 H100 ranks with known causes (exposed all-reduce, a straggler on rank 5,
a slow data loader), analyze it and open the UI; without a terminal, or with --no-tui, print the
report instead.

examples:
  diag demo
  diag demo --no-tui --format markdown""",
    "capture": """\
Run a training command with the profiler settings the rules need (shapes, stacks, a schedule that
writes one file per rank per cycle) and the model description beside the traces. Needs torch:
pip install -e '.[capture]'. docs/capture.md.

examples:
  diag capture --out traces/ -- python train.py
  diag capture --out traces/ --active 5 -- torchrun --nproc-per-node 8 train.py""",
    "example": """\
Run the example GPT (gloo on CPU, NCCL on GPUs) as --nproc processes, captured into --out, with
switches that inject each cause for real (a slow rank, a slow data loader, recomputation, no
overlap, pipeline stages). Needs torch: pip install -e '.[capture]'.

examples:
  diag example --out traces/ --nproc 2
  diag example --out traces/ --nproc 2 --slow-rank 1 --slow-ms 20""",
}


def build_parser(argv: Sequence[str] | None = None) -> DiagParser:
    """The parser for `argv` (None: every command's, complete). Only the command `argv` names gets
    its arguments, and so its modules: `diag --help` lists the commands without importing any
    (issue 16: ≤ 0.15 s; mfu, capture and the commands' read-ahead were ~0.1 s of imports). The
    command is argv's first word not starting with "-": the top level's only options, --help and
    --version, take no value."""
    parser = DiagParser(prog="diag", description="Where did the MFU go? Attribution of every step's time, by cause.")
    parser.add_argument("--version", action="version", version=f"diag {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (line, add_arguments) in COMMANDS.items():
        p = sub.add_parser(name, help=line, description=DESCRIPTIONS[name],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if named is None or name == named:
            add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `diag` command; `argv` None means this process is the command (the console script,
    `python -m diag.cli`), which then runs without pandas (diag/runtime/no_pandas.py: 0.16–0.3 s of each
    run's CPU), unless on Ray, which has uses of its own for it, with Arrow's memory from the
    system allocator (diag/runtime/arrow_memory.py), NumPy's OpenBLAS on one thread unless it runs the
    user's programs (diag/runtime/blas_threads.py), and, for the batch commands, collects garbage
    seldom and ends as soon as its output is out (diag/runtime/batch.py). Called with a list, as from a
    program or a test, it leaves that program's imports, allocator, collector and exit alone."""
    args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    if argv is None:
        use_system_allocator()
    if argv is None and args.command not in _RUNS_PROGRAMS:
        one_blas_thread()
    if argv is None and getattr(args, "executor", "local") != "ray":
        keep_pandas_out()
    if argv is None and args.command in _BATCH:
        collect_seldom()
    if argv is None and args.command in ("analyze", "ingest"):
        _read_ahead(args)
    code = _run(args)
    try:
        sys.stdout.flush()   # what print left in the buffer: its reader may have gone too
    except BrokenPipeError:
        code = _closed_pipe()
    if argv is None and args.command in _BATCH:
        exit_now(code)
    return code


def _read_ahead(args: argparse.Namespace) -> None:
    """`analyze FILE` or `ingest FILE`: the file's read begins now, in a process of its own, while
    this one imports what the command needs (diag/ingest/read_ahead.py). Not with --jobs 1 (one
    process) or on Ray (the parse runs there)."""
    from diag.ingest.early import start_reading

    paths = args.paths if hasattr(args, "paths") else [args.path]
    if len(paths) == 1 and args.jobs != 1 and args.executor == "local":
        start_reading(paths[0], args.max_bytes, args.salvage)


def _run(args: argparse.Namespace) -> int:
    try:
        _resolve_gpu(args)
        return int(args.handler(args))
    except BadInput as e:
        print(e.message(), file=sys.stderr)
        return ExitCode.BAD_INPUT
    except Stopped as e:   # a signal during an ingest: what the store holds and what it does not
        print(e.message(), file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _closed_pipe()
    except Exception as e:  # the contract: an internal error is exit 3 with one line, not a traceback
        from diag.runtime.lifetime import stopped_by

        if stopped_by() is not None:   # a query DuckDB interrupted for a signal: the signal's exit
            return 128 + stopped_by()   # type: ignore[operator]
        if os.environ.get("DIAG_DEBUG", "") not in ("", "0"):
            # The traceback, but still exit 3: an uncaught exception would exit 1, the gate's "failed".
            import traceback

            traceback.print_exc()
            return ExitCode.INTERNAL
        # No class name: the line is for the user; DIAG_DEBUG=1 gives the traceback for the report.
        print(f"diag: internal error (a bug in diag): {printable(in_words(e))} (set DIAG_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return ExitCode.INTERNAL


def _closed_pipe() -> int:
    """stdout's reader is gone: point stdout at /dev/null, so that no later flush (the interpreter's
    at exit) raises again or prints "Exception ignored", and exit as SIGPIPE would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return ExitCode.BROKEN_PIPE


def _resolve_gpu(args: argparse.Namespace) -> None:
    """--gpu as typed (`h100`, `H100-SXM`, `NVIDIA H100 80GB HBM3`) → the part's key, before any work;
    an ambiguous name's choice is said on stderr."""
    if getattr(args, "gpu", None) is None:
        return
    from diag.knowledge import hardware

    try:
        found = hardware.resolve_part(args.gpu)
    except ValueError as e:
        raise BadInput("--gpu", str(e)) from None
    if found.note:
        print(f"diag: note: {found.note}", file=sys.stderr)
    args.gpu = found.part.key


# Commands whose work is all done when their handler returns (batch.exit_now). Not the UIs
# (Textual restores the terminal on its own way out) nor capture and example, which run the user's
# code and its exit hooks (the profiler flushes its trace).
_BATCH = frozenset({"ingest", "analyze", "export", "gate"})
# The commands that run the user's programs (their children's environment is the user's).
_RUNS_PROGRAMS = frozenset({"capture", "example"})


if __name__ == "__main__":
    sys.exit(main())
