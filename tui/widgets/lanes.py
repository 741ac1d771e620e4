"""Per-rank lanes of one step: the host phase above, the GPU state below, a cursor, zoom and pan;
`p` highlights the step's critical path (the rest of the GPU lanes dimmed)."""

from __future__ import annotations

import math

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from tui.palette import PATH_COLOR, PHASE_COLORS, STATE_COLORS
from tui.queries import Lanes
from tui.raster import nice_step, rasterize

_ZOOM = Binding.Group("Zoom", compact=True)
_STEP = Binding.Group("Step", compact=True)
MIN_VIEW_NS = 2_000      # zooming stops at ~2 µs across the screen: below a kernel launch
ZOOM = 2.0


class LanesWidget(Widget, can_focus=True):
    BINDINGS = [
        Binding("left,h", "cursor(-1)", "←", show=False),
        Binding("right,l", "cursor(1)", "→", show=False),
        Binding("shift+left,H", "cursor(-10)", "← ×10", show=False),
        Binding("shift+right,L", "cursor(10)", "→ ×10", show=False),
        Binding("home", "cursor_edge(-1)", "view start", show=False),
        Binding("end", "cursor_edge(1)", "view end", show=False),
        Binding("up,k", "lane(-1)", "rank ↑", show=False),
        Binding("down,j", "lane(1)", "rank ↓", show=False),
        Binding("pageup", "lane(-8)", "8 ranks ↑", show=False),
        Binding("pagedown", "lane(8)", "8 ranks ↓", show=False),
        Binding("plus,equals_sign", "zoom(1)", "Zoom", key_display="+", group=_ZOOM),
        Binding("minus", "zoom(-1)", "Unzoom", key_display="-", group=_ZOOM),
        Binding("0", "zoom_reset", "Fit"),
        Binding("left_square_bracket", "step(-1)", "Prev step", key_display="[", group=_STEP),
        Binding("right_square_bracket", "step(1)", "Next step", key_display="]", group=_STEP),
        Binding("p", "toggle_path", "Critical path"),
    ]

    DEFAULT_CSS = """
    LanesWidget { height: auto; max-height: 60%; }
    """

    class CursorMoved(Message):
        """The selected rank and the aligned time span under the cursor column."""

        def __init__(self, rank: int, t0_ns: int, t1_ns: int) -> None:
            self.rank = rank
            self.t0_ns = t0_ns
            self.t1_ns = t1_ns
            super().__init__()

    class StepShift(Message):
        def __init__(self, delta: int) -> None:
            self.delta = delta
            super().__init__()

    class LaneChanged(Message):
        """The selection moved to a rank that is not loaded: the view loads its page."""

        def __init__(self, delta: int) -> None:
            self.delta = delta
            super().__init__()

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.data: Lanes | None = None
        self.view: tuple[float, float] = (0.0, 1.0)      # aligned ns across the plot
        self.cursor_ns = 0.0                              # the cursor is a time: zoom and resize keep it
        self.sel = 0
        self.top = 0
        self.show_path = False                            # the critical path highlighted
        self._raster: dict[tuple[int, str], list[str | None]] = {}
        self._raster_key: tuple[object, ...] = ()

    # --- state ------------------------------------------------------------------------------------

    @property
    def label_width(self) -> int:
        if self.data is None or not self.data.ranks:
            return 6
        return len(str(max(self.data.ranks))) + 4      # "▶r12 "

    @property
    def plot_width(self) -> int:
        return max(self.size.width - self.label_width, 1)

    @property
    def lanes_visible(self) -> int:
        return max((self.size.height - 1) // 2, 1)

    @property
    def rank(self) -> int | None:
        if self.data is None or not self.data.ranks:
            return None
        return self.data.ranks[self.sel]

    @property
    def ns_per_col(self) -> float:
        return (self.view[1] - self.view[0]) / self.plot_width

    @property
    def cursor_col(self) -> int:
        return max(0, min(self.plot_width - 1, int((self.cursor_ns - self.view[0]) / self.ns_per_col)))

    def show(self, data: Lanes, rank: int | None, focus_ns: tuple[int, int] | None, keep_view: bool = False) -> None:
        """New lanes; select `rank`, and frame `focus_ns` (an activity), the same time as before
        (`keep_view`: other ranks of the same step), or the whole step."""
        same_step = self.data is not None and self.data.step == data.step
        resized = self.data is None or len(self.data.ranks) != len(data.ranks)
        self.data = data
        if resized:
            self.refresh(layout=True)
        self.sel = data.ranks.index(rank) if rank in data.ranks else 0
        lo, hi = data.span_ns
        if focus_ns is not None:
            a, b = focus_ns
            width = max((b - a) * 3, MIN_VIEW_NS)        # the activity takes a third of the screen
            mid = (a + b) / 2
            self.view = (mid - width / 2, mid + width / 2)
            self.cursor_ns = mid
        elif not (keep_view and same_step):
            self.view = (float(lo), float(hi))
            if not lo <= self.cursor_ns < hi:
                self.cursor_ns = (lo + hi) / 2      # mid-step: the start is often the idle data wait
        self._moved()

    def column_span(self, col: int) -> tuple[int, int]:
        t0 = self.view[0]
        dt = self.ns_per_col
        return int(t0 + col * dt), int(t0 + (col + 1) * dt)

    def _moved(self) -> None:
        self.refresh()
        r = self.rank
        if r is not None and self.size.width > self.label_width:
            a, b = self.column_span(self.cursor_col)
            self.post_message(self.CursorMoved(r, a, max(b, a + 1)))

    def on_resize(self, event: events.Resize) -> None:
        self._moved()                    # the same cursor time covers another span at another width

    # --- keys and mouse ---------------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        dt = self.ns_per_col
        t = self.cursor_ns + delta * dt
        t0, t1 = self.view
        if not t0 <= t < t1:                      # past the edge: pan by a quarter screen
            shift = (t1 - t0) / 4 * (1 if t >= t1 else -1)
            self.view = (t0 + shift, t1 + shift)
        # Snap to the middle of its column, so that what is listed is what the cursor covers.
        self.cursor_ns = self.view[0] + (int((t - self.view[0]) / dt) + 0.5) * dt
        self._moved()

    def action_cursor_edge(self, direction: int) -> None:
        dt = self.ns_per_col
        self.cursor_ns = self.view[0] + dt / 2 if direction < 0 else self.view[1] - dt / 2
        self._moved()

    def action_lane(self, delta: int) -> None:
        if self.data is None:
            return
        target = self.sel + delta
        if target < 0 or target >= len(self.data.ranks):
            self.post_message(self.LaneChanged(delta))
            return
        self.sel = target
        self._moved()

    def action_zoom(self, direction: int) -> None:
        t0, t1 = self.view
        width = (t1 - t0) / ZOOM if direction > 0 else (t1 - t0) * ZOOM
        width = max(width, MIN_VIEW_NS)
        if self.data is not None and direction < 0:
            lo, hi = self.data.span_ns
            width = min(width, (hi - lo) * 1.5)
        frac = (self.cursor_ns - t0) / (t1 - t0)          # keep the time under the cursor where it is
        self.view = (self.cursor_ns - frac * width, self.cursor_ns + (1 - frac) * width)
        self._moved()

    def action_zoom_reset(self) -> None:
        if self.data is not None:
            lo, hi = self.data.span_ns
            self.view = (float(lo), float(hi))
            self._moved()

    def action_toggle_path(self) -> None:
        self.show_path = not self.show_path
        self.refresh()

    def action_step(self, delta: int) -> None:
        self.post_message(self.StepShift(delta))

    def on_click(self, event: events.Click) -> None:
        if self.data is None or event.y < 1:
            return
        lane = self.top + (event.y - 1) // 2
        if lane < len(self.data.ranks):
            self.sel = lane
        if event.x >= self.label_width:
            self.cursor_ns = self.view[0] + (event.x - self.label_width + 0.5) * self.ns_per_col
        self._moved()

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self.action_zoom(-1)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.action_zoom(1)

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        return 1 + 2 * (len(self.data.ranks) if self.data else 1)

    # --- drawing ----------------------------------------------------------------------------------

    def _row(self, rank: int, kind: str) -> list[str | None]:
        key = (id(self.data), self.view, self.plot_width)
        if key != self._raster_key:
            self._raster, self._raster_key = {}, key
        if (rank, kind) not in self._raster:
            assert self.data is not None
            spans = {"gpu": self.data.gpu, "cpu": self.data.cpu, "path": self.data.path}[kind].get(rank)
            self._raster[(rank, kind)] = rasterize(spans, self.view[0], self.view[1], self.plot_width)
        return self._raster[(rank, kind)]

    def _scroll_to_selection(self) -> None:
        assert self.data is not None
        n, visible = len(self.data.ranks), self.lanes_visible
        self.top = max(0, min(self.top, self.sel, n - visible))
        self.top = max(self.top, self.sel - visible + 1)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self.data is None:
            return Strip.blank(width, self.rich_style)
        self._scroll_to_selection()
        if y == 0:
            return self._axis(width)
        lane = self.top + (y - 1) // 2
        if lane >= len(self.data.ranks):
            return Strip.blank(width, self.rich_style)
        rank = self.data.ranks[lane]
        gpu_row = (y - 1) % 2 == 1
        selected = lane == self.sel
        lw = self.label_width
        label = f"{'▶' if selected else ' '}r{rank}".ljust(lw - 1) + " " if gpu_row else " " * lw
        segs = [Segment(label, Style(reverse=True, bold=True) if selected and gpu_row else Style(dim=not gpu_row))]
        cells = self._row(rank, "gpu" if gpu_row else "cpu")
        dark = self.app.current_theme.dark
        idle_fg = "#5f5f5f" if dark else "#b0b0b0"
        cursor_col = self.cursor_col
        path = self._row(rank, "path") if self.show_path and gpu_row else None
        for x, name in enumerate(cells):
            cursor = x == cursor_col
            if gpu_row:
                if name is None:
                    ch, style = " ", Style()
                elif name == "idle":
                    ch, style = "·", Style(color=idle_fg)
                else:
                    ch, style = "█", Style(color=STATE_COLORS.get(name, "#9e9e9e"))
                if path is not None:
                    # On the path the GPU's work keeps its colour and its waits show as a line;
                    # off it everything dims.
                    if path[x] is None:
                        style += Style(dim=True)
                    elif ch in " ·":
                        ch, style = "━", Style(color=PATH_COLOR, bold=True)
            else:
                # The lower half block sits the host phase right above its GPU lane, thinner.
                ch, style = ("▄", Style(color=PHASE_COLORS.get(name, "#9e9e9e"))) if name else (" ", Style())
            if cursor:
                fg = "#ffffff" if dark else "#000000"
                bg = style.color.name if style.color and ch in "█▄" else None
                style = Style(color=fg, bgcolor=bg, bold=True)
                ch = "┃"
            segs.append(Segment(ch, style))
        return Strip(segs).simplify().adjust_cell_length(width).apply_style(self.rich_style)

    def _axis(self, width: int) -> Strip:
        assert self.data is not None
        text = ruler(self.view, self.data.span_ns[0], self.plot_width, self.cursor_col)
        return Strip([Segment("ms".rjust(self.label_width - 1) + " ", Style(dim=True)),
                      Segment(text, Style(dim=True))]).adjust_cell_length(width).apply_style(self.rich_style)


def ruler(view: tuple[float, float], origin: float, width: int, cursor: int) -> str:
    """The time axis over `view` (ns), ticks labelled in ms from `origin`, the cursor ▼ at column
    `cursor`. A label the cursor would cut ("1▼5" for 125) is left out whole; its tick stays."""
    t0, t1 = view
    step = nice_step(t1 - t0, width)
    chars = [" "] * width
    t = ((t0 - origin) // step + 1) * step + origin
    while t < t1:
        x = int((t - t0) / (t1 - t0) * width)
        text = "╵" + _ms(t - origin, step)
        if x >= 0 and x + len(text) <= width:
            if x <= cursor < x + len(text):
                chars[x] = "╵"
            else:
                chars[x:x + len(text)] = list(text)
        t += step
    chars[cursor] = "▼"
    return "".join(chars)


def _ms(t_ns: float, step_ns: float) -> str:
    """A tick label in ms with as many decimals as the tick interval needs."""
    decimals = max(0, min(6, -math.floor(math.log10(step_ns / 1e6)))) if step_ns > 0 else 0
    return f"{t_ns / 1e6:.{decimals}f}"
