"""`diag` command line. stdout is data, stderr is diagnostics; exit codes are `ExitCode`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from diag import __version__
from diag.errors import BadInput, ExitCode, printable

Handler = Callable[[argparse.Namespace], int]


def _add_ingest(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("ingest", help="ingest Kineto traces (and NCCL-side dumps) into a DuckDB file")
    p.add_argument("paths", nargs="+", help="trace files or directories (searched recursively)")
    p.add_argument("--db", required=True, help="DuckDB file to create or add to")
    add_ingest_options(p)
    p.set_defaults(handler=_run_ingest)


def add_ingest_options(p: argparse.ArgumentParser) -> None:
    from diag.ingest.source import DEFAULT_MAX_BYTES

    p.add_argument("--salvage", action="store_true",
                   help="keep the complete events before damage in a truncated/corrupt file (marked partial)")
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES,
                   help=f"refuse files that decompress beyond this many bytes (default {DEFAULT_MAX_BYTES})")
    p.add_argument("--rank", type=int, default=None,
                   help="rank of a single file whose trace and name carry none")
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel parse workers (default: one per core; with --executor ray, the cluster's CPUs)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where parse workers run: local processes, or Ray tasks on the cluster RAY_ADDRESS names "
                        "(else a local Ray); with ray, analyze maps each rank's timeline on Ray too")
    p.add_argument("--spill-dir", default=None,
                   help="where workers write Parquet for the store to load (default: the temporary directory); "
                        "with Ray on several machines, storage every node mounts at the same path")


def ingest_options(args: argparse.Namespace) -> object:
    from diag.ingest.pipeline import IngestOptions

    return IngestOptions(salvage=args.salvage, max_bytes=args.max_bytes, rank=args.rank, jobs=args.jobs,
                         executor=args.executor, spill_dir=args.spill_dir)


def _run_ingest(args: argparse.Namespace) -> int:
    from diag import store
    from diag.ingest.discover import require_paths
    from diag.ingest.pipeline import IngestOptions, ingest, print_progress_factory

    opts = ingest_options(args)
    assert isinstance(opts, IngestOptions)
    require_paths(args.paths)   # before the store: a missing trace creates no --db file
    con = store.connect(args.db)
    result = ingest(args.paths, con, opts, progress=print_progress_factory())
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for s in result.skipped:
        print(f"skipped: {printable(s.path)}: {s.reason}", file=sys.stderr)
    for path, file_id in result.ingested:
        n = con.execute("SELECT rank, n_events, kind FROM trace_files WHERE file_id = ?", [file_id]).fetchone()
        assert n is not None
        print(f"{printable(path)}\trank={n[0]}\tevents={n[1]}\tkind={n[2]}")
    # Each file is its own unit: a bad one is a warning while others made it in (now or before).
    usable = result.ingested or any(s.duplicate for s in result.skipped)
    for e in result.errors:
        print(f"diag: {'warning: ' if usable else ''}{e.one_line()}", file=sys.stderr)
    con.close()
    return ExitCode.BAD_INPUT if result.errors and not usable else ExitCode.OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diag", description="Where did the MFU go? Attribution of every step's time, by cause."
    )
    parser.add_argument("--version", action="version", version=f"diag {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_ingest(sub)
    for register in _optional_commands():
        register(sub)
    return parser


def _optional_commands() -> list[Callable[[argparse._SubParsersAction], None]]:  # type: ignore[type-arg]
    from diag import commands

    return list(commands.REGISTER)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except BadInput as e:
        print(e.message(), file=sys.stderr)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the contract: an internal error is exit 3 with one line, not a traceback
        if _debug():
            raise
        print(f"diag: internal error: {type(e).__name__}: {e} (set DIAG_DEBUG=1 for the traceback)", file=sys.stderr)
        return ExitCode.INTERNAL


def _debug() -> bool:
    import os

    return os.environ.get("DIAG_DEBUG", "") not in ("", "0")


if __name__ == "__main__":
    sys.exit(main())
