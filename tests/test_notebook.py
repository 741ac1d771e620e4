"""The notebook API (diag/notebook.py, issue 39): `import diag` stays cheap, docs/notebook.md's cells
run as written, and each table agrees with the report it sits beside, derived here on its own."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from helpers import ROOT, shared_traces

import diag
from diag.notebook import Run
from diag.outputs.report_types import Report

pytestmark = pytest.mark.xdist_group("notebook")


def test_import_diag_loads_no_engine() -> None:
    """`import diag` (and so `diag --help`) loads neither DuckDB, polars nor the engine: diag.open does."""
    code = ("import sys, diag; assert callable(diag.open); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('duckdb', 'polars', 'pyarrow', 'numpy') "
            "or m in ('diag.notebook', 'diag.engine.run')))")
    # callable(diag.open) imports the notebook module: ask before it, in a second process.
    bare = subprocess.run([sys.executable, "-c", "import sys, diag; print(sorted(m for m in sys.modules "
                           "if m.split('.')[0] in ('duckdb', 'polars', 'pyarrow', 'numpy') or m == 'diag.notebook'))"],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    assert bare.stdout.strip() == "[]", bare.stdout
    opened = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert "diag.notebook" in opened.stdout


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'opne'"):
        diag.opne  # type: ignore[attr-defined]  # noqa: B018


# A python cell, and the text block under it that shows what it printed (None: it prints nothing).
_CELL = re.compile(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```\n)?", re.S)


def test_the_notebook_page_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/notebook.md's cells, in order, in one namespace, from the repository's root (the page's
    paths are relative to it); the cells check their own figures against the report, and what each
    prints is the text the page shows under it (DIAG_UPDATE_GOLDEN=1 writes what they print now,
    to be reviewed as a diff)."""
    shared_traces()
    page = ROOT / "docs" / "notebook.md"
    text = page.read_text(encoding="utf-8")
    cells = list(_CELL.finditer(text))
    assert len(cells) >= 8
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {}
    printed = []
    for cell in cells:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(cell.group(1), "docs/notebook.md", "exec"), namespace)   # noqa: S102
        printed.append(buffer.getvalue())
    if os.environ.get("DIAG_UPDATE_GOLDEN"):
        parts, at = [], 0
        for cell, out in zip(cells, printed, strict=True):
            shown = f"\n```text\n{out}```\n" if out else ""
            parts += [text[at:cell.start()], f"```python\n{cell.group(1)}```\n{shown}"]
            at = cell.end()
        page.write_text("".join(parts) + text[at:], encoding="utf-8")
        return
    for n, (cell, out) in enumerate(zip(cells, printed, strict=True), 1):
        assert out == (cell.group(2) or ""), f"docs/notebook.md cell {n} printed other than the page shows"


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    path = shared_traces() / "HolisticTraceAnalysis/tests/data/trace_filter"
    with diag.open(path) as r:          # a Path, as a notebook has it
        yield r


def test_report_is_the_document_typed(run: Run) -> None:
    assert isinstance(run.report, Report)
    assert run.report.ranks == run.document["ranks"] == [0, 1]
    assert run.report.world_size == 128
    assert [f.code for f in run.report.findings] == [f["code"] for f in run.document["findings"]]


def test_ledger_is_rank_by_step_by_bucket(run: Run) -> None:
    led = run.ledger()
    assert led.columns == ["rank", "step", "bucket", "seconds", "fraction"]
    assert led.height == 2 * 2 * 12                     # 2 ranks × 2 steps × the twelve buckets
    # Each rank-step's fractions add to 1 (DESIGN.md: the buckets sum to the step).
    sums = led.group_by("rank", "step").agg(pl.col("fraction").sum())["fraction"]
    assert ((sums - 1).abs() < 0.01).all()
    # The report's ledger_by_rank is that rank's seconds in the bucket over its steps' seconds.
    windows = led.group_by("rank", "step").agg(pl.col("seconds").sum().alias("window"))
    for (rank, bucket), group in led.group_by("rank", "bucket"):
        total = float(windows.filter(pl.col("rank") == rank)["window"].sum())
        share = float(group["seconds"].sum()) / total
        assert share == pytest.approx(run.document["ledger_by_rank"][str(rank)][bucket], abs=1e-12)


def test_steps_windows_are_the_report_s(run: Run) -> None:
    st = run.steps()
    windows = sorted(st["window_ns"].to_list())
    spread = run.document["step_time_spread_s"]
    assert windows[0] * 1e-9 == pytest.approx(spread["min"]) and windows[-1] * 1e-9 == pytest.approx(spread["max"])
    assert st["in_means"].all()


def test_kernels_add_up_to_every_gpu_activity(run: Run) -> None:
    k = run.kernels()
    total_ns = run.con.execute("SELECT sum(end_ns - ts_ns), count(*) FROM activities").fetchall()[0]
    assert k["seconds"].sum() == pytest.approx(total_ns[0] * 1e-9) and k["calls"].sum() == total_ns[1]
    assert k["share"].sum() == pytest.approx(1.0)
    assert k["seconds"].is_sorted(descending=True)


def test_collectives_name_the_straggler_mfu005_names(run: Run) -> None:
    """MFU005's summary counts, per late rank, the collectives it arrived last in: the same count
    comes out of run.collectives() by hand."""
    c = run.collectives()
    late = c.filter(pl.col("rank") != pl.col("last_rank")).group_by("last_rank").agg(pl.col("instance").n_unique())
    counts = dict(late.iter_rows())
    summary = next(f.summary for f in run.report.findings if f.code == "MFU005")
    for rank, n in counts.items():
        assert f"rank {rank} (last to arrive in {n} collectives" in summary


def test_findings_follow_the_report(run: Run) -> None:
    f = run.findings()
    assert f["code"].to_list() == [x.code for x in run.report.findings]
    assert f["recoverable_fraction"].is_sorted(descending=True)


def test_critical_path_and_sql(run: Run) -> None:
    path = run.critical_path()
    assert set(path["kind"].unique()) <= {"compute", "comm", "wait", "copy", "idle", "host"}
    assert (path["dur_ns"] >= 0).all()
    n = run.sql("SELECT count(*) AS n FROM kernels WHERE rank = $rank", {"rank": 1})
    assert n["n"][0] == run.con.execute("SELECT count(*) FROM kernels WHERE rank = 1").fetchall()[0][0]


def test_open_reports_bad_input_as_the_cli_does(tmp_path: Path) -> None:
    from diag.runtime.errors import BadInput

    with pytest.raises(BadInput, match="no such file"):
        diag.open(tmp_path / "missing")


def test_text_is_analyze_s(run: Run) -> None:
    assert run.text().startswith("diag — where the step went\n2 of 128 ranks traced")
    assert "MFU unknown" in repr(run) and run._repr_markdown_().startswith("# diag report")
    assert os.fspath(run.path).endswith("trace_filter")
