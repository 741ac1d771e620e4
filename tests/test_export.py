"""`diag export --perfetto`: the output opened the way a user opens it, checked against the store
and the report: events per rank, the ledger track against ledger_by_rank, flows, cuts."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import load_json, run_diag, shared_traces

from diag.outputs.perfetto import parse_ranges
from diag.timeline.states import LANES
from fixtures.generate import generate

pytestmark = pytest.mark.xdist_group("export")

PHASES = {"X": {"name", "ts", "dur", "pid", "tid"}, "M": {"name", "pid", "args"}, "i": {"name", "ts", "pid", "tid"},
          "I": {"name", "ts", "pid", "tid"}, "C": {"name", "ts", "pid"}, "s": {"id", "ts", "pid", "tid"},
          "f": {"id", "ts", "pid", "tid"}, "t": {"id", "ts", "pid", "tid"}}


def check_chrome_trace(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The Chrome trace-event format's JSON object form, strictly: every event a known phase with its
    required fields, integer pid/tid, finite non-negative durations; flows paired."""
    assert set(doc) >= {"traceEvents"} and doc["displayTimeUnit"] in ("ms", "ns")
    events: list[dict[str, Any]] = doc["traceEvents"]
    flows: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
    for e in events:
        assert e["ph"] in PHASES, e
        assert PHASES[e["ph"]] <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], int | float) and e["dur"] >= 0, e
        if e["ph"] in "sf":
            flows[(e.get("cat", ""), e["id"])][e["ph"]] += 1
    assert all(c["s"] == 1 and c["f"] <= 1 for (cat, _), c in flows.items() if cat.startswith("diag")), "diag flows"
    return events


def export(src: Path, out: Path, *extra: str) -> tuple[dict[str, Any], str]:
    r = run_diag("export", str(src), "--perfetto", str(out), *extra)
    assert r.returncode == 0, r.stderr
    return load_json(out), r.stdout


def store_counts(db: Path) -> dict[int, int]:
    """Source events per rank in the store, counted independently of sql/export.sql."""
    con = duckdb.connect(str(db), read_only=True)
    n: Counter[int] = Counter()
    for table in ("cpu_ops", "runtime_calls", "kernels", "copies", "gpu_annotations", "flows"):
        n.update(dict(con.execute(f"SELECT rank, count(*) FROM {table} GROUP BY rank").fetchall()))
    n.update(dict(con.execute("SELECT rank, count(*) FROM other_events WHERE ph IN ('X','C','i','I') GROUP BY rank")
                  .fetchall()))
    con.close()
    return dict(n)


def ledger_identity(events: list[dict[str, Any]], report: dict[str, Any]) -> None:
    """Per rank: each step's ledger-lane time ÷ its window, averaged over steps as the report averages
    fractions, equals ledger_by_rank for every interval bucket within 1 point; the lanes tile the steps."""
    steps = [e for e in events if e.get("cat") == "diag.steps"]
    lanes = [e for e in events if e.get("cat") == "diag.ledger"]
    assert steps and lanes
    for rank, want in report["ledger_by_rank"].items():
        mine = [s for s in steps if s["pid"] == int(rank)]
        per_step: list[Counter[str]] = []
        for s in mine:
            lo, hi = s["ts"], s["ts"] + s["dur"]
            c: Counter[str] = Counter()
            for e in lanes:
                if e["pid"] == int(rank) and lo - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= hi + 1e-3:
                    c[e["name"]] += e["dur"] / s["dur"]
            assert sum(c.values()) == pytest.approx(1.0, abs=1e-3), (rank, s["name"])
            per_step.append(c)
        for b in LANES[1:]:
            got = sum(c[b] for c in per_step) / len(per_step)
            assert got == pytest.approx(want[b], abs=0.01), (rank, b)
        compute = sum(c["compute"] for c in per_step) / len(per_step)
        split = sum(want[b] for b in ("model_compute", "recompute", "thin_gemm", "gemm_inefficiency", "non_matmul"))
        assert compute == pytest.approx(split, abs=0.01), rank


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    generate("demo", out)
    return out


def test_demo_export_matches_store_and_report(demo: Path, tmp_path: Path) -> None:
    db = tmp_path / "run.duckdb"
    doc, stdout = export(demo, tmp_path / "demo.json.gz", "--db", str(db))
    assert "events" in stdout and "MB" in stdout
    events = check_chrome_trace(doc)
    r = run_diag("analyze", str(db), "--format", "json")
    report = json.loads(r.stdout)
    source = Counter(e["pid"] for e in events if e["ph"] != "M" and not str(e.get("cat", "")).startswith("diag."))
    assert dict(source) == store_counts(db)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[5] == "rank 5 (gpu-node-00, NVIDIA H100 80GB HBM3)" and len(names) == report["world_size"]
    assert doc["otherData"]["clock_offsets_us"] == report["clock_offsets_us"]
    ledger_identity(events, report)
    # The demo's straggler is rank 5: every wait arrow ends there, one per waiting rank and instance.
    ends = [e for e in events if e.get("cat") == "diag.wait" and e["ph"] == "f"]
    assert ends and {e["pid"] for e in ends} == {5}
    con = duckdb.connect(str(db), read_only=True)
    (n,) = con.execute("SELECT count(*) FROM collectives WHERE wait_ns > 10000 AND rank <> last_rank").fetchone() or (0,)
    con.close()
    assert len(ends) == n
    findings = {e["args"]["code"] for e in events if e.get("cat") == "diag.findings"}
    assert findings == {f["code"] for f in report["findings"] if f["ranks"]}
    path_track(events, db)


