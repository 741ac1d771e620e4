"""What every view shares: the snapshot it shows, queries in worker threads, and jumps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar, cast

import duckdb
from rich.text import Text
from textual.message import Message
from textual.widget import Widget
from textual.worker import get_current_worker

from diag.outputs.evidence import Place
from diag.runtime.sanitize import terminal
from tui.snapshot import Snapshot
from tui.sources import Store

T = TypeVar("T")


class Host(Protocol):
    """The app as the views see it."""

    store: Store | None
    snapshot: Snapshot | None


class Jump(Message):
    """Show `place` in the view named `target` ('timeline', 'collectives', 'findings', 'ranks')."""

    def __init__(self, target: str, place: Place | None = None, finding: int | None = None) -> None:
        self.target = target
        self.place = place
        self.finding = finding
        super().__init__()


def query(widget: Widget, group: str, fn: Callable[[duckdb.DuckDBPyConnection], T],
          done: Callable[[T], None]) -> None:
    """Run `fn` on a reader cursor in a thread; hand its result to `done` on the UI thread.

    A newer query of the same group cancels the older one (the result of a cancelled query is
    dropped), so moving a cursor fast never queues stale work.
    """
    app = widget.app
    store = cast(Host, app).store
    if store is None:
        return

    def job() -> None:
        with store.reader() as cur:
            result = fn(cur)
        if not get_current_worker().is_cancelled and app.is_running:
            app.call_from_thread(done, result)

    widget.run_worker(job, thread=True, exclusive=True, group=group, name=group)


class View(Widget):
    """A screen of the app: shows a snapshot, can be asked to show a place."""

    def show(self, snap: Snapshot) -> None:
        raise NotImplementedError

    def goto(self, place: Place) -> None:
        """Show `place` (a jump from another view); the default is to just show the view."""

    def focus_main(self) -> None:
        """Focus the widget the keys of this view act on."""


def right(text: str, style: str = "") -> Text:
    return Text(text, style=style, justify="right")


def name_text(text: str | None, style: str = "") -> Text:
    """A name from a trace (kernel, op, group, file) for a cell or a line: a `Text`, never markup (a
    table reads a `str` cell as markup: `[/]` raised MarkupError, `[link=…]` made a link), with the
    characters a terminal would act on escaped (diag/runtime/sanitize.py)."""
    return Text(terminal(text or ""), style=style)

