"""Overview: the headline numbers, the waterfall from the peak to the MFU, the top findings."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from diag.attribution.analysis import mfu_missing
from diag.outputs.report import mfu_words, path_line, peak_label
from diag.runtime.durations import number, percent
from diag.runtime.sanitize import terminal
from tui.queries import fmt_seconds
from tui.snapshot import LiveStatus, Snapshot
from tui.views.base import Jump, View, right
from tui.views.status import live_detail
from tui.widgets.waterfall import Waterfall

TOP_FINDINGS = 5
SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def headline(r: Mapping[str, Any]) -> Text:
    d = r["device"]
    t = Text()
    t.append("MFU ", style="dim")
    t.append(mfu_words(r) if r.get("mfu_range") else percent(r["mfu"], "?"), style="bold")
    t.append("   HFU ", style="dim")
    t.append(percent(r["hfu"], "?"), style="bold")
    t.append("   step ", style="dim")
    t.append(fmt_seconds(r["step_time_s"]), style="bold")
    t.append("   world ", style="dim")
    t.append(str(r["world_size"]), style="bold")
    t.append(f" ({len(r['ranks'])} traced) × {r['steps']} steps", style="dim")
    t.append("\n")
    part = d["name"] or "unknown GPU"
    if len(d.get("dtype_mix") or {}) > 1:
        peak = peak_label(d)   # effective peak of the dtype mix, and the mix
    else:
        peak = f"{d['dtype']} dense peak {number(d['peak_tflops'])} TFLOP/s" if d["peak_tflops"] else "peak unknown"
    t.append(f"{terminal(part)} · {peak}", style="")
    if r["mfu"] is None and r.get("timeline", "gpu") == "gpu":
        t.append(f" — MFU: {mfu_missing(d['peak_tflops'] is not None)}", style="yellow")
    return t


class Overview(View):
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="ov-scroll"):
            yield Static(id="ov-live")
            yield Static(id="ov-head")
            yield Static(id="ov-path")
            with Horizontal(id="ov-body"):
                with Vertical(id="ov-left"):
                    yield Static("[b]Where the step went[/b] [dim]MFU points, mean over ranks and steps[/dim]",
                                 classes="section")
                    yield Waterfall(id="ov-waterfall")
                with Vertical(id="ov-right"):
                    yield Static("[b]Top findings[/b] [dim]by what a fix wins · pts lost · MFU once fixed[/dim]", classes="section")
                    yield DataTable(id="ov-findings", cursor_type="row", zebra_stripes=False)
            yield Static(id="ov-notes")

    def on_mount(self) -> None:
        t = self.query_one("#ov-findings", DataTable)
        t.add_column("finding", key="finding")
        t.add_column("pts", key="pts")
        t.add_column("without", key="whatif")

    def focus_main(self) -> None:
        self.query_one("#ov-findings", DataTable).focus(scroll_visible=False)

    def show_live(self, live: LiveStatus) -> None:
        self.query_one("#ov-live", Static).update(live_detail(live))

    def show(self, snap: Snapshot) -> None:
        r = snap.report
        head = self.query_one("#ov-head", Static)
        if r is None:
            head.update(Text("waiting for the first trace…", style="dim"))
            return
        head.update(headline(r))
        self.query_one("#ov-path", Static).update(Text(path_line(r) if r["critical_path"] else "", style="dim"))
        self.query_one("#ov-waterfall", Waterfall).show(r["ledger"], r["mfu"] is not None)
        t = self.query_one("#ov-findings", DataTable)
        t.clear()
        for i, f in enumerate(r["findings"][:TOP_FINDINGS]):
            t.add_row(Text(f"{f['code']} {f['slug']}", style=SEVERITY_STYLE.get(f["severity"], "")),
                      right(f"{f['mfu_points']:.1f}"), right(percent(f["what_if_mfu"], "?")), key=str(i))
        if not r["findings"]:
            t.add_row(Text("no findings above their thresholds", style="dim"), "", "")
        notes = Text()
        # Paths under the opened directory's parent read from there: the user knows where that is.
        base = str(Path(snap.source).resolve().parent) + os.sep
        for n in r["notes"]:
            notes.append(f"• {terminal(n.replace(base, ''))}\n", style="dim")
        self.query_one("#ov-notes", Static).update(notes)

    @on(DataTable.RowSelected, "#ov-findings")
    def _open(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(Jump("findings", finding=int(event.row_key.value)))