def path_track(events: list[dict[str, Any]], db: Path) -> None:
    """The critical-path track: per rank, the store's critical_path rows, each slice inside its
    rank's step slice (the step track is on the rank's own clock shifted by its offset, the path on
    the aligned clock: they meet only if the export converts it right), and in `seq` order each
    slice ends where the next begins, whatever rank it is on."""
    path = [e for e in events if e.get("cat") == "diag.critical_path"]
    con = duckdb.connect(str(db), read_only=True)
    rows = dict(con.execute("SELECT rank, count(*) FROM critical_path GROUP BY rank").fetchall())
    con.close()
    assert path and dict(Counter(e["pid"] for e in path)) == rows
    steps = {(e["pid"], int(e["name"].split()[1])): e for e in events if e.get("cat") == "diag.steps"}
    for e in path:
        s = steps[(e["pid"], e["args"]["step"])]
        assert s["ts"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3, e
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in path:
        by_step[e["args"]["step"]].append(e)
    for segs in by_step.values():
        segs.sort(key=lambda e: e["args"]["seq"])
        for a, b in zip(segs, segs[1:], strict=False):
            assert a["ts"] + a["dur"] == pytest.approx(b["ts"], abs=1e-3)


def test_cut_by_ranks_and_steps(demo: Path, tmp_path: Path) -> None:
    doc, _ = export(demo, tmp_path / "cut.json", "--ranks", "0-1,5", "--steps", "3")
    events = check_chrome_trace(doc)
    assert {e["pid"] for e in events} == {0, 1, 5}
    assert {e["name"] for e in events if e.get("cat") == "diag.steps"} == {"step 3"}


def test_bad_cut_is_one_line(demo: Path, tmp_path: Path) -> None:
    r = run_diag("export", str(demo), "--perfetto", str(tmp_path / "x.json"), "--ranks", "7-3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--ranks" in r.stderr


def test_parse_ranges() -> None:
    assert parse_ranges("0-3,64", "--ranks") == frozenset({0, 1, 2, 3, 64})


def test_real_trace_export(tmp_path: Path) -> None:
    src = shared_traces() / "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz"
    db = tmp_path / "real.duckdb"
    doc, _ = export(src, tmp_path / "real.json", "--db", str(db))
    events = check_chrome_trace(doc)
    report = json.loads(run_diag("analyze", str(db), "--format", "json").stdout)
    source = Counter(e["pid"] for e in events if e["ph"] != "M" and not str(e.get("cat", "")).startswith("diag."))
    assert dict(source) == store_counts(db)
    ledger_identity(events, report)


def test_hta_loads_the_export(demo: Path, tmp_path: Path) -> None:
    """HTA reads the merged file as one trace (rank 0, no distributedInfo): every slice of every rank's
    process is there, by category, but Kineto's own 'Trace' span, which HTA drops from any trace."""
    hta = pytest.importorskip("hta.trace_analysis", reason="HTA is in the dev extra")
    (tmp_path / "hta").mkdir()
    doc, _ = export(demo, tmp_path / "hta" / "demo.json")
    ta = hta.TraceAnalysis(trace_dir=str(tmp_path / "hta"), include_last_profiler_step=True)
    df = ta.t.get_trace(0)
    sym = ta.t.symbol_table.get_sym_table()
    got = Counter(zip(df["pid"].tolist(), (sym[c] for c in df["cat"].tolist()), strict=True))
    want = Counter((e["pid"], e.get("cat")) for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") != "Trace")
    assert got == want
    assert {c for _, c in got} >= {"kernel", "cpu_op", "cuda_runtime", "diag.ledger", "diag.steps"}


def test_a_track_per_process_group(tmp_path: Path) -> None:
    """moe_rotating: each rank's collectives on a track per group it belongs to, named with the group's
    dimension (the expert-parallel group first, then the default group carrying the gradients), one
    slice per call, as many as the store's collectives of that rank and group."""
    generate("moe_rotating", tmp_path / "run", steps=2)
    db = tmp_path / "run.duckdb"
    doc, _ = export(tmp_path / "run", tmp_path / "moe.json", "--db", str(db))
    events = check_chrome_trace(doc)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[(0, 6)] == "diag.pg 1 (ep, EXPERT_MODEL_PARALLEL_GROUP)"
    assert names[(5, 6)] == "diag.pg 2 (ep, EXPERT_MODEL_PARALLEL_GROUP)"
    assert names[(5, 7)] == "diag.pg 0 (dp, default_pg)"
    slices = Counter((e["pid"], e["args"]["pg"]) for e in events if e.get("cat") == "diag.pg")
    con = duckdb.connect(str(db), read_only=True)
    stored = dict(((r, pg), n) for r, pg, n in con.execute(
        "SELECT rank, pg_name, count(*) FROM collectives GROUP BY ALL").fetchall())
    con.close()
    assert dict(slices) == stored
