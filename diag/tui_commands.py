"""What `diag tui PATH|DB` and `diag live DIR` do (diag/cli.py parses their arguments). Textual is
imported only when one of them runs, so the CLI (and everything under diag/ and rules/) works
without a terminal UI."""

from __future__ import annotations

import argparse
from pathlib import Path

from diag.commands import analyze_options, check_paths, has_terminal, ingest_options
from diag.runtime.errors import BadInput

THEMES = {"dark": "textual-dark", "light": "textual-light"}


def _need_terminal(command: str) -> None:
    if not has_terminal():
        raise BadInput(f"diag {command}", "needs a terminal on stdin and stdout for its UI; "
                                          "`diag analyze PATH` prints the report instead")


def run_tui(args: argparse.Namespace) -> int:
    from tui.app import DiagApp
    from tui.sources import PostMortem

    check_paths(args, [args.path], [])
    _need_terminal("tui")
    source = PostMortem(args.path, args.db, analyze_options(args), ingest_options(args))
    return int(DiagApp(source, theme=THEMES[args.theme]).run() or 0)


def run_live(args: argparse.Namespace) -> int:
    from tui.app import DiagApp
    from tui.sources import Live

    if not Path(args.dir).is_dir():
        what = "not a directory" if Path(args.dir).exists() else "no such directory"
        raise BadInput(args.dir, f"{what}: diag live follows the directory the profiler writes into "
                                 "(create it, or start diag live once the job has)")
    check_paths(args, [], [])
    _need_terminal("live")
    source = Live(args.dir, args.db, analyze_options(args), ingest_options(args), idle_s=args.idle)
    return int(DiagApp(source, poll_s=args.poll, theme=THEMES[args.theme]).run() or 0)
