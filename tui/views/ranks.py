"""Ranks: a rank × step heatmap of the step time or any ledger bucket; a cell opens that rank's step."""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Static

from tui.palette import HEAT
from tui.queries import METRICS, STEP_TIME, HeatGrid, Place, fmt_seconds
from tui.snapshot import Snapshot
from tui.views.base import Jump, View
from tui.widgets.heatmap import Heatmap, fmt_value, unit_of


def cell_detail(grid: HeatGrid, row: int, col: int) -> Text:
    """The selected rank-step: its time and its ledger, largest buckets first, with the rank's rank."""
    rank, step = grid.ranks[row], grid.steps[col]
    t = Text()
    t.append(f"rank {rank} · step {step}", style="bold")
    st = grid.value(STEP_TIME, row, col)
    t.append(f" · {fmt_seconds(st)}\n")
    col_values = grid.values[STEP_TIME][:, col]
    finite = col_values[np.isfinite(col_values)]
    if st is not None and finite.size > 1:
        median = float(np.median(finite))
        slower = int((finite > st).sum())
        t.append(f"{(st / median - 1) * 100:+.1f}% vs the median rank; {slower} of {finite.size} ranks slower\n",
                 style="dim")
    parts = sorted(((m, grid.value(m, row, col) or 0.0) for m in METRICS if m != STEP_TIME), key=lambda x: -x[1])
    for m, v in parts:
        if v >= 0.0005:
            t.append(f"{m} ", style="")
            t.append(f"{v * 100:.1f}%  ", style="bold")
    return t


class Ranks(View):
    BINDINGS = [
        Binding("m", "metric(1)", "Metric"),
        Binding("M", "metric(-1)", "Metric ←", show=False),
        Binding("s", "metric_to('step_time')", "Step time", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield Static(id="rk-head")
        with Horizontal(id="rk-body"):
            yield Heatmap(id="rk-heat")
            yield Static(id="rk-cell")

    def focus_main(self) -> None:
        self.query_one(Heatmap).focus()

    def show(self, snap: Snapshot) -> None:
        if snap.heat is not None:
            self.query_one(Heatmap).show(snap.heat)
        self._head()

    def goto(self, place: Place) -> None:
        if place.rank is not None and place.step is not None:
            self.query_one(Heatmap).select(place.rank, place.step)

    def action_metric(self, delta: int) -> None:
        h = self.query_one(Heatmap)
        h.metric = METRICS[(METRICS.index(h.metric) + delta) % len(METRICS)]
        self._head()

    def action_metric_to(self, metric: str) -> None:
        self.query_one(Heatmap).metric = metric
        self._head()

    def _head(self) -> None:
        h = self.query_one(Heatmap)
        t = Text()
        t.append("metric ", style="dim")
        t.append(h.metric.replace("_", " "), style="bold")
        t.append(f" ({unit_of(h.metric)})", style="dim")
        t.append("  low ")
        for c in HEAT:
            t.append("█", style=c)
        t.append(" high", style="")
        if h.grid is not None and h.grid.ranks:
            v = h.grid.values[h.metric]
            finite = v[np.isfinite(v)]
            if finite.size:
                t.append(f"  {fmt_value(h.metric, float(finite.min()))}–{fmt_value(h.metric, float(finite.max()))}",
                         style="dim")
        t.append("   m: next metric · enter: open the step", style="dim")
        self.query_one("#rk-head", Static).update(t)

    @on(Heatmap.CellChanged)
    def _cell(self, event: Heatmap.CellChanged) -> None:
        h = self.query_one(Heatmap)
        if h.grid is not None:
            self.query_one("#rk-cell", Static).update(cell_detail(h.grid, h.row, h.col))

    @on(Heatmap.Opened)
    def _open(self, event: Heatmap.Opened) -> None:
        self.post_message(Jump("timeline", Place(f"rank {event.rank} step {event.step}", event.rank, event.step)))
