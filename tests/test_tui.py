"""The TUI on a generated trace: its queries, navigation driven by Pilot, and SVG snapshots.

The trace: 4 data-parallel ranks, 3 steps; rank 2 is 40% slow (a straggler the others wait for
in every gradient all-reduce), the all-reduce runs after the backward pass (exposed), and the
data loader stalls each step. It fires MFU006 (step evidence), MFU005 and MFU001 (collective
evidence). Snapshots: `pytest tests/test_tui.py --snapshot-update` after reviewing the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import re
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable
from textual.worker import WorkerCancelled

from diag.api import analyze_path
from diag.engine.run import AnalyzeOptions
from diag.ingest.options import IngestOptions
from diag.outputs import evidence
from diag.outputs.evidence import Place
from fixtures.generate import generate
from fixtures.scenarios import Scenario
from tui import queries
from tui.app import DiagApp
from tui.queries import CollectiveGroup, Spans
from tui.raster import rasterize
from tui.snapshot import Snapshot, link_for
from tui.sources import PostMortem, Progress, Store
from tui.views.collectives import Collectives, mesh_text
from tui.views.findings import Findings
from tui.views.help import HELP
from tui.views.ranks import NO_OUTLIER
from tui.views.timeline import Timeline
from tui.widgets.heatmap import Heatmap
from tui.widgets.lanes import LanesWidget, ruler

SCENARIO = Scenario(
    name="tui", world_size=4, steps=3, layers=2, straggler_rank=2, straggler_slowdown=1.4,
    grad_sync="after_backward", loader_us=400.0,
)
STRAGGLER = 2


@dataclasses.dataclass
class Loaded:
    """A source that was analyzed once for the whole module: every app below shows the same snapshot."""

    store: Store | None
    snapshot: Snapshot

    def load(self, progress: Progress) -> Snapshot:
        return self.snapshot


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    out = tmp_path_factory.mktemp("tui") / "trace"      # the top bar shows the name: keep it fixed
    generate(SCENARIO, out)
    source = PostMortem(str(out), None, AnalyzeOptions(), IngestOptions(jobs=1))
    snap = source.load(lambda text, frac: None)
    yield Loaded(source.store, snap)
    assert source.store is not None
    source.store.con.close()


def make_app(loaded: Loaded, theme: str = "textual-dark") -> DiagApp:
    app = DiagApp(loaded, theme=theme)
    app.animation_level = "none"
    return app


async def settle(pilot: Pilot[Any], timeout_s: float = 20.0) -> None:
    """Until the app is loaded and no worker runs, twice in a row: a query's result can start another."""
    app = pilot.app
    end = time.monotonic() + timeout_s
    quiet = 0
    while time.monotonic() < end:
        with contextlib.suppress(WorkerCancelled):     # a newer query replaced it: by design
            await app.workers.wait_for_complete()
        await pilot.pause(0)
        busy = any(w.is_running for w in app.workers) or not (isinstance(app, DiagApp) and app.snapshot)
        quiet = 0 if busy else quiet + 1
        if quiet >= 2:
            return
        if busy:
            await pilot.pause(0.01)
    raise AssertionError(f"the app was still working after {timeout_s} s")


