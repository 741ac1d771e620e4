"""Rank × step heatmap: one row per rank, one cell per step, coloured by the chosen metric."""

from __future__ import annotations

import math

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from tui.palette import heat_color, text_on
from tui.queries import STEP_TIME, HeatGrid

CELL = 8          # "  4.68ms" / " 25.6%": a value and a space
LABEL = 7         # "r1023 ▶"


def fmt_value(metric: str, v: float | None) -> str:
    if v is None:
        return "·"
    if metric == STEP_TIME:
        ms = v * 1e3
        return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"
    return f"{v * 100:.1f}"


def fmt_unit(metric: str, v: float | None) -> str:
    return fmt_value(metric, v) + (" ms" if metric == STEP_TIME else "%")


def unit_of(metric: str) -> str:
    return "ms" if metric == STEP_TIME else "% of step"


class Heatmap(Widget, can_focus=True):
    """Arrows move, enter opens the cell's rank and step; the scale spans the metric's range."""

    BINDINGS = [
        Binding("up,k", "move(0,-1)", "rank ↑", show=False),
        Binding("down,j", "move(0,1)", "rank ↓", show=False),
        Binding("left,h", "move(-1,0)", "step ←", show=False),
        Binding("right,l", "move(1,0)", "step →", show=False),
        Binding("pageup", "move(0,-10)", "10 ranks ↑", show=False),
        Binding("pagedown", "move(0,10)", "10 ranks ↓", show=False),
        Binding("home", "edge(-1)", "first rank", show=False),
        Binding("end", "edge(1)", "last rank", show=False),
        Binding("enter", "open", "Open step"),
    ]

    DEFAULT_CSS = """
    Heatmap { height: 1fr; width: 1fr; }
    """

    class CellChanged(Message):
        def __init__(self, rank: int, step: int) -> None:
            self.rank = rank
            self.step = step
            super().__init__()

    class Opened(Message):
        def __init__(self, rank: int, step: int) -> None:
            self.rank = rank
            self.step = step
            super().__init__()

    row: reactive[int] = reactive(0)
    col: reactive[int] = reactive(0)
    metric: reactive[str] = reactive(STEP_TIME)

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.grid: HeatGrid | None = None
        self._top = 0
        self._left = 0
        self._range_cache: tuple[object, tuple[float, float]] = (None, (0.0, 1.0))

    def show(self, grid: HeatGrid) -> None:
        self.grid = grid
        self.row = min(self.row, max(len(grid.ranks) - 1, 0))
        self.col = min(self.col, max(len(grid.steps) - 1, 0))
        self.refresh()
        self._announce()

    def select(self, rank: int, step: int) -> None:
        if self.grid is None:
            return
        if rank in self.grid.ranks:
            self.row = self.grid.ranks.index(rank)
        if step in self.grid.steps:
            self.col = self.grid.steps.index(step)

    # --- keys and mouse ---------------------------------------------------------------------------

    def action_move(self, dx: int, dy: int) -> None:
        if self.grid is None:
            return
        self.col = max(0, min(len(self.grid.steps) - 1, self.col + dx))
        self.row = max(0, min(len(self.grid.ranks) - 1, self.row + dy))

    def action_edge(self, direction: int) -> None:
        if self.grid is not None:
            self.row = 0 if direction < 0 else len(self.grid.ranks) - 1

    def action_open(self) -> None:
        if self.grid is not None and self.grid.ranks:
            self.post_message(self.Opened(self.grid.ranks[self.row], self.grid.steps[self.col]))

    def on_click(self, event: events.Click) -> None:
        if self.grid is None or event.y < 1 or event.x < LABEL:
            return
        row = self._top + event.y - 1
        col = self._left + (event.x - LABEL) // CELL
        if row < len(self.grid.ranks) and col < len(self.grid.steps):
            again = (row, col) == (self.row, self.col)
            self.row, self.col = row, col
            if again or event.chain > 1:
                self.action_open()

    def watch_row(self) -> None:
        self._announce()

    def watch_col(self) -> None:
        self._announce()

    def watch_metric(self) -> None:
        self.refresh()

    def _announce(self) -> None:
        if self.grid is not None and self.grid.ranks and self.grid.steps:
            self.post_message(self.CellChanged(self.grid.ranks[self.row], self.grid.steps[self.col]))
        self.refresh()

    # --- drawing ----------------------------------------------------------------------------------

    def _scroll_to_cursor(self) -> None:
        rows = max(self.size.height - 1, 1)
        cols = max((self.size.width - LABEL) // CELL, 1)
        self._top = min(max(self._top, self.row - rows + 1), self.row)
        self._left = min(max(self._left, self.col - cols + 1), self.col)

    def render_line(self, y: int) -> Strip:
        grid = self.grid
        width = self.size.width
        if grid is None or not grid.ranks:
            return Strip.blank(width, self.rich_style)
        self._scroll_to_cursor()
        if y == 0:
            return self._header(grid, width)
        row = self._top + y - 1
        if row >= len(grid.ranks):
            return Strip.blank(width, self.rich_style)
        lo, hi = self._range(grid, self.metric)
        selected_row = row == self.row
        label = f"r{grid.ranks[row]}"
        segs = [Segment(f"{label:>{LABEL - 2}}{'▶' if selected_row else ' '} ",
                        Style(reverse=True, bold=True) if selected_row else None)]
        ncols = (width - LABEL) // CELL
        for c in range(self._left, min(len(grid.steps), self._left + ncols)):
            v = grid.value(self.metric, row, c)
            text = fmt_value(self.metric, v).rjust(CELL - 1) + " "
            if v is None or math.isnan(v):
                segs.append(Segment(text, Style(dim=True)))
                continue
            bg = heat_color(0.5 if hi <= lo else (v - lo) / (hi - lo))
            style = Style(color=text_on(bg), bgcolor=bg)
            if selected_row and c == self.col:
                style += Style(bold=True, underline=True, reverse=self.has_focus)
            segs.append(Segment(text, style))
        return Strip(segs).adjust_cell_length(width).apply_style(self.rich_style)

    def _range(self, grid: HeatGrid, metric: str) -> tuple[float, float]:
        key = (id(grid), metric)
        if self._range_cache[0] != key:
            values = grid.values[metric]
            finite = values[np.isfinite(values)]
            lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
            # Noise is not news: the scale spans at least 10% of the median step, or 5 points of a bucket.
            least = 0.1 * float(np.median(finite)) if metric == STEP_TIME and finite.size else 0.05
            if hi - lo < least:
                mid = (hi + lo) / 2
                lo, hi = mid - least / 2, mid + least / 2
            self._range_cache = (key, (lo, hi))
        return self._range_cache[1]

    def _header(self, grid: HeatGrid, width: int) -> Strip:
        ncols = (width - LABEL) // CELL
        segs = [Segment("step".rjust(LABEL - 1) + " ", Style(dim=True))]
        for c in range(self._left, min(len(grid.steps), self._left + ncols)):
            text = str(grid.steps[c]).rjust(CELL - 1) + " "
            segs.append(Segment(text, Style(bold=c == self.col)))
        return Strip(segs).adjust_cell_length(width).apply_style(self.rich_style)
