"""Timeline: per-rank lanes of one step, and the kernels and ops under the cursor."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from diag.outputs.evidence import Place
from tui import queries
from tui.palette import PATH_COLOR, PHASE_COLORS, PHASE_SHORT, STATE_COLORS
from tui.queries import Lanes, UnderCursor, fmt_seconds
from tui.snapshot import Snapshot
from tui.views.base import View, name_text, query, right
from tui.widgets.lanes import LanesWidget

PAGE = 32            # ranks loaded at once: lanes beyond a screenful load as the selection reaches them
UNDER_ROWS = 50


def legend() -> Text:
    t = Text()
    for name, color in STATE_COLORS.items():
        t.append("█", style=color)
        t.append(f"{name} ")
    t.append("·idle  ", style="dim")
    t.append("host: ", style="dim")
    for name, color in PHASE_COLORS.items():
        t.append("▄", style=color)
        t.append(f"{PHASE_SHORT[name]} ")
    t.append(" ━", style=PATH_COLOR)
    t.append("critical path (p)", style="dim")
    return t


class Timeline(View):
    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.snap: Snapshot | None = None
        self.step: int | None = None
        self.rank: int | None = None
        self._loaded: tuple[object, ...] = ()
        self._focus_ns: tuple[int, int] | None = None
        self._pending = False          # lanes are loading: the ones on screen no longer say where we are

    def compose(self) -> ComposeResult:
        yield Static(id="tl-head")
        yield Static(legend(), id="tl-legend")
        yield LanesWidget(id="tl-lanes")
        yield DataTable(id="tl-under", cursor_type="row")

    def on_mount(self) -> None:
        t = self.query_one("#tl-under", DataTable)
        for label, key in (("dur", "dur"), ("TFLOP/s", "tflops"), ("GFLOP", "gflop"), ("class", "class"),
                           ("start ms", "start"), ("op", "op"), ("kernel", "kernel")):
            t.add_column(label, key=key)

    def focus_main(self) -> None:
        self.query_one(LanesWidget).focus()

    # --- what to show -------------------------------------------------------------------------------

    def show(self, snap: Snapshot) -> None:
        self.snap = snap
        heat = snap.heat
        if heat is None or not heat.steps:
            return
        if self.step not in heat.steps:
            self.step = heat.steps[0]
        if self.rank not in heat.ranks:
            self.rank = heat.ranks[0]
        self._load(keep_view=True)

    def goto(self, place: Place) -> None:
        if place.step is not None:
            self.step = place.step
        if place.rank is not None:
            self.rank = place.rank
        self._focus_ns = (place.ts_ns, place.end_ns) if place.ts_ns is not None and place.end_ns is not None else None
        self._load(keep_view=False)

    def _page(self) -> tuple[int, ...]:
        assert self.snap is not None and self.snap.heat is not None
        ranks = self.snap.heat.ranks
        i = ranks.index(self.rank) if self.rank in ranks else 0
        start = (i // PAGE) * PAGE
        return ranks[start:start + PAGE]

    def _load(self, keep_view: bool) -> None:
        if self.snap is None or self.step is None:
            return
        page = self._page()
        key = (self.snap.generation, self.step, page)
        lanes_widget = self.query_one(LanesWidget)
        if key == self._loaded and lanes_widget.data is not None:
            self._lanes(lanes_widget.data, keep_view)
            return
        self._loaded = key
        self._pending = True
        step = self.step
        query(self, "lanes", lambda cur: queries.lanes(cur, step, page), lambda data: self._lanes(data, keep_view))

    def _lanes(self, data: Lanes, keep_view: bool) -> None:
        self._pending = False
        self.query_one(LanesWidget).show(data, self.rank, self._focus_ns, keep_view)
        self._focus_ns = None

    # --- reacting to the lanes ------------------------------------------------------------------------

    @on(LanesWidget.CursorMoved)
    def _cursor(self, event: LanesWidget.CursorMoved) -> None:
        if self._pending:
            return
        self.rank = event.rank
        lw = self.query_one(LanesWidget)
        self._head(lw, int(lw.cursor_ns))
        offset = lw.data.offsets_ns.get(event.rank, 0) if lw.data else 0
        rank, t0, t1 = event.rank, event.t0_ns, event.t1_ns
        query(self, "under", lambda cur: queries.under_cursor(cur, rank, t0, t1, offset, UNDER_ROWS), self._under)

    @on(LanesWidget.StepShift)
    def _step(self, event: LanesWidget.StepShift) -> None:
        if self.snap is None or self.snap.heat is None or self.step is None:
            return
        steps = self.snap.heat.steps
        i = max(0, min(len(steps) - 1, steps.index(self.step) + event.delta))
        if steps[i] != self.step:
            self.step = steps[i]
            self._load(keep_view=False)

    @on(LanesWidget.LaneChanged)
    def _lane(self, event: LanesWidget.LaneChanged) -> None:
        if self.snap is None or self.snap.heat is None or self.rank is None:
            return
        ranks = self.snap.heat.ranks
        i = max(0, min(len(ranks) - 1, ranks.index(self.rank) + event.delta))
        if ranks[i] != self.rank:
            self.rank = ranks[i]
            self._load(keep_view=True)

    def _head(self, lw: LanesWidget, cursor_ns: int) -> None:
        if lw.data is None or self.snap is None or self.snap.heat is None:
            return
        steps = self.snap.heat.steps
        origin, end = lw.data.span_ns
        t0, t1 = lw.view
        zoom = (end - origin) / max(t1 - t0, 1)
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(f"step {self.step}", style="bold")
        t.append(f" {steps.index(self.step) + 1}/{len(steps)}" if self.step in steps else "", style="dim")
        t.append(f" · r{lw.rank}", style="bold")
        t.append(f" · cursor {(cursor_ns - origin) / 1e6:.3f} ms", style="bold")
        t.append(f" · view {(t0 - origin) / 1e6:.3f}–{(t1 - origin) / 1e6:.3f} ms (×{zoom:.3g})")
        t.append(f" · {len(lw.data.ranks)}/{len(self.snap.heat.ranks)} ranks", style="dim")
        self.query_one("#tl-head", Static).update(t)

    def _under(self, u: UnderCursor) -> None:
        lw = self.query_one(LanesWidget)
        origin = lw.data.span_ns[0] if lw.data else 0
        offset = lw.data.offsets_ns.get(u.rank, 0) if lw.data else 0
        t = self.query_one("#tl-under", DataTable)
        t.clear()
        for a in u.activities:
            tf = a.tflops_per_s
            t.add_row(right(fmt_seconds(a.dur_ns * 1e-9)), right("" if tf is None else f"{tf:.1f}"),
                      right("" if not a.flops else f"{a.flops / 1e9:.3g}"), name_text(a.kclass + (f" {a.collective}" if a.collective else "")),
                      right(f"{(a.ts_ns + offset - origin) / 1e6:.3f}"), name_text(a.op_name), name_text(a.name))
        if u.total > len(u.activities):
            t.add_row("", "", "", "", "", "", Text(f"… {u.total - len(u.activities)} more", style="dim"))
        if not u.activities:
            t.add_row("", "", "", "", "", "", Text("nothing on the GPU here", style="dim"))