def keys(*pressed: str) -> Callable[[Pilot[Any]], Any]:
    async def run(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        for k in pressed:
            await pilot.press(k)
            await settle(pilot)

    return run


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run a Pilot scenario as a plain test (no async plugin needed)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run


def finding_index(snap: Snapshot, code: str) -> int:
    assert snap.report is not None
    return next(i for i, f in enumerate(snap.report["findings"]) if f["code"] == code)


# --- queries (no terminal) ---------------------------------------------------------------------------


def test_heat_grid_shows_the_straggler(loaded: Loaded) -> None:
    heat = loaded.snapshot.heat
    assert heat is not None and heat.ranks == (0, 1, 2, 3) and len(heat.steps) == 3
    # Everyone waits for rank 2 but rank 2 itself: its row is the coolest of the straggler bucket.
    waits = heat.values["straggler"]
    assert all(waits[STRAGGLER, c] < min(waits[r, c] for r in (0, 1, 3)) for c in range(3))
    assert all(heat.value("step_time", r, c) for r in range(4) for c in range(3))


def test_collective_groups_add_up(loaded: Loaded) -> None:
    assert loaded.store is not None
    with loaded.store.reader() as cur:
        row = cur.execute("SELECT count(*), sum(end_ns - ts_ns) FROM collectives").fetchone()
    assert row is not None
    groups = loaded.snapshot.collectives
    assert sum(g.calls for g in groups) == row[0]
    assert sum(g.time_s for g in groups) == pytest.approx(row[1] * 1e-9)
    assert all(0 <= g.exposed_s <= g.time_s + 1e-12 and g.wait_s <= g.time_s for g in groups)
    dp = max(groups, key=lambda g: g.wait_s)
    assert dp.collective == "allreduce" and dp.last_rank == STRAGGLER and dp.last_count == dp.instances


def test_evidence_resolves_to_places(loaded: Loaded) -> None:
    report = loaded.snapshot.report
    assert report is not None and loaded.store is not None
    by_code = {f["code"]: f for f in report["findings"]}
    with loaded.store.reader() as cur:
        coll = evidence.resolve(cur, by_code["MFU005"]["evidence"][0])
        step = evidence.resolve(cur, by_code["MFU006"]["evidence"][0])
        kernel = evidence.resolve(cur, "act:1:0")
        first = cur.execute("SELECT name, rank FROM activities WHERE file_id = 1 ORDER BY rowid LIMIT 1").fetchone()
        missing = evidence.resolve(cur, "coll:no-such-instance")
    assert coll.collective_key in [g.key for g in loaded.snapshot.collectives]
    assert coll.rank == STRAGGLER and coll.step is not None and coll.ts_ns is not None
    assert step.rank is not None and step.step is not None and step.instance is None
    assert first is not None and kernel.rank == first[1] and first[0] in kernel.label
    assert missing.rank is None and "not found" in missing.label


def test_rasterize_is_exact_at_any_zoom() -> None:
    import numpy as np

    spans = Spans(np.array([0, 10, 30], np.int64), np.array([10, 30, 40], np.int64), ("a", "b", "a"))
    assert rasterize(spans, 0, 40, 4) == ["a", "b", "b", "a"]
    assert rasterize(spans, 0, 30, 2) == ["a", "b"]            # [0,15): a 10 µs, b 5; [15,30): b
    assert rasterize(spans, 50, 60, 3) == [None, None, None]
    assert rasterize(spans, 5, 15, 2) == ["a", "b"]


def test_outlier_names_the_straggler(loaded: Loaded) -> None:
    from tui.views.ranks import outlier, strongest_outlier

    heat = loaded.snapshot.heat
    assert heat is not None
    assert outlier(heat, "step_time") is None            # everyone waits for it: steps take as long
    best = strongest_outlier(heat)
    assert best is not None and best[:2] == ("straggler", STRAGGLER) and best[2] < best[3]


def test_rank_lists_read_as_runs() -> None:
    assert queries.fmt_ranks([15, 0, 1, 2, 3, 8, 10, 11, 12]) == "0–3, 8, 10–12, 15"
    assert queries.fmt_ranks(list(range(0, 100, 2)), limit=3) == "0, 2, 4 … (+47)"
    assert queries.fmt_ranks([]) == "–"


def test_links_by_host() -> None:
    def group(ranks: tuple[int, ...]) -> CollectiveGroup:
        return CollectiveGroup("0", None, "allreduce", 20, 1, 1, 1, 1, len(ranks), len(ranks), ranks,
                               1.0, 1.0, 0.0, 100.0, None, 0)

    nvlink = link_for(group((0, 1, 2, 3)), 8, 450.0)
    ib = link_for(group((0, 8)), 8, 450.0)
    assert nvlink is not None and nvlink.name == "NVLink" and nvlink.gbps == 450.0
    assert ib is not None and ib.name == "IB NDR" and ib.gbps == 50.0
    assert link_for(group((0, 1)), 8, None) is None          # the part's NVLink is unknown


# --- navigation ----------------------------------------------------------------------------------------


@sync
async def test_finding_jumps_to_its_collective_then_the_timeline(loaded: Loaded) -> None:
    app = make_app(loaded)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        idx = finding_index(loaded.snapshot, "MFU005")
        await keys("2", *(["down"] * idx), "enter", "enter")(pilot)
        assert app.current == "collectives"
        view = app.query_one(Collectives)
        table = view.query_one("#co-instances", DataTable)
        assert loaded.snapshot.report is not None
        evidence = loaded.snapshot.report["findings"][idx]["evidence"][0]
        chosen = view.instances[table.cursor_row]
        assert f"coll:{chosen.instance}" == evidence
        await keys("enter")(pilot)
        assert app.current == "timeline"
        tl = app.query_one(Timeline)
        lanes = app.query_one(LanesWidget)
        assert tl.step == chosen.step and lanes.rank == STRAGGLER == chosen.last_rank
        assert chosen.aligned_ts_ns is not None and chosen.aligned_end_ns is not None
        assert chosen.aligned_ts_ns <= lanes.cursor_ns <= chosen.aligned_end_ns
        await keys("escape")(pilot)
        assert app.current == "collectives"


@sync
async def test_step_evidence_opens_that_rank_step(loaded: Loaded) -> None:
    app = make_app(loaded)
    async with app.run_test(size=(120, 40)) as pilot:
        idx = finding_index(loaded.snapshot, "MFU006")
        await keys("2")(pilot)
        app.query_one(Findings).select(idx)
        await keys("g")(pilot)
        assert loaded.snapshot.report is not None
        _, rank, step = loaded.snapshot.report["findings"][idx]["evidence"][0].split(":")
        assert app.current == "timeline"
        assert (app.query_one(Timeline).step, app.query_one(LanesWidget).rank) == (int(step), int(rank))


@sync
async def test_heatmap_cell_opens_the_rank_step(loaded: Loaded) -> None:
    app = make_app(loaded)
    async with app.run_test(size=(80, 24)) as pilot:
        await keys("3", "right", "down", "down")(pilot)
        heat = app.query_one(Heatmap)
        assert heat.grid is not None
        rank, step = heat.grid.ranks[2], heat.grid.steps[1]
        await keys("m")(pilot)
        assert heat.metric != "step_time"
        await keys("enter")(pilot)
        assert app.current == "timeline"
        assert (app.query_one(Timeline).step, app.query_one(LanesWidget).rank) == (step, rank)


@sync
async def test_kernel_evidence_puts_the_cursor_on_it(loaded: Loaded) -> None:
    app = make_app(loaded)
    assert loaded.store is not None
    with loaded.store.reader() as cur:
        # The longest GEMM of rank 1: act ids count a file's activities in the order they were written.
        idx = cur.execute(
            "SELECT i, name FROM (SELECT rowid - min(rowid) OVER () AS i, * FROM activities WHERE file_id = 2) "
            "WHERE kclass = 'gemm' ORDER BY end_ns - ts_ns DESC LIMIT 1"
        ).fetchone()
        assert idx is not None
        place = evidence.resolve(cur, f"act:2:{idx[0]}")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        from tui.views.base import Jump

        app.post_message(Jump("timeline", place))
        await settle(pilot)
        lanes = app.query_one(LanesWidget)
        assert lanes.rank == place.rank and app.query_one(Timeline).step == place.step
        under = app.query_one("#tl-under", DataTable)
        col = under.get_column_index("kernel")
        names = [str(under.get_row_at(i)[col]) for i in range(under.row_count)]
        assert idx[1] in names


@sync
async def test_timeline_keys_zoom_pan_and_step(loaded: Loaded) -> None:
    app = make_app(loaded)
    async with app.run_test(size=(80, 24)) as pilot:
        await keys("4")(pilot)
        lanes = app.query_one(LanesWidget)
        full = lanes.view[1] - lanes.view[0]
        await keys("right", "right", "plus", "plus")(pilot)
        assert lanes.view[1] - lanes.view[0] == pytest.approx(full / 4)
        at = lanes.cursor_ns
        await keys("shift+right")(pilot)
        assert lanes.cursor_ns > at
        await keys("0")(pilot)
        assert lanes.view[1] - lanes.view[0] == pytest.approx(full)
        heat = loaded.snapshot.heat
        assert heat is not None
        await keys("right_square_bracket")(pilot)
        assert app.query_one(Timeline).step == heat.steps[1]
        await keys("down")(pilot)
        assert lanes.rank == heat.ranks[1]


@sync
async def test_timeline_highlights_the_critical_path(loaded: Loaded) -> None:
    """`p` on the timeline: the step's path (rank 2, the straggler, from its loader wait on) keeps
    its colours and its idle time shows as a line; every other GPU lane dims. `p` again restores."""
    app = make_app(loaded)
    async with app.run_test(size=(120, 40)) as pilot:
        await keys("4")(pilot)
        lanes = app.query_one(LanesWidget)
        assert lanes.data is not None and lanes.data.path
        assert set(lanes.data.path) == {STRAGGLER}

        def gpu_rows() -> dict[int, list[Any]]:
            assert lanes.data is not None
            return {rank: list(lanes.render_line(2 + 2 * i)) for i, rank in enumerate(lanes.data.ranks)}

        def plot(segs: list[Any]) -> list[Any]:   # the lane after its label, without the cursor column
            return [s for s in segs[1:] if s.text != "┃" and s.text.strip()]

        before = gpu_rows()
        assert not any(s.style and s.style.dim for segs in before.values() for s in plot(segs))
        await keys("p")(pilot)
        assert lanes.show_path
        after = gpu_rows()
        for rank, segs in after.items():
            dims = [bool(s.style and s.style.dim) for s in plot(segs)]
            if rank == STRAGGLER:
                assert not all(dims) and "━" in "".join(s.text for s in segs)
            else:
                assert all(dims)
        await keys("p")(pilot)
        assert gpu_rows() == before


@sync
async def test_overview_names_what_holds_the_critical_path(loaded: Loaded) -> None:
    """The Overview's path line is the text report's (diag.outputs.report.path_line), here rank 2's."""
    from textual.widgets import Static

    from diag.outputs.report import path_line

    app = make_app(loaded)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        report = loaded.snapshot.report
        assert report is not None
        text = str(app.query_one("#ov-path", Static).render())
        assert text == path_line(report) and text.startswith(f"critical path: rank {STRAGGLER} holds")


@sync
async def test_mouse_switches_views_and_opens_a_cell(loaded: Loaded) -> None:
    from tui.app import nav_text

    app = make_app(loaded)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.click("#nav", offset=(nav_text("overview").plain.index("3 Ranks") + 2, 0))
        await settle(pilot)
        assert app.current == "ranks"
        heat = app.query_one(Heatmap)
        # Row 1 of the widget is rank index 0; columns start after the rank labels.
        cell = (7 + 8 + 2, 1 + 3)                # step index 1, rank index 3
        await pilot.click(Heatmap, offset=cell)
        await settle(pilot)
        assert (heat.row, heat.col) == (3, 1) and app.current == "ranks"
        await pilot.click(Heatmap, offset=cell)   # a second click on the selected cell opens it
        await settle(pilot)
        assert heat.grid is not None and app.current == "timeline"
        assert (app.query_one(Timeline).step, app.query_one(LanesWidget).rank) == (heat.grid.steps[1], heat.grid.ranks[3])
        await pilot.press("question_mark")
        assert app.screen.__class__.__name__ == "Help"
        await pilot.press("escape")
        assert app.screen.__class__.__name__ != "Help" and app.current == "timeline"


# --- snapshots (review the SVGs before --snapshot-update) --------------------------------------------------


@pytest.mark.parametrize(
    ("size", "pressed"),
    [
        pytest.param((120, 40), (), id="overview-120x40"),
        pytest.param((80, 24), (), id="overview-80x24"),
        pytest.param((120, 40), ("2",), id="findings-120x40"),
        pytest.param((120, 40), ("3", "down", "down"), id="ranks-120x40"),
        pytest.param((120, 40), ("4", "right", "right", "right"), id="timeline-120x40"),
        pytest.param((80, 24), ("4", "plus"), id="timeline-80x24"),
        pytest.param((120, 40), ("4", "p"), id="timeline-path-120x40"),
        pytest.param((120, 40), ("5",), id="collectives-120x40"),
        pytest.param((80, 24), ("question_mark",), id="help-80x24"),
    ],
)
def test_screens(snap_compare: Any, loaded: Loaded, size: tuple[int, int], pressed: tuple[str, ...]) -> None:
    assert snap_compare(make_app(loaded), terminal_size=size, run_before=keys(*pressed))


def test_light_theme(snap_compare: Any, loaded: Loaded) -> None:
    assert snap_compare(make_app(loaded, theme="textual-light"), terminal_size=(120, 40),
                        run_before=keys("3", "s"))


def test_places_default_to_no_jump() -> None:
    from tui.views.findings import target_of

    assert target_of(Place("nothing")) is None
    assert target_of(Place("x", rank=1, step=2)) == "timeline"
    assert target_of(Place("x", rank=1, step=2, instance="i")) == "collectives"



# --- rough edges a stranger hits (issue 39) ----------------------------------------------------------


@sync
async def test_enter_on_the_overview_opens_the_top_finding(loaded: Loaded) -> None:
    """The Overview's findings table has the focus from the start: enter opens the first finding
    without a tab first."""
    app = make_app(loaded)
    async with app.run_test(size=(120, 40)) as pilot:
        await keys("enter")(pilot)
        assert app.current == "findings"


@sync
async def test_outlier_key_says_when_no_rank_stands_out(loaded: Loaded) -> None:
    """`o` on a grid where no rank stands out leaves the metric as it is and says why, instead of
    nothing at all; `?` lists the key."""
    app = make_app(loaded)
    async with app.run_test(size=(120, 40)) as pilot:
        await keys("3")(pilot)
        heat = app.query_one(Heatmap)
        assert heat.grid is not None
        flat = dataclasses.replace(heat.grid, values={m: np.ones_like(v) for m, v in heat.grid.values.items()})
        heat.grid = flat
        before = heat.metric
        await keys("o")(pilot)
        assert heat.metric == before
        assert [n.message for n in app._notifications] == [NO_OUTLIER]
    assert "`o` the rank that stands out most" in HELP


def test_a_ruler_label_is_never_cut_by_the_cursor() -> None:
    """The timeline's ruler draws the cursor ▼ where a label would be: the label is left out whole
    (its tick stays), never drawn around the cursor ("1▼5" for 125)."""
    whole = ruler((0.0, 100e6), 0.0, 80, 79)
    labels = re.findall(r"╵(\d+)", whole)
    assert labels == ["20", "40", "60", "80"]        # ticks every 20 ms on 80 columns
    for cursor in range(79):
        text = ruler((0.0, 100e6), 0.0, 80, cursor)
        assert len(text) == 80 and text[cursor] == "▼" and text.count("▼") == 1
        shown = re.findall(r"╵(\d+)(?=[ ╵▼]|$)", text)
        assert set(shown) <= set(labels), (cursor, text)      # each label whole or absent
        assert len(shown) >= len(labels) - 1
def test_the_mesh_heads_the_collectives_beyond_data_parallel(loaded: Loaded, tmp_path: Path) -> None:
    """A data-parallel run shows no mesh lines (the group table says it all); tensor parallelism
    across hosts does, one line per kind of group, its link and MFU001's points for its dimension."""
    assert mesh_text(loaded.snapshot.report) is None
    generate("tp_across_hosts", tmp_path, steps=2)
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    text = mesh_text(report)
    assert text is not None
    lines = text.plain.splitlines()
    assert lines[0] == "mesh dp 2 × tp 8 · sharding none"
    pts = next(f for f in report["findings"] if f["code"] == "MFU001")["details"]["by_dim"]["tp"] * 100
    assert lines[1].split() == ["tp", "TENSOR_MODEL_PARALLEL_GROUP", "2", "×", "8", "2", "host(s)", "network",
                                f"{pts:.1f}", "pts", "exposed"]
