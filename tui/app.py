"""The diag TUI: five views over one snapshot, from a post-mortem analysis or a followed directory.

Workers do the I/O and SQL and post immutable snapshots; widgets only react (STYLE.md 9).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import ContentSwitcher, Footer, ProgressBar, Static
from textual.worker import get_current_worker

from diag.runtime.errors import BadInput, ExitCode
from diag.runtime.sanitize import terminal
from tui.snapshot import Snapshot
from tui.sources import Live, Loader, Store
from tui.views.base import Jump, View
from tui.views.collectives import Collectives
from tui.views.findings import Findings
from tui.views.help import Help
from tui.views.overview import Overview
from tui.views.ranks import Ranks
from tui.views.status import live_detail, live_text
from tui.views.timeline import Timeline

VIEWS: tuple[tuple[str, str, type[View]], ...] = (
    ("overview", "Overview", Overview),
    ("findings", "Findings", Findings),
    ("ranks", "Ranks", Ranks),
    ("timeline", "Timeline", Timeline),
    ("collectives", "Collectives", Collectives),
)
DARK, LIGHT = "textual-dark", "textual-light"


def nav_text(current: str) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(" diag ", style="bold reverse")
    for i, (name, label, _) in enumerate(VIEWS, 1):
        here = "reverse" if name == current else ""
        t.append(" ")
        t.append(f" {i}", style=f"bold {here}")
        t.append(f" {label} ", style=here)
    return t


class DiagApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "diag"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    BINDINGS = [
        *(Binding(str(i), f"view('{name}')", label, show=False) for i, (name, label, _) in enumerate(VIEWS, 1)),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("escape", "go_back", "Back", show=False),
        Binding("T", "toggle_theme", "Theme", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, source: Loader | Live, poll_s: float = 0.4, theme: str = DARK) -> None:
        super().__init__()
        self.source = source
        self.poll_s = poll_s
        self.store: Store | None = source.store if isinstance(source, Live) else None
        self.snapshot: Snapshot | None = None
        self.current = "loading"
        self.history: list[str] = []
        self.exit_code = ExitCode.OK
        self.theme = theme

    def compose(self) -> ComposeResult:
        with Horizontal(id="top"):
            yield Static(nav_text("loading"), id="nav")
            yield Static(id="status")
        with ContentSwitcher(id="views", initial="loading"):
            with Vertical(id="loading"):
                yield Static(id="ld-text")
                yield ProgressBar(id="ld-bar", show_eta=False)
            for name, _, cls in VIEWS:
                yield cls(id=name)
        yield Footer()

    def on_mount(self) -> None:
        if isinstance(self.source, Live):
            self._progress(f"following {self.source.directory}: waiting for the first complete trace", None)
            self.run_worker(self._follow, thread=True, name="follow", group="source")
        else:
            self.run_worker(self._load, thread=True, name="load", group="source")

    # --- sources (worker threads) ---------------------------------------------------------------

    def _load(self) -> None:
        assert not isinstance(self.source, Live)
        source = self.source

        def progress(text: str, frac: float | None) -> None:
            self.call_from_thread(self._progress, text, frac)

        try:
            snap = source.load(progress)
        except BadInput as e:
            self.call_from_thread(self._failed, f"diag: {e.one_line()}", ExitCode.BAD_INPUT)
            return
        except Exception as e:  # the CLI contract: an internal error is one line and exit 3
            self.call_from_thread(self._failed, f"diag: internal error: {type(e).__name__}: {e}", ExitCode.INTERNAL)
            return
        self.store = source.store
        self.call_from_thread(self._apply, snap)

    def _follow(self) -> None:
        assert isinstance(self.source, Live)
        worker = get_current_worker()
        while not worker.is_cancelled:
            started = time.monotonic()
            try:
                snap = self.source.poll()
            except Exception as e:  # keep following: the next file may make the set analyzable
                self.call_from_thread(self.notify, f"{type(e).__name__}: {e}", title="analysis failed",
                                      severity="warning")
                snap = None
            if snap is not None and not worker.is_cancelled:
                self.call_from_thread(self._apply, snap)
            while not worker.is_cancelled and time.monotonic() - started < self.poll_s:
                time.sleep(0.02)

    # --- reacting (UI thread) -------------------------------------------------------------------

    def _progress(self, text: str, frac: float | None) -> None:
        self.query_one("#ld-text", Static).update(Text(terminal(text)))   # names in it: never markup
        bar = self.query_one("#ld-bar", ProgressBar)
        bar.update(total=None if frac is None else 100, progress=0 if frac is None else frac * 100)

    def _failed(self, line: str, code: ExitCode) -> None:
        self.exit_code = code
        self.query_one("#ld-text", Static).update(Text(terminal(line) + "\n\npress q to quit", style="bold red"))
        self.query_one("#ld-bar", ProgressBar).display = False

    def _apply(self, snap: Snapshot) -> None:
        before = self.snapshot
        self.snapshot = snap
        status = self.query_one("#status", Static)
        if snap.live is not None:
            status.update(live_text(snap.live))
            if snap.report is None:
                self._progress(live_detail(snap.live).plain, None)
            self.query_one(Overview).show_live(snap.live)
        else:
            status.update(Text(terminal(Path(snap.source).name), style="dim", justify="right", no_wrap=True,
                               overflow="ellipsis"))
        if snap.report is None:
            return
        if before is None or before.generation != snap.generation:
            for name, _, _ in VIEWS:
                self.query_one(f"#{name}", View).show(snap)
        if self.current == "loading":
            self.action_view("overview", remember=False)

    # --- navigation -----------------------------------------------------------------------------

    def action_view(self, name: str, remember: bool = True) -> None:
        if self.snapshot is None or self.snapshot.report is None or name == self.current:
            return
        if remember and self.current != "loading":
            self.history.append(self.current)
            del self.history[:-20]
        self.current = name
        self.query_one("#views", ContentSwitcher).current = name
        self.query_one("#nav", Static).update(nav_text(name))
        self.query_one(f"#{name}", View).focus_main()

    def action_go_back(self) -> None:
        if self.history:
            self.action_view(self.history.pop(), remember=False)

    def action_help(self) -> None:
        self.push_screen(Help())

    def action_toggle_theme(self) -> None:
        self.theme = LIGHT if self.theme == DARK else DARK

    def action_quit(self) -> None:  # type: ignore[override]
        self.exit(int(self.exit_code))

    @on(Jump)
    def _jump(self, event: Jump) -> None:
        event.stop()
        view = self.query_one(f"#{event.target}", View)
        self.action_view(event.target)
        if event.finding is not None and isinstance(view, Findings):
            view.select(event.finding)
        if event.place is not None:
            view.goto(event.place)

    def on_click(self, event: events.Click) -> None:
        """A click on a view's name in the top bar switches to it."""
        if event.widget is None or event.widget.id != "nav":
            return
        x = event.x
        pos = len(" diag ")
        for i, (name, label, _) in enumerate(VIEWS, 1):
            width = 1 + len(f" {i} {label} ")
            if pos <= x < pos + width:
                self.action_view(name)
                return
            pos += width
