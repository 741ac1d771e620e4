"""The cross-rank critical path (diag/attribution/critical_path.py) on generated cases whose path is known by
construction: the straggler's, the data loader's, the 1F1B pipeline's."""

from __future__ import annotations

import gzip
import json
from contextlib import closing
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from helpers import shared_traces
from test_cases import Run, run_case

from diag.api import analyze_path
from diag.attribution import critical_path
from diag.attribution.what_if import CHANGES, Change, Retimer
from diag.engine.run import AnalyzeOptions
from diag.knowledge import kernels
from diag.outputs.report import path_line, render_text
from fixtures.generate import generate
from fixtures.scenarios import load_case


def _paths(run: Run) -> list[dict[str, Any]]:
    paths = run.report["critical_path"]
    assert paths, run.case
    return paths


@pytest.mark.parametrize("case", ["straggler", "dataloader", "pipeline_1f1b", "healthy"])
def test_the_path_is_contiguous_and_its_summary_adds_up(case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = run_case(case, tmp_path_factory)
    for p in _paths(run):
        segs = p["segments"]
        assert p["omitted"]["segments"] == 0 or len(segs) == 40
        if p["omitted"]["segments"] == 0:
            for a, b in zip(segs, segs[1:], strict=False):
                assert a["end_us"] == pytest.approx(b["start_us"], abs=1e-3)
            assert p["summary"]["length_us"] == pytest.approx(segs[-1]["end_us"] - segs[0]["start_us"], abs=1e-2)
        assert sum(p["summary"]["by_kind"].values()) == pytest.approx(1.0)
        assert sum(p["summary"]["by_rank"].values()) == pytest.approx(1.0)
        assert {s["kind"] for s in segs} <= {"compute", "comm", "wait", "copy", "idle", "host"}


def test_the_straggler_path_is_its_whole_step(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 5 computes 1.2× slower and every other rank waits for it in each all-reduce: the path
    is rank 5 from its step's start to its end, so the path's compute is rank 5's compute time."""
    run = run_case("straggler", tmp_path_factory)
    slow = load_case("straggler").straggler_rank
    states = run.analysis.run.states
    files = {r.file_id: r for r in run.analysis.run.ranks}
    for p in _paths(run):
        assert p["summary"]["by_rank"] == {str(slow): pytest.approx(1.0)}
        (fid, i), st = next(((k, st) for k, st in states.items()
                             if files[k[0]].rank == slow and st.step == p["step"]))
        assert p["summary"]["length_us"] == pytest.approx(st.window_ns / 1000, abs=0.01)
        compute = p["summary"]["by_kind"]["compute"] * p["summary"]["length_us"]
        assert compute == pytest.approx(st.compute_ns / 1000, abs=0.01)


def test_the_dataloader_path_starts_in_the_loader_wait(tmp_path_factory: pytest.TempPathFactory) -> None:
    run = run_case("dataloader", tmp_path_factory)
    loader_us = load_case("dataloader").loader_us
    for p in _paths(run):
        first = next(s for s in p["segments"] if s["end_us"] - s["start_us"] > 100)
        assert (first["kind"], first["what"]) == ("host", "dataloader")
        # The GPU idles for the loader's span less the little it still had to do of the step before.
        assert first["end_us"] - first["start_us"] == pytest.approx(loader_us, rel=0.05)


def test_the_pipeline_path_runs_down_and_up_the_stages(tmp_path_factory: pytest.TempPathFactory) -> None:
    """1F1B: the first micro-batch's forward crosses stages 0 → p−1 before anything else can end
    the step, and the last backward crosses p−1 → 0; the path enters each stage in that order."""
    run = run_case("pipeline_1f1b", tmp_path_factory)
    pp = load_case("pipeline_1f1b").pp
    for p in _paths(run):
        order: list[int] = []
        for s in p["segments"]:
            if not order or order[-1] != s["rank"]:
                order.append(s["rank"])
        assert order[:pp] == list(range(pp))
        assert order[-pp:] == list(reversed(range(pp)))
        joined = [s for s in p["segments"] if s["kind"] == "comm" and s["what"]]
        assert joined and all("p2p" in s["what"] for s in joined)


def test_the_store_keeps_every_segment(tmp_path: Path) -> None:
    """The report keeps the longest segments of a step; the `critical_path` table keeps them all."""
    generate("pipeline_1f1b", tmp_path / "traces")
    db = tmp_path / "run.duckdb"
    analysis, report = analyze_path(str(tmp_path / "traces"), str(db), AnalyzeOptions(), warn=False)
    with closing(duckdb.connect(str(db), read_only=True)) as con:
        rows = con.execute("SELECT step, count(*), sum(end_ns - start_ns), min(seq), max(seq) "
                           "FROM critical_path GROUP BY step ORDER BY step").fetchall()
    assert [r[0] for r in rows] == [p["step"] for p in report["critical_path"]]
    for (_, n, length, lo, hi), p in zip(rows, report["critical_path"], strict=True):
        assert n == len(p["segments"]) + p["omitted"]["segments"] and (lo, hi) == (0, n - 1)
        assert length / 1000 == pytest.approx(p["summary"]["length_us"])


def test_gpu_segments_are_named_after_what_ran_longest_in_them(tmp_path: Path) -> None:
    """A compute, copy or comm segment's `what` is the kernel (or copy) of that kind the step
    launched that overlaps it longest: checked by a sweep in Python over the store's activities."""
    generate("straggler", tmp_path / "traces")
    db = tmp_path / "run.duckdb"
    analyze_path(str(tmp_path / "traces"), str(db), AnalyzeOptions(), warn=False)
    with closing(duckdb.connect(str(db), read_only=True)) as con:
        segs = con.execute("""
            SELECT p.step, p.kind, p.start_ns - coalesce(o.offset_ns, 0), p.end_ns - coalesce(o.offset_ns, 0), p.what,
                   f.file_id
            FROM critical_path p JOIN trace_files f ON f.rank = p.rank
            LEFT JOIN clock_offsets o ON o.rank = p.rank
            WHERE p.kind IN ('compute', 'copy') OR (p.kind = 'comm' AND p.what NOT LIKE '%|%')""").fetchall()
        acts = con.execute("SELECT file_id, step, source, kclass, name, ts_ns, end_ns FROM activities").fetchall()
    assert segs
    def fits(kind: str, source: str, kclass: str) -> bool:
        return {"comm": kclass == "comm", "copy": source != "kernel"}.get(kind, source == "kernel" and kclass != "comm")

    for step, kind, a, b, what, fid in segs:
        overlap: dict[str, int] = {}
        for f, st, source, kclass, name, ts, end in acts:
            if f == fid and st == step and fits(kind, source, kclass) and ts < b and end > a:
                overlap[name] = max(overlap.get(name, 0), min(end, b) - max(ts, a))
        assert overlap, (step, kind)
        best = max(overlap.values())
        assert any(what == kernels.head(n).strip()[:100] and v == best for n, v in overlap.items()), (what, kind)


def test_the_straggler_what_if_lands_on_the_run_without_it(tmp_path: Path,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same run with rank 5 at the others' speed, generated and analyzed: the re-timed what-if
    lands within a point of its MFU (the bucket-removal estimate does not)."""
    run = run_case("straggler", tmp_path_factory)
    generate(load_case("straggler", straggler_slowdown=1.0), tmp_path)
    _, without = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    f = next(f for f in run.report["findings"] if f["code"] == "MFU005")
    assert f["what_if_mfu"] == pytest.approx(without["mfu"], abs=0.01)
    assert f["what_if_mfu_naive"] == pytest.approx(run.analysis.run.what_if(f["lost_fraction"]))
    assert abs(f["what_if_mfu_naive"] - without["mfu"]) > abs(f["what_if_mfu"] - without["mfu"])
    for other in run.report["findings"]:
        if other["code"] not in {*CHANGES, "MFU002"}:
            assert other["what_if_mfu"] == other["what_if_mfu_naive"]


def test_the_text_report_names_the_rank_and_kind_that_hold_the_path(tmp_path_factory: pytest.TempPathFactory) -> None:
    run = run_case("straggler", tmp_path_factory)
    slow = load_case("straggler").straggler_rank
    assert f"critical path: rank {slow} holds 100% of it, compute 98% (mean over 3 steps" in render_text(run.report)


def test_a_larger_slowdown_on_fewer_ranks_too(tmp_path: Path) -> None:
    """4 ranks, rank 2 at 1.4×: generated with and without the slowdown (measured: 43.6% vs 43.5%,
    the naive estimate 40.3%)."""
    mfu: dict[float, dict[str, Any]] = {}
    for slowdown in (1.4, 1.0):
        d = tmp_path / str(slowdown)
        generate(load_case("straggler", world_size=4, straggler_rank=2, straggler_slowdown=slowdown), d)
        mfu[slowdown] = analyze_path(str(d), None, AnalyzeOptions(model=str(d / "model.toml")), warn=False)[1]
    f = next(f for f in mfu[1.4]["findings"] if f["code"] == "MFU005")
    assert f["what_if_mfu"] == pytest.approx(mfu[1.0]["mfu"], abs=0.01)


def _analyzed(d: Path, **knobs: Any) -> dict[str, Any]:
    """The healthy case with `knobs`, generated into d and analyzed: its report."""
    generate(load_case("healthy", **knobs), d)
    return analyze_path(str(d), None, AnalyzeOptions(model=str(d / "model.toml")), warn=False)[1]


def _finding(report: dict[str, Any], code: str) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["code"] == code)


@pytest.mark.parametrize("case", ["straggler", "dataloader", "pipeline_1f1b", "exposed_comm"])
def test_no_change_re_times_to_the_measured_steps(case: str, tmp_path: Path) -> None:
    """The re-timer with nothing shortened gives every step its measured length back: a what-if
    moves only by what its cause saves."""
    generate(case, tmp_path / "t")
    db = tmp_path / "run.duckdb"
    analysis, report = analyze_path(str(tmp_path / "t"), str(db), AnalyzeOptions(model=str(tmp_path / "t" / "model.toml")),
                                    warn=False)
    with closing(duckdb.connect(str(db), read_only=True)) as con:
        graph = Retimer(con, analysis.run)
        assert all(graph.ratio(step, Change({}, {})) == 1.0 for step in graph.keys)
        assert graph.mfu(Change({}, {})) == pytest.approx(report["mfu"])


def test_two_slow_ranks_in_different_steps(tmp_path: Path) -> None:
    """Rank 5 computes 1.2× slower in the first step only, rank 2 in the second only: each step's
    path runs through its own slow rank, and the what-if (each step's slow rank at the median's
    speed) lands within a point of the healthy run."""
    report = _analyzed(tmp_path / "two", slow_ranks=((5, 1.2, 0), (2, 1.2, 1)))
    first, second = report["critical_path"][:2]
    assert first["summary"]["by_rank"] == {"5": pytest.approx(1.0)}
    assert second["summary"]["by_rank"] == {"2": pytest.approx(1.0)}
    f = _finding(report, "MFU005")
    assert sorted(f["ranks"]) == [2, 5]
    healthy = _analyzed(tmp_path / "healthy")
    assert f["what_if_mfu"] == pytest.approx(healthy["mfu"], abs=0.01)


def test_fixing_the_straggler_stops_at_the_next_slow_rank(tmp_path: Path) -> None:
    """Rank 5 at 1.3× and rank 2 at 1.1×: everyone waits for rank 5, so MFU005 names it alone. With
    rank 5 at the median's speed rank 2 holds the path: the re-timed what-if lands within a point of
    the run generated with only rank 2 slow (measured 48.6% vs 48.3%), below the naive estimate,
    which removes every wait (49.3%)."""
    report = _analyzed(tmp_path / "both", straggler_rank=5, straggler_slowdown=1.3, slow_ranks=((2, 1.1, None),))
    f = _finding(report, "MFU005")
    assert f["ranks"] == [5]
    second = _analyzed(tmp_path / "second", slow_ranks=((2, 1.1, None),))
    assert f["what_if_mfu"] == pytest.approx(second["mfu"], abs=0.01)
    assert f["what_if_mfu"] < f["what_if_mfu_naive"]
    assert abs(f["what_if_mfu"] - second["mfu"]) < abs(f["what_if_mfu_naive"] - second["mfu"])


def test_the_dataloader_what_if_lands_on_the_run_without_the_stall(tmp_path: Path,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every rank's GPU idles 2.7 ms under the loader; removed and re-timed, the step is the run
    generated with the healthy 20 µs loader, within a point (measured 53.0% vs 52.8%)."""
    run = run_case("dataloader", tmp_path_factory)
    f = _finding(run.report, "MFU006")
    without = _analyzed(tmp_path, loader_us=20)
    assert f["what_if_mfu"] == pytest.approx(without["mfu"], abs=0.01)


def test_hiding_transfers_off_the_path_gains_little(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The straggler run's exposed transfers are the waiting ranks' gradient buckets, queued behind
    the all-reduce that waits for rank 5; rank 5, which holds the path, has 15 µs of exposed
    transfer per step. Hidden, the step is that much shorter: the re-timed what-if gains under
    half a point where the naive estimate (the bucket's mean share over all ranks) gains about one."""
    run = run_case("straggler", tmp_path_factory)
    f = _finding(run.report, "MFU001")
    mfu = run.report["mfu"]
    assert f["what_if_mfu"] - mfu < 0.005 < f["what_if_mfu_naive"] - mfu


def test_the_exposed_comm_what_if_hides_the_lone_all_reduce(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One flat all-reduce after the backward pass, alone on every rank: hidden, each step is
    shorter by its transfer on every rank alike, so the re-timed what-if is the naive one (a
    quarter of the step) within a tenth of a point."""
    run = run_case("exposed_comm", tmp_path_factory)
    f = _finding(run.report, "MFU001")
    assert f["what_if_mfu"] == pytest.approx(f["what_if_mfu_naive"], abs=0.001)
    assert f["what_if_mfu"] > run.report["mfu"] + 0.1


@pytest.mark.parametrize("case", ["pipeline_bubble", "pipeline_1f1b"])
def test_a_bubble_at_its_floor_already_gains_little(case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """4 stages, 4 microbatches: the measured bubble is the schedule's (p−1)/(m+p−1) = 3/7 within
    two points, so with the bubble at that floor MFU gains under a point; the naive estimate,
    which removes the whole bubble, gains over twenty."""
    run = run_case(case, tmp_path_factory)
    f = _finding(run.report, "MFU002")
    assert f["details"]["theoretical_bubble"] == pytest.approx(3 / 7)
    mfu = run.report["mfu"]
    assert 0 <= f["what_if_mfu"] - mfu < 0.01
    assert f["what_if_mfu_naive"] - mfu > 0.2
    # By hand from the generator's own windows and bubble: each rank's time outside the bubble over
    # 1 − 3/7 (no longer than its window), the step as long as its longest rank.
    steps = [(r["rank"], s) for r in run.truth["ranks"] for s in r["steps"] if s["excluded"] is None]
    old: dict[int, int] = {}
    new: dict[int, float] = {}
    for _, s in steps:
        w = s["window_end_ns"] - s["window_start_ns"]
        at_floor = min(w, (w - s["ledger_s"]["pipeline_bubble"] * 1e9) / (1 - 3 / 7))
        old[s["step"]], new[s["step"]] = max(old.get(s["step"], 0), w), max(new.get(s["step"], 0.0), at_floor)
    by_hand = sum(s["model_flops"] / ((s["window_end_ns"] - s["window_start_ns"]) * new[s["step"]] / old[s["step"]]
                                      * 1e-9 * run.truth["peak_tflops"] * 1e12) for _, s in steps) / len(steps)
    assert f["what_if_mfu"] == pytest.approx(by_hand, abs=0.005)
    # Said as what it is: not the bubble gone, the bubble at the floor this p and m allow.
    assert f"→ MFU {f['what_if_mfu'] * 100:.1f}% with the bubble at its floor" in render_text(run.report)


# HTA's own critical-path test traces (one rank each) and the region its tests analyze.
HTA_CASES = [("simple_add", "measure|forward]"), ("alexnet", "measure|forward]"), ("cuda_event_sync", "ProfilerStep#")]


@pytest.mark.filterwarnings("ignore::Warning")   # HTA 0.5's own pandas deprecations, through the shim below
@pytest.mark.parametrize(("case", "region"), HTA_CASES)
def test_hta_single_rank_path_agrees(case: str, region: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HTA's critical path (hta.analyzers.critical_path_analysis) is a graph of one rank's CPU ops
    and GPU kernels; diag's is the GPU's state runs, a gap being `host` while the next kernel's
    launch call had not returned (or the loader ran), else `idle`. On one rank the two models meet
    in one figure: the share of the path where the GPU waited on the CPU (HTA: `cpu_bound` and
    `gpu_kernel_launch_overhead`; diag: `host` and `idle`). Over the region HTA's tests analyze
    (the first `measure|forward` annotation, or the ProfilerStep) they agree within 3 points
    (measured: 99.8 vs 98.2, 95.2 vs 93.4, 98.4 vs 98.4). And HTA's kernels on its path are kernels
    the GPU ran there, so their time is at most diag's compute on its path (measured 508 ≤ 5268,
    3249 ≤ 5280, 38 ≤ 49 µs): diag's path holds all GPU busy time, HTA's only the kernels no
    longer CPU work hides."""
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is not installed (pip install -e .[dev])")
    import pandas as pd
    from hta.trace_analysis import TraceAnalysis

    src = shared_traces() / "HolisticTraceAnalysis" / "tests" / "data" / "critical_path" / case
    trace = next(src.glob("*.json.gz"))
    # HTA 0.5 calls DataFrame.drop(axis=1, columns=...), which pandas 3 refuses; with `columns`
    # given the axis says nothing more.
    drop = pd.DataFrame.drop

    def drop_columns(self: pd.DataFrame, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("columns") is not None:
            kwargs.pop("axis", None)
        return drop(self, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "drop", drop_columns)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / trace.name).symlink_to(trace)
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    ann = next(e for e in events if e.get("cat") == "user_annotation" and region in e["name"])
    lo, hi = ann["ts"] * 1000, (ann["ts"] + ann["dur"]) * 1000

    graph, ok = TraceAnalysis(trace_dir=str(tmp_path / "t")).critical_path_analysis(
        rank=0, annotation=ann["name"], instance_id=0)
    assert ok
    hta = graph.get_critical_path_breakdown().groupby("bound_by")["duration"].sum()
    hta_cpu = (hta.get("cpu_bound", 0.0) + hta.get("gpu_kernel_launch_overhead", 0.0)) / hta.sum()

    db = tmp_path / "run.duckdb"
    analyze_path(str(tmp_path / "t"), str(db), AnalyzeOptions(), warn=False)
    with closing(duckdb.connect(str(db), read_only=True)) as con:
        us = dict(con.execute("SELECT kind, sum(least(end_ns, $hi) - greatest(start_ns, $lo)) / 1000 FROM critical_path "
                              "WHERE end_ns > $lo AND start_ns < $hi AND rank = 0 GROUP BY kind",
                              {"lo": lo, "hi": hi}).fetchall())
    diag_cpu = (us.get("host", 0.0) + us.get("idle", 0.0)) / sum(us.values())
    assert diag_cpu == pytest.approx(hta_cpu, abs=0.03)
    assert hta.get("gpu_compute_bound", 0.0) <= us.get("compute", 0.0)


def test_one_rank_without_collectives_re_times_its_loader_stall(tmp_path: Path) -> None:
    """A single rank matches no collective: the re-timer has no join to walk, and the loader's
    what-if is its step less the stall, within a point of the same rank generated without it."""
    report = _analyzed(tmp_path / "stall", world_size=1, loader_us=2700)
    f = _finding(report, "MFU006")
    without = _analyzed(tmp_path / "quick", world_size=1)
    assert f["what_if_mfu"] == pytest.approx(without["mfu"], abs=0.01)


def test_the_longest_overlap_sweep_agrees_with_every_pair() -> None:
    """critical_path._longest_in against the pairwise definition: per group, segments sorted by
    start (disjoint, as a path's are, and in some rounds overlapping) and activities in any
    overlap (nested, long ones spanning several segments, touching ends, none at all); the longest
    overlap wins, the first activity on a tie."""
    rng = np.random.default_rng(3)
    for round_ in range(200):
        seg_rows: list[tuple[int, int, int]] = []
        act_rows: list[tuple[int, int, int]] = []
        for g in range(int(rng.integers(1, 5))):
            t = int(rng.integers(0, 10**12))
            for _ in range(int(rng.integers(1, 6))):
                t += int(rng.integers(0, 5))
                length = int(rng.integers(1, 20))
                seg_rows.append((g, t, t + length))
                t += length if round_ % 2 == 0 else int(rng.integers(0, length + 1))
            lo, hi = seg_rows[-1][1] - 60, t + 5
            act_rows += [(g, s, s + int(rng.integers(0, 40))) for s in rng.integers(lo, hi, rng.integers(0, 8)).tolist()]
        act_rows.sort()
        sg, ss, se = (np.array([r[k] for r in seg_rows], np.int64) for k in range(3))
        ag, as_, ae = (np.array([r[k] for r in act_rows], np.int64).reshape(-1) for k in range(3))
        want = {}
        for j, (g, s, e) in enumerate(seg_rows):
            best = max(((min(e, b) - max(s, a), -i) for i, (h, a, b) in enumerate(act_rows) if h == g),
                       default=(0, 0))
            if best[0] > 0:
                want[j] = -best[1]
        seg, act = critical_path._longest_in(sg, ss, se, ag, as_, ae)
        assert dict(zip(seg.tolist(), act.tolist(), strict=True)) == want


def _as_rows(s: critical_path.Segments) -> list[tuple[Any, ...]]:
    return list(zip(s.rank.tolist(), s.kind.tolist(), s.start_ns.tolist(), s.end_ns.tolist(), s.what.tolist(),
                    strict=True))


def test_pieces_are_cut_at_the_data_loader_spans_as_one_at_a_time() -> None:
    """critical_path._in_loader (which cuts only the pieces some span overlaps, found by binary
    search) against _split run on every piece it may cut: spans overlapping, nested, touching,
    inside a piece or across several; pieces not to be cut left whole whatever they overlap. Empty
    pieces are set aside on both sides (_read drops them after)."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        t, rows, split = 0, [], []
        for _ in range(int(rng.integers(0, 12))):
            length = int(rng.integers(0, 30))
            rows.append((0, str(rng.choice(["compute", "idle", "host"])), t, t + length,
                         (None, "launch")[int(rng.integers(0, 2))]))
            split.append(bool(rng.integers(0, 2)))
            t += length
        starts = rng.integers(-5, t + 5, int(rng.integers(0, 5)))
        ds = np.array(starts, np.int64)
        de = ds + rng.integers(0, 40, len(ds))
        spans = sorted(zip(ds.tolist(), de.tolist(), strict=True))
        want = []
        for (rank, kind, a, b, what), cut in zip(rows, split, strict=True):
            if not cut:
                want.append((rank, kind, a, b, what))
                continue
            want += [(rank, "host" if inside else kind, x, y, "dataloader" if inside else what)
                     for x, y, inside in critical_path._split(a, b, spans)]
        pieces = critical_path.Segments.of([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                                           [r[3] for r in rows], [r[4] for r in rows])
        got = critical_path._in_loader(pieces, np.array(split, bool), ds, de)
        assert [r for r in _as_rows(got) if r[3] > r[2]] == [r for r in want if r[3] > r[2]]


def test_merging_and_clipping_agree_with_the_one_by_one_definitions() -> None:
    """_merge: adjacent segments of one rank, kind and what, end to start, as one (zero-length
    ones dropped first); _clipped: the runs back from the end until one ends by `a`, those starting
    before `b`, clipped to [a, b)."""
    rng = np.random.default_rng(8)
    for _ in range(300):
        t, rows = 0, []
        for _ in range(int(rng.integers(0, 15))):
            t += int(rng.integers(0, 2))
            length = int(rng.integers(0, 4))
            rows.append((int(rng.integers(0, 2)), str(rng.choice(["comm", "idle"])), t, t + length,
                         (None, "x")[int(rng.integers(0, 2))]))
            t += length
        segs = critical_path.Segments.of(*([r[k] for r in rows] for k in range(5)))
        merged: list[tuple[Any, ...]] = []
        for r in rows:
            if r[3] <= r[2]:
                continue
            p = merged[-1] if merged else None
            if p is not None and (p[0], p[1], p[4]) == (r[0], r[1], r[4]) and p[3] == r[2]:
                merged[-1] = (p[0], p[1], p[2], r[3], p[4])
            else:
                merged.append(r)
        assert _as_rows(critical_path._merge(segs)) == merged
        runs = [r for r in rows if r[3] > r[2]]
        a = int(rng.integers(-2, t + 2))
        b = a + int(rng.integers(0, 10))
        clipped = []
        for r in reversed(runs):
            if r[3] <= a:
                break
            if r[2] < b:
                clipped.append((r[0], r[1], max(r[2], a), min(r[3], b), r[4]))
        got = critical_path._clipped(critical_path.Segments.of(*([r[k] for r in runs] for k in range(5))), a, b)
        assert _as_rows(got) == clipped[::-1]


def test_the_path_line_means_the_steps_the_means_keep() -> None:
    """A step every rank left out (warm-up, teardown) is not in the line's mean, as it is not in the
    ledger's; one that some rank kept still is. HTA's MI250 capture read "idle 51% (mean over 2
    steps)" from an 86 µs stub in which nothing ran beside a 9.29 ms step."""
    def path(step: int, rank: str, kind: str) -> dict:  # type: ignore[type-arg]
        return {"step": step, "summary": {"by_rank": {rank: 1.0}, "by_kind": {kind: 1.0}}}

    report = {"ranks": [0], "critical_path": [path(1, "0", "host"), path(2, "0", "idle")],
              "steps_excluded": [{"rank": 0, "step": 2, "why": "teardown: nothing ran in the last step"}]}
    assert path_line(report) == "critical path: rank 0 holds 100% of it, host 100% (mean over 1 step; " \
                                "docs/critical_path.md)"
    report["ranks"] = [0, 1]   # rank 1 kept step 2: the path through it counts
    assert "host 50% (mean over 2 steps" in path_line(report)
