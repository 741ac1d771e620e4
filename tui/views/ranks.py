"""Ranks: a rank × step heatmap of the step time or any ledger bucket; a cell opens that rank's step."""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Static

from diag.outputs.evidence import Place
from diag.runtime.durations import signed_percent
from tui.palette import HEAT
from tui.queries import METRICS, STEP_TIME, HeatGrid, fmt_seconds
from tui.snapshot import Snapshot
from tui.views.base import Jump, View
from tui.widgets.heatmap import Heatmap, fmt_unit, fmt_value, unit_of


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
        t.append(f"{signed_percent(st / median - 1)} vs the median rank; {slower} of {finite.size} ranks slower\n",
                 style="dim")
    parts = sorted(((m, grid.value(m, row, col) or 0.0) for m in METRICS if m != STEP_TIME), key=lambda x: -x[1])
    for m, v in parts:
        if v >= 0.0005:
            t.append(f"{m} ", style="")
            t.append(f"{v * 100:.1f}%  ", style="bold")
    return t


NO_OUTLIER = ("no rank stands out in any metric: none is 3 median deviations from the median rank and also 5% "
              "of the step (step time) or 2 points of it (a bucket) away")


def outlier(grid: HeatGrid, metric: str) -> tuple[int, float, float] | None:
    """The rank whose mean over steps is furthest from the median rank's: (rank, its mean, median).

    Reported only when it stands out: beyond 3 median absolute deviations of the rank means, and
    by 5% of the median step for the step time or 2 points of the step for a bucket (a straggler
    is one rank the others wait for; noise is many small differences).
    """
    values = grid.values[metric]
    with np.errstate(all="ignore"):
        means = np.nanmean(values, axis=1) if values.size else values
    ok = np.isfinite(means)
    if ok.sum() < 3:
        return None
    median = float(np.median(means[ok]))
    dev = np.where(ok, np.abs(means - median), -1.0)
    i = int(dev.argmax())
    mad = float(np.median(np.abs(means[ok] - median)))
    least = 0.05 * abs(median) if metric == STEP_TIME else 0.02
    if dev[i] <= 3 * mad or dev[i] < least:
        return None
    return grid.ranks[i], float(means[i]), median


def strongest_outlier(grid: HeatGrid) -> tuple[str, int, float, float] | None:
    """Over all metrics, the outlier that moves the most of the step: (metric, rank, mean, median).

    Buckets deviate in fractions of the step already; the step time's deviation is made one by
    dividing by the median step.
    """
    best: tuple[float, tuple[str, int, float, float]] | None = None
    for m in METRICS:
        out = outlier(grid, m)
        if out is None:
            continue
        rank, mean, median = out
        weight = abs(mean - median) / (abs(median) if m == STEP_TIME else 1.0)
        if best is None or weight > best[0]:
            best = (weight, (m, rank, mean, median))
    return None if best is None else best[1]


class Ranks(View):
    BINDINGS = [
        Binding("m", "metric(1)", "Metric"),
        Binding("o", "outlier", "Outlier"),
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

    def action_outlier(self) -> None:
        """Show the metric in which a rank stands out most, and select that rank."""
        h = self.query_one(Heatmap)
        if h.grid is None:
            return
        best = strongest_outlier(h.grid)
        if best is not None:
            h.metric = best[0]
            h.row = h.grid.ranks.index(best[1])
        else:   # a key that does nothing silently looks broken
            self.notify(NO_OUTLIER, title="o: outlier", timeout=6)
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
            t.append("\n")
            out = outlier(h.grid, h.metric)
            if out is not None:
                rank, mean, median = out
                t.append(f"r{rank} stands out", style="bold yellow")
                t.append(f": {fmt_unit(h.metric, mean)} vs {fmt_unit(h.metric, median)} for the median rank")
            else:
                t.append("no rank stands out here", style="dim")
                best = strongest_outlier(h.grid)
                if best is not None:
                    metric, rank, mean, median = best
                    t.append(f"; r{rank} does in {metric}", style="bold yellow")
                    t.append(f" ({fmt_unit(metric, mean)} vs {fmt_unit(metric, median)}): o shows it")
        self.query_one("#rk-head", Static).update(t)

    @on(Heatmap.CellChanged)
    def _cell(self, event: Heatmap.CellChanged) -> None:
        h = self.query_one(Heatmap)
        if h.grid is not None:
            self.query_one("#rk-cell", Static).update(cell_detail(h.grid, h.row, h.col))

    @on(Heatmap.Opened)
    def _open(self, event: Heatmap.Opened) -> None:
        self.post_message(Jump("timeline", Place(f"rank {event.rank} step {event.step}", event.rank, event.step)))
