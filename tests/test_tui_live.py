"""`diag live`: trace files land in a directory while the app runs; the views follow.

Rank 0 arrives as torch writes a `.json` (to a temporary name, then renamed); rank 1 as a
`.json.gz` written in place in three pieces, as torch writes one: visible, and unreadable, until
its last byte. Every wait polls to a deadline; nothing relies on a fixed pause being long enough.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Static

from diag.engine.run import AnalyzeOptions
from diag.ingest.options import IngestOptions
from fixtures.generate import generate
from fixtures.scenarios import Scenario
from tui.app import DiagApp
from tui.sources import Live
from tui.views.timeline import Timeline
from tui.widgets.heatmap import Heatmap
from tui.widgets.lanes import LanesWidget

SCENARIO = Scenario(name="live", world_size=2, steps=2, layers=2, naming="tensorboard")
DEADLINE_S = 15.0


async def until(pilot: Pilot[Any], what: str, cond: Callable[[], bool], timeout_s: float = DEADLINE_S,
                during: Callable[[], None] | None = None) -> None:
    """Poll `cond` until it holds; `during` is checked on every poll while waiting."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if during is not None:
            during()
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for: {what}")


def test_live_follows_a_run(tmp_path: Path) -> None:
    plain, packed, watched = tmp_path / "plain", tmp_path / "packed", tmp_path / "run"
    generate(SCENARIO, plain)
    generate(SCENARIO, packed, gzip=True)
    watched.mkdir()
    first = sorted(plain.glob("*.pt.trace.json"))[0]
    second = sorted(packed.glob("*.pt.trace.json.gz"))[1]
    source = Live(str(watched), None, AnalyzeOptions(), IngestOptions(), idle_s=1.5)
    assert not source.ingest_opts.checkpoint_last   # each poll ingests: DuckDB checkpoints when it will
    app = DiagApp(source, poll_s=0.1)
    app.animation_level = "none"
    asyncio.run(_follow(app, source, first, second, watched))


async def _follow(app: DiagApp, source: Live, first: Path, second: Path, watched: Path) -> None:
    def ranks() -> tuple[int, ...]:
        snap = app.snapshot
        return () if snap is None or snap.heat is None else snap.heat.ranks

    def ingested() -> int:
        with source.store.reader() as cur:
            row = cur.execute("SELECT count(*) FROM trace_files").fetchone()
        return int(row[0]) if row else 0

    def pending() -> tuple[int, str] | None:
        snap = app.snapshot
        if snap is None or snap.live is None:
            return None
        return next(((p.size_bytes, p.reason) for p in snap.live.pending if p.path.endswith(second.name)), None)

    def status() -> str:
        return str(app.query_one("#status", Static).content)

    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, "the live status", lambda: app.snapshot is not None and app.snapshot.live is not None)

        # Rank 0: written under a temporary name, then renamed into place.
        tmp = watched / (first.name + ".tmp")
        tmp.write_bytes(first.read_bytes())
        os.rename(tmp, watched / first.name)
        landed = time.monotonic()
        await until(pilot, "rank 0 in the views", lambda: ranks() == (0,))
        print(f"rank 0 on screen {time.monotonic() - landed:.2f} s after it landed")
        assert app.current == "overview" and "1/2 ranks" in status()
        assert "MFU" in str(app.query_one("#ov-head", Static).content)

        # Rank 1: a gzip stream written in place, piece by piece.
        data = second.read_bytes()
        cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
        with open(watched / second.name, "wb") as f:
            for i in range(3):
                f.write(data[cut[i]:cut[i + 1]])
                f.flush()
                if i == 2:
                    break
                # Seen, waited for, then read at this size and found truncated: never ingested, never an error.
                await until(pilot, f"piece {i + 1} read and refused as truncated", _refused(pending, cut[i + 1]),
                            during=lambda: _never(ingested() > 1 or 1 in ranks(), "the partial file was ingested"))
                assert "arriving" in status()
            landed = time.monotonic()
        await until(pilot, "rank 1 in the views", lambda: ranks() == (0, 1))
        print(f"rank 1 on screen {time.monotonic() - landed:.2f} s after its last byte")
        assert pending() is None and "2/2 ranks" in status()

        # Every screen shows both ranks: the heatmap rows, the timeline lanes.
        await pilot.press("3")
        await until(pilot, "heatmap rows", lambda: (g := app.query_one(Heatmap).grid) is not None and g.ranks == (0, 1))
        await pilot.press("4")
        await until(pilot, "timeline lanes",
                    lambda: (d := app.query_one(LanesWidget).data) is not None and d.ranks == (0, 1))
        assert app.query_one(Timeline).step is not None

        # No file changes for the idle time: the run has ended, the same screens stay (post-mortem).
        await until(pilot, "the run to count as ended", lambda: "run ended" in status())
        assert ranks() == (0, 1) and app.current == "timeline"


def _refused(pending: Callable[[], tuple[int, str] | None], size: int) -> Callable[[], bool]:
    """The file was read at `size` bytes and refused as truncated."""

    def check() -> bool:
        p = pending()
        return p is not None and p[0] == size and "truncated" in p[1]

    return check


def _never(happened: bool, what: str) -> None:
    assert not happened, what
