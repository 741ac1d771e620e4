"""Findings, ranked by what a fix can win; the selected one's detail, and its evidence, each a jump away."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from diag.attribution.what_if import what_if_words
from diag.outputs import evidence
from diag.outputs.evidence import Place
from diag.runtime.durations import percent
from diag.runtime.sanitize import terminal
from tui.queries import fmt_ranks, fmt_seconds
from tui.snapshot import Snapshot
from tui.views.base import Jump, View, name_text, query, right
from tui.views.overview import SEVERITY_STYLE

MAX_EVIDENCE = 50


def detail(f: Mapping[str, Any], mfu: float | None) -> Text:
    t = Text()
    t.append(f"{f['code']} {f['slug']}", style="bold")
    t.append(f"  {f['severity']}", style=SEVERITY_STYLE.get(f["severity"], ""))
    t.append(f"  costs {f['mfu_points']:.1f} MFU points, {fmt_seconds(f['lost_s'])} a step")
    if f.get("bucket"):
        t.append(f" ({f['bucket']}; a fix can win {f['recoverable_fraction'] * 100:.1f})")
    t.append("\n")
    t.append(f"{terminal(f['summary'])}\n")
    t.append("do: ", style="bold green")
    t.append(f"{terminal(f['advice'])}\n")
    if f["what_if_mfu"] is not None and f["lost_fraction"]:
        t.append("what if: ", style="bold")
        t.append(f"{what_if_words(f['code'])} MFU would be {percent(f['what_if_mfu'], '?')} (now {percent(mfu, '?')})\n")
    t.append(f"ranks {fmt_ranks(f['ranks'])} · steps {fmt_ranks(f['steps'])}", style="dim")
    return t


def target_of(place: Place) -> str | None:
    """Where evidence is best seen: a collective in its table, a kernel or a step in the timeline."""
    if place.instance is not None:
        return "collectives"
    if place.rank is not None and place.step is not None:
        return "timeline"
    return None


class Findings(View):
    BINDINGS = [Binding("g", "go", "Go to evidence")]

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.snap: Snapshot | None = None
        self.places: tuple[Place, ...] = ()

    def compose(self) -> ComposeResult:
        yield DataTable(id="fd-list", cursor_type="row")
        yield Static(id="fd-detail")
        yield Static("[b]Evidence[/b] [dim]enter or g: show it in the timeline or the collectives[/dim]",
                     classes="section")
        yield DataTable(id="fd-evidence", cursor_type="row")

    def on_mount(self) -> None:
        t = self.query_one("#fd-list", DataTable)
        # Ordered by what a fix can win (the report's order): that column comes first, then what it costs.
        for label, key in (("#", "n"), ("finding", "finding"), ("sev", "sev"), ("can win", "win"), ("lost", "pts"),
                           ("per step", "lost"), ("→ MFU", "whatif")):
            t.add_column(label, key=key)
        self.query_one("#fd-evidence", DataTable).add_column("where", key="where")

    def focus_main(self) -> None:
        self.query_one("#fd-list", DataTable).focus()

    def show(self, snap: Snapshot) -> None:
        self.snap = snap
        t = self.query_one("#fd-list", DataTable)
        row = t.cursor_row
        t.clear()
        findings = snap.report["findings"] if snap.report else []
        for i, f in enumerate(findings):
            t.add_row(right(str(i + 1)), f"{f['code']} {f['slug']}",
                      Text(f["severity"], style=SEVERITY_STYLE.get(f["severity"], "")),
                      right(f"{f['recoverable_fraction'] * 100:.1f}"), right(f"{f['mfu_points']:.1f}"),
                      right(fmt_seconds(f["lost_s"])), right(percent(f["what_if_mfu"], "?")),
                      key=str(i))
        if findings:
            t.move_cursor(row=min(row, len(findings) - 1))
            self._select(t.cursor_row)
        else:
            self.query_one("#fd-detail", Static).update(Text("no findings above their thresholds", style="dim"))

    def select(self, index: int) -> None:
        t = self.query_one("#fd-list", DataTable)
        if 0 <= index < t.row_count:
            t.move_cursor(row=index)
            self._select(index)

    @on(DataTable.RowHighlighted, "#fd-list")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._select(event.cursor_row)

    @on(DataTable.RowSelected, "#fd-list")
    def _chosen(self, event: DataTable.RowSelected) -> None:
        self.query_one("#fd-evidence", DataTable).focus()

    @on(DataTable.RowSelected, "#fd-evidence")
    def _evidence_chosen(self, event: DataTable.RowSelected) -> None:
        self._go(event.cursor_row)

    def action_go(self) -> None:
        ev = self.query_one("#fd-evidence", DataTable)
        self._go(ev.cursor_row if ev.has_focus else 0)

    def _go(self, i: int) -> None:
        if 0 <= i < len(self.places):
            place = self.places[i]
            target = target_of(place)
            if target:
                self.post_message(Jump(target, place))

    def _select(self, index: int) -> None:
        if self.snap is None or self.snap.report is None:
            return
        findings = self.snap.report["findings"]
        if not 0 <= index < len(findings):
            return
        f = findings[index]
        self.query_one("#fd-detail", Static).update(detail(f, self.snap.report["mfu"]))
        ids = tuple(f["evidence"][:MAX_EVIDENCE])
        query(self, "evidence", lambda cur: tuple(evidence.resolve(cur, e) for e in ids), self._evidence)

    def _evidence(self, places: tuple[Place, ...]) -> None:
        self.places = places
        t = self.query_one("#fd-evidence", DataTable)
        t.clear()
        for i, p in enumerate(places):
            arrow = {"timeline": "→ timeline     ", "collectives": "→ collectives  "}.get(target_of(p) or "", "")
            t.add_row(Text(arrow, style="dim") + name_text(p.label), key=str(i))
