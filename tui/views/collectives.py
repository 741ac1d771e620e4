"""Collectives by process group, collective and size; a group's instances: who waited, who was last.
Above them, the mesh (the report's `parallelism`) where the run is more than data parallel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from diag.outputs.evidence import Place, fmt_bytes, pg_label
from diag.outputs.report import mesh_rows
from diag.runtime.sanitize import terminal
from tui import queries
from tui.queries import CollectiveGroup, CollectiveInstance, fmt_seconds
from tui.snapshot import LinkRef, Snapshot
from tui.views.base import Jump, View, name_text, query, right


def size_label(g: CollectiveGroup) -> str:
    if g.size_log2 < 0:
        return "?"
    if g.min_bytes == g.max_bytes:
        return fmt_bytes(g.min_bytes)
    return f"{fmt_bytes(2 ** g.size_log2)}+"


def link_cells(g: CollectiveGroup, link: LinkRef | None) -> tuple[Text, Text]:
    """Bus bandwidth and its share of the link it should run on (nccl-tests' busbw)."""
    if g.busbw_gbps is None:
        return right("–"), right("–")
    bw = right(f"{g.busbw_gbps:.0f}")
    if link is None:
        return bw, right("?", "dim")
    share = g.busbw_gbps / link.gbps
    style = "green" if share >= 0.7 else "yellow" if share >= 0.4 else "red"
    return bw, right(f"{share * 100:.0f}% {link.name}", style)


def mesh_text(report: Mapping[str, Any] | None) -> Text | None:
    """The mesh, one line per kind of process group (outputs.report.mesh_rows); None for a run that is
    data parallel only (the group table below says all there is)."""
    p = (report or {}).get("parallelism")
    if not p or not (any(n > 1 for d, n in p["dims"].items() if d != "dp") or p["sharding"] not in (None, "none")):
        return None
    t = Text()
    t.append("mesh ", style="bold")
    t.append(" × ".join(f"{d} {n}" for d, n in p["dims"].items() if n > 1), style="bold")
    t.append(f" · sharding {p['sharding'] or 'unknown'}", style="dim")
    for dim, desc, groups, size, hosts, link, pts in mesh_rows(dict(report or {})):
        t.append(f"\n  {dim:<6}{terminal(desc)[:34]:<35}{groups:>4} × {size:<5} {hosts:>3} host(s) ")
        t.append(f"{link:<11}", style="red" if link == "network" and dim in ("tp", "cp", "ep") else "")
        if pts:
            t.append(f" {pts} pts exposed", style="bold")
    return t


class Collectives(View):
    BINDINGS = [Binding("g", "go", "Timeline")]

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.snap: Snapshot | None = None
        self.instances: tuple[CollectiveInstance, ...] = ()
        self._want_instance: str | None = None
        self._key: tuple[str | None, str | None, int] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="co-mesh")
        yield Static(id="co-head")
        yield DataTable(id="co-groups", cursor_type="row")
        yield Static(id="co-inst-head", classes="section")
        yield DataTable(id="co-instances", cursor_type="row")

    def on_mount(self) -> None:
        g = self.query_one("#co-groups", DataTable)
        for label, key in (("group", "pg"), ("collective", "coll"), ("size", "size"), ("calls", "calls"),
                           ("exposed", "exposed"), ("waiting", "wait"), ("last", "last"), ("GB/s", "busbw"),
                           ("of link", "link"), ("time", "time")):
            g.add_column(label, key=key)
        i = self.query_one("#co-instances", DataTable)
        for label, key in (("instance", "inst"), ("step", "step"), ("ranks", "ranks"), ("longest", "dur"),
                           ("max wait", "maxwait"), ("waited", "wait"), ("last", "last"), ("GB/s", "busbw")):
            i.add_column(label, key=key)

    def focus_main(self) -> None:
        self.query_one("#co-groups", DataTable).focus()

    def show(self, snap: Snapshot) -> None:
        self.snap = snap
        mesh = self.query_one("#co-mesh", Static)
        text = mesh_text(snap.report)
        mesh.update(text or "")
        mesh.display = text is not None
        t = self.query_one("#co-groups", DataTable)
        row = t.cursor_row
        t.clear()
        for i, (g, link) in enumerate(zip(snap.collectives, snap.links, strict=True)):
            bw, share = link_cells(g, link)
            last = "–" if g.last_rank is None else f"r{g.last_rank} {g.last_count}/{g.instances}"
            # One rank alone cannot say who waited for whom.
            wait = fmt_seconds(g.wait_s) if g.ranks > 1 else "–"
            t.add_row(name_text(pg_label(g.pg_name, g.pg_desc)), name_text(g.collective or "?"), right(size_label(g)), right(str(g.calls)),
                      right(fmt_seconds(g.exposed_s), "bold"), right(wait), right(last), bw, share,
                      right(fmt_seconds(g.time_s)), key=str(i))
        head = Text()
        if snap.collectives:
            n = len(snap.collectives)
            head.append(f"{n} group{'' if n == 1 else 's'}", style="bold")
            head.append(" · most exposed first (the GPU only communicating) · enter: instances", style="dim")
        else:
            head.append("no collectives in these traces", style="dim")
        self.query_one("#co-head", Static).update(head)
        if snap.collectives:
            t.move_cursor(row=min(row, len(snap.collectives) - 1))
            self._select(t.cursor_row)

    def goto(self, place: Place) -> None:
        if self.snap is None or place.collective_key is None:
            return
        keys = [g.key for g in self.snap.collectives]
        if place.collective_key in keys:
            self._want_instance = place.instance
            i = keys.index(place.collective_key)
            t = self.query_one("#co-groups", DataTable)
            t.move_cursor(row=i)
            self._key = None        # reload even if it is the selected group: the instance must be found
            self._select(i)
            self.query_one("#co-instances", DataTable).focus()

    @on(DataTable.RowHighlighted, "#co-groups")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._select(event.cursor_row)

    @on(DataTable.RowSelected, "#co-groups")
    def _chosen(self, event: DataTable.RowSelected) -> None:
        self.query_one("#co-instances", DataTable).focus()

    @on(DataTable.RowSelected, "#co-instances")
    def _instance_chosen(self, event: DataTable.RowSelected) -> None:
        self._go(event.cursor_row)

    def action_go(self) -> None:
        self._go(self.query_one("#co-instances", DataTable).cursor_row)

    def _go(self, i: int) -> None:
        if 0 <= i < len(self.instances):
            x = self.instances[i]
            self.post_message(Jump("timeline", Place(f"instance {x.instance}", x.last_rank, x.step,
                                                     x.aligned_ts_ns, x.aligned_end_ns)))

    def _select(self, i: int) -> None:
        if self.snap is None or not 0 <= i < len(self.snap.collectives):
            return
        g = self.snap.collectives[i]
        if g.key == self._key:
            return
        self._key = g.key
        head = Text()
        head.append(terminal(f"{g.collective} on {pg_label(g.pg_name, g.pg_desc)}, {size_label(g)}"), style="bold")
        head.append(f" · {g.instances} instances, longest wait first · enter or g: timeline at the last rank",
                    style="dim")
        self.query_one("#co-inst-head", Static).update(head)
        key = g.key
        query(self, "instances", lambda cur: queries.collective_instances(cur, key), self._instances)

    def _instances(self, rows: tuple[CollectiveInstance, ...]) -> None:
        self.instances = rows
        t = self.query_one("#co-instances", DataTable)
        t.clear()
        for i, x in enumerate(rows):
            alone = x.ranks < 2
            t.add_row(name_text(x.instance), right("–" if x.step is None else str(x.step)), right(str(x.ranks)),
                      right(fmt_seconds(x.max_dur_s)), right("–" if alone else fmt_seconds(x.max_wait_s), "bold"),
                      right("–" if alone else fmt_seconds(x.wait_s)),
                      right("–" if x.last_rank is None or alone else f"r{x.last_rank}"),
                      right("–" if x.busbw_gbps is None else f"{x.busbw_gbps:.0f}"), key=str(i))
        if self._want_instance is not None:
            for i, x in enumerate(rows):
                if x.instance == self._want_instance:
                    t.move_cursor(row=i)
                    break
            self._want_instance = None
