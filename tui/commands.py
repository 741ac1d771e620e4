"""`diag tui PATH|DB` and `diag live DIR`. Textual is imported only when one of them runs, so the
CLI (and everything under diag/ and rules/) works without a terminal UI."""

from __future__ import annotations

import argparse
from pathlib import Path

from diag.errors import BadInput

THEMES = {"dark": "textual-dark", "light": "textual-light"}


def _common(p: argparse.ArgumentParser) -> None:
    from diag.cli import add_ingest_options
    from diag.commands import add_model_options

    add_model_options(p)
    add_ingest_options(p)
    p.add_argument("--theme", choices=tuple(THEMES), default="dark", help="colours (T toggles them in the app)")


def register_tui(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("tui", help="explore an analysis: overview, findings, rank heatmap, timeline, collectives")
    p.add_argument("path", help="trace directory, trace file, or a diag DuckDB file")
    _common(p)
    p.set_defaults(handler=_run_tui)


def register_live(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("live", help="follow the directory a running job's profiler writes into")
    p.add_argument("dir", help="the directory torch.profiler's trace handler writes into")
    _common(p)
    p.add_argument("--poll", type=float, default=0.4, help="seconds between looks at the directory (default 0.4)")
    p.add_argument("--idle", type=float, default=60.0,
                   help="seconds without a new file after which the run counts as ended (default 60)")
    p.set_defaults(handler=_run_live)


def _need_terminal(command: str) -> None:
    from diag.commands import has_terminal

    if not has_terminal():
        raise BadInput(f"diag {command}", "needs a terminal on stdin and stdout for its UI; "
                                          "`diag analyze PATH` prints the report instead")


def _options(args: argparse.Namespace) -> tuple[object, object]:
    from diag.cli import ingest_options
    from diag.commands import analyze_options

    return analyze_options(args), ingest_options(args)


def _run_tui(args: argparse.Namespace) -> int:
    from diag.engine import AnalyzeOptions
    from diag.ingest.pipeline import IngestOptions
    from tui.app import DiagApp
    from tui.sources import PostMortem

    if not Path(args.path).exists():
        raise BadInput(args.path, "no such file or directory")
    _need_terminal("tui")
    opts, iopts = _options(args)
    assert isinstance(opts, AnalyzeOptions) and isinstance(iopts, IngestOptions)
    app = DiagApp(PostMortem(args.path, args.db, opts, iopts), theme=THEMES[args.theme])
    return int(app.run() or 0)


def _run_live(args: argparse.Namespace) -> int:
    from diag.engine import AnalyzeOptions
    from diag.ingest.pipeline import IngestOptions
    from tui.app import DiagApp
    from tui.sources import Live

    if not Path(args.dir).is_dir():
        what = "not a directory" if Path(args.dir).exists() else "no such directory"
        raise BadInput(args.dir, f"{what}: diag live follows the directory the profiler writes into "
                                 "(create it, or start diag live once the job has)")
    _need_terminal("live")
    opts, iopts = _options(args)
    assert isinstance(opts, AnalyzeOptions) and isinstance(iopts, IngestOptions)
    app = DiagApp(Live(args.dir, args.db, opts, iopts, idle_s=args.idle), poll_s=args.poll,
                  theme=THEMES[args.theme])
    return int(app.run() or 0)
