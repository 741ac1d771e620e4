"""Progress bars for long work (ingest, the map over ranks) on stderr, when it is a terminal.

A `Progress` callback is `(done, total, what)`; work that takes one (ingest, engine.analyze) calls
it after each item. Off a terminal (a pipe, a CI log, a test) nothing is drawn: no escape codes
in anyone's log.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Progress = Callable[[int, int, str], None]


class Bars:
    """One rich progress display; each `task` is a bar on it (None off a terminal)."""

    def __init__(self, display: Any) -> None:
        self._display = display

    def task(self, label: str) -> Progress | None:
        display = self._display
        if display is None:
            return None
        task_id = None

        def update(done: int, total: int, what: str) -> None:
            nonlocal task_id
            if task_id is None:
                task_id = display.add_task(label, total=total, item="")
            display.update(task_id, completed=done, total=total, item=os.path.basename(what))
            if done == total:
                display.refresh()   # the finished bar is drawn, however quick the work was

        return update


@contextmanager
def terminal_progress() -> Iterator[Bars]:
    """Bars on stderr while the block runs, cleared at its end (transient): the report that follows
    starts on a clean screen."""
    if not sys.stderr.isatty():
        yield Bars(None)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    display = Progress(TextColumn("{task.description:<7}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), TextColumn("{task.fields[item]}"),
                       console=Console(stderr=True), transient=True)
    with display:
        yield Bars(display)
