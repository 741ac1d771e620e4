"""From the peak to the achieved MFU: one bar per loss, in MFU points (each bucket's share of the step)."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.widget import Widget

from diag.attribution.ledger import BUCKETS

# Colour by where the time went: compute kernels, communication, an idle GPU, copies.
_GROUP_COLORS = {
    "recompute": "#ef6c00", "thin_gemm": "#ef6c00", "gemm_inefficiency": "#ef6c00", "non_matmul": "#ef6c00",
    "exposed_comm": "#8e24aa", "straggler": "#8e24aa", "pipeline_bubble": "#8e24aa",
    "dataloader": "#757575", "host_bound": "#757575", "idle_other": "#757575", "memcpy": "#fb8c00",
}
_MFU_COLOR = "#43a047"
MIN_POINTS = 0.05        # as the text report: smaller losses are not drawn
LABEL = 20
VALUE = 7


def waterfall_rows(ledger: Mapping[str, float], mfu_known: bool = True) -> list[tuple[str, float]]:
    """(bucket, MFU points), largest loss first, leaving out losses under MIN_POINTS. With the MFU
    unknown, gemm_inefficiency holds all GEMM/attention time and is no loss (the report's UNSPLIT row)."""
    shown = [b for b in BUCKETS if b != "model_compute" and (mfu_known or b != "gemm_inefficiency")]
    losses = sorted(((b, ledger.get(b, 0.0) * 100) for b in shown), key=lambda x: -x[1])
    return [(b, p) for b, p in losses if p >= MIN_POINTS]


def _bar(a: float, b: float, width: int) -> str:
    """Columns from a to b points (of 100) at half-column resolution; a hairline when thinner."""
    lo, hi = round(a / 100 * width * 2), round(b / 100 * width * 2)
    if hi <= lo:
        col = min(int(a / 100 * width), width - 1)
        return " " * col + "▏"
    out = []
    for c in range(width):
        left, right = lo <= 2 * c < hi, lo <= 2 * c + 1 < hi
        out.append("█" if left and right else "▌" if left else "▐" if right else " ")
    return "".join(out).rstrip()


class Waterfall(Widget):
    DEFAULT_CSS = """
    Waterfall { height: auto; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.ledger: Mapping[str, float] | None = None
        self.mfu_known = True

    def show(self, ledger: Mapping[str, float], mfu_known: bool = True) -> None:
        self.ledger, self.mfu_known = ledger, mfu_known
        self.refresh(layout=True)

    def _unsplit(self) -> float | None:
        points = (self.ledger or {}).get("gemm_inefficiency", 0.0) * 100
        return points if not self.mfu_known and points >= MIN_POINTS else None

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        if self.ledger is None:
            return 0
        return len(waterfall_rows(self.ledger, self.mfu_known)) + 3 + (self._unsplit() is not None)

    def render(self) -> Text:
        if self.ledger is None:
            return Text("")
        width = max(self.size.width - LABEL - VALUE, 10)
        out = Text(no_wrap=True, overflow="crop")
        out.append(" " * LABEL + _scale(width) + "pts".rjust(VALUE) + "\n", style="dim")

        def line(label: str, a: float, b: float, style: str, label_style: str = "", value: str | None = None) -> None:
            bar = _bar(a, b, width) if value is None else ""
            out.append(f"{label:<{LABEL}}", style=label_style)
            out.append(bar, style=style)
            out.append(" " * (width - len(bar)) + (f"{b - a:>{VALUE}.1f}" if value is None else f"{value:>{VALUE}}")
                       + "\n", style=label_style)

        line("peak", 0, 100, "dim", "bold")
        level = 100.0
        for bucket, pts in waterfall_rows(self.ledger, self.mfu_known):
            line(f"− {bucket}", level - pts, level, _GROUP_COLORS.get(bucket, ""))
            level -= pts
        if (unsplit := self._unsplit()) is not None:
            line("? matmul (FLOPs ?)", level - unsplit, level, _GROUP_COLORS["gemm_inefficiency"])
        # An unknown MFU is "?", never a bar of 0.0 under a header that says "MFU ?".
        line("= MFU", 0, self.ledger.get("model_compute", 0.0) * 100, _MFU_COLOR, "bold",
             None if self.mfu_known else "?")
        out.rstrip()
        return out


def _scale(width: int) -> str:
    """0, 25, 50, 75 and 100 at their columns."""
    chars = [" "] * width
    for p in (0, 25, 50, 75, 100):
        text = str(p)
        x = min(round(p / 100 * width), width - len(text)) if p else 0
        chars[x:x + len(text)] = list(text)
    return "".join(chars)
