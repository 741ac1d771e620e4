"""Every generated case against the generator's truth (fixtures/, computed from its own
construction): step windows, the GPU-state sweep, FLOPs, collective matching and waits, clock
offsets, the ledger within 2 points per bucket, and the findings expected.yml lists."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import unexplained_buckets

from diag.api import analyze_path
from diag.attribution.ledger import BUCKETS
from diag.engine.run import Analysis, AnalyzeOptions
from diag.outputs.consistency import contradictions
from diag.outputs.report import render_text
from diag.timeline.pipeline_schedules import TIMED
from fixtures.generate import generate
from fixtures.scenarios import load_case
from rules.MFU013_idle import Idle
from rules.MFU013_idle import Params as IdleParams

CASES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "cases"
CASES = sorted(p.name for p in CASES_DIR.iterdir() if (p / "expected.yml").exists())
PIPELINED = [c for c in CASES if load_case(c).pp > 1]


@dataclass
class Run:
    case: str
    expected: dict[str, Any]
    truth: dict[str, Any]
    analysis: Analysis
    report: dict[str, Any]


def _options(case_dir: Path, trace_dir: Path) -> AnalyzeOptions:
    """The analyze flags case.yml gives, as options (paths relative to the trace directory)."""
    args = (yaml.safe_load((case_dir / "case.yml").read_text()).get("analyze") or {}).get("args") or []
    flags = dict(zip(args[::2], args[1::2], strict=True))
    return AnalyzeOptions(
        model=str(trace_dir / flags["--model"]) if "--model" in flags else None,
        gpu=flags.get("--gpu"),
        peak_tflops=float(flags["--peak-tflops"]) if "--peak-tflops" in flags else None,
    )


_runs: dict[str, Run] = {}


def run_case(case: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    if case not in _runs:
        d = tmp_path_factory.mktemp(case)
        generate(case, d)
        analysis, report = analyze_path(str(d), None, _options(CASES_DIR / case, d), warn=False)
        _runs[case] = Run(case, yaml.safe_load((CASES_DIR / case / "expected.yml").read_text()),
                          json.loads((d / "truth.json").read_text()), analysis, report)
    return _runs[case]


@pytest.fixture(params=CASES)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_case(request.param, tmp_path_factory)


def truth_steps(run: Run, excluded: bool = False) -> list[tuple[int, dict[str, Any]]]:
    """(rank, step) of the truth: the steps analyzed, or with `excluded` also the warm-up and teardown steps."""
    return [(r["rank"], s) for r in run.truth["ranks"] for s in r["steps"] if excluded or s["excluded"] is None]


def test_warmup_and_teardown_steps_are_excluded_and_no_other(run: Run) -> None:
    """Exactly the steps the generator made outliers by construction are left out, with their reason."""
    want = [(rank, s["profiler_step"], s["excluded"]) for rank, s in truth_steps(run, excluded=True) if s["excluded"]]
    got = [(e["rank"], e["step"], e["why"].split(":")[0]) for e in run.report["steps_excluded"]]
    assert sorted(got) == sorted(want)
    assert run.report["steps"] == len({s["profiler_step"] for _, s in truth_steps(run)})


def test_the_report_holds_together(run: Run) -> None:
    """Issue 39: no part of the report contradicts another (diag/outputs/consistency.py)."""
    assert contradictions(run.report, run.analysis) == [], run.case


def test_workload(run: Run) -> None:
    assert run.report["workload"] == run.truth["workload"]
    if run.truth["workload"] == "inference":
        assert "inference" in render_text(run.report).splitlines()[1]
        advice = " ".join(f["advice"] for f in run.report["findings"])
        assert not any(k in advice for k in ("bucket_cap_mb", "AdamW", "gradient accumulation", "recomput"))


def test_expected_findings(run: Run) -> None:
    codes = [f["code"] for f in run.report["findings"]]
    for code in run.expected.get("must_fire") or []:
        assert code in codes, f"{run.case}: {code} should fire; got {codes}"
    for code in run.expected.get("must_not_fire") or []:
        assert code not in codes, f"{run.case}: {code} should not fire; got {codes}"
    top = run.expected.get("top_finding")
    if top:
        assert codes and codes[0] == top, f"{run.case}: top finding {codes[:1]}, expected {top}"
    else:  # a healthy case raises no cause finding over 5 points
        assert all(f["mfu_points"] <= 5 for f in run.report["findings"] if f["code"] in CAUSES), codes


def test_expected_parallelism(run: Run) -> None:
    """The mesh expected.yml states (the generator's layout): each dimension's degree, the dimension
    MFU001's by_dim names first, the dimensions whose groups span hosts; and MFU005's pattern."""
    want = run.expected.get("parallelism")
    if want:
        got = run.report["parallelism"]
        assert got["dims"] == want["dims"], run.case
        assert set(got["certain"]) == set(want["dims"]), run.case   # every rank's pg_config lists its groups
        by_dim = next(f["details"]["by_dim"] for f in run.report["findings"] if f["code"] == "MFU001")
        assert next(iter(by_dim)) == want["by_dim_top"], by_dim
        assert sorted({g["dim"] for g in got["groups"] if (g["hosts"] or 0) > 1} & {"tp", "cp", "ep"}) == \
            want["spanning"]
        assert got["sharding"] == want.get("sharding", "none"), run.case
    pattern = run.expected.get("straggler_pattern")
    if pattern:
        late = next(f for f in run.report["findings"] if f["code"] == "MFU005")
        assert late["details"]["pattern"] == pattern, late["details"]["late_by_step"]


# The rules that name a cause of lost time outside the compute kernels' own speed.
CAUSES = ("MFU001", "MFU002", "MFU003", "MFU004", "MFU005", "MFU006")


def test_expected_bucket_shares(run: Run) -> None:
    """The bucket each case is built around holds the share expected.yml states, and the finding
    that explains it says so: its lost_fraction is that bucket's share."""
    tol = run.expected.get("tolerance_points", 2) / 100
    for bucket, (code, share) in (run.expected.get("bucket_share") or {}).items():
        assert run.report["ledger"][bucket] == pytest.approx(share, abs=tol), (run.case, bucket)
        found = [f for f in run.report["findings"] if f["code"] == code]
        assert found and found[0]["bucket"] == bucket, (run.case, code)
        assert found[0]["lost_fraction"] == pytest.approx(run.report["ledger"][bucket], rel=1e-9)


def test_every_large_bucket_is_explained(run: Run) -> None:
    """DESIGN.md's invariant: every bucket but model_compute holding ≥ 5 points of the step has
    findings naming it whose lost_fraction sums to at least half of it."""
    assert unexplained_buckets(run.report) == {}, run.case


def test_findings_carry_bucket_and_recoverable_and_are_ranked(run: Run) -> None:
    findings = run.report["findings"]
    for f in findings:
        assert f["bucket"] is None or f["bucket"] in BUCKETS
        assert 0 <= f["recoverable_fraction"] <= f["lost_fraction"] + 1e-12 or f["code"] == "MFU007"
    keys = [f["recoverable_fraction"] for f in findings]
    assert keys == sorted(keys, reverse=True)


def test_ledger_matches_truth_per_rank_and_step(run: Run) -> None:
    tol = run.expected.get("tolerance_points", 2) / 100
    ours = {(lg.rank, lg.step): lg.fractions() for lg in run.analysis.run.ledgers}
    assert len(ours) == len(truth_steps(run))
    for rank, s in truth_steps(run):
        mine = ours[(rank, s["profiler_step"])]
        for b in BUCKETS:
            assert mine[b] == pytest.approx(s["ledger_fraction"][b], abs=tol), (run.case, rank, s["step"], b)


def test_ledger_sums_to_the_step(run: Run) -> None:
    for lg in run.analysis.run.ledgers:
        assert sum(lg.buckets.values()) == pytest.approx(lg.window_s, rel=1e-9, abs=1e-12)
        assert all(v >= 0 for v in lg.buckets.values())
    assert sum(run.report["ledger"].values()) == pytest.approx(1.0, abs=0.01)


def test_mfu_and_hfu_match_truth(run: Run) -> None:
    assert run.report["mfu"] == pytest.approx(run.truth["mfu"], abs=1e-4)
    assert run.report["hfu"] == pytest.approx(run.truth["hfu"], abs=1e-4)


def test_step_windows_and_state_sweep(run: Run) -> None:
    by_rank = {r.rank: r for r in run.analysis.run.ranks}
    states = run.analysis.run.states
    for rank, s in truth_steps(run, excluded=True):
        tl = by_rank[rank]
        i = tl.steps.step.index(s["profiler_step"])
        assert (int(tl.steps.start_ns[i]), int(tl.steps.end_ns[i])) == (s["window_start_ns"], s["window_end_ns"])
        if s["excluded"]:
            assert (tl.file_id, i) not in states
            continue
        st = states[(tl.file_id, i)]
        assert {"compute": st.compute_ns, "comm": st.comm_ns, "copy": st.copy_ns, "idle": st.idle_ns} == s["state_ns"]


def test_flops(run: Run) -> None:
    by_rank = {r.rank: r for r in run.analysis.run.ranks}
    for rank, s in truth_steps(run):
        tl = by_rank[rank]
        st = run.analysis.run.states[(tl.file_id, tl.steps.step.index(s["profiler_step"]))]
        # Executed FLOPs follow torch.utils.flop_counter, which counts flash attention's backward as
        # 5 matmuls (it recomputes QKᵀ) where the model's 6N+12LHQT convention counts 4.
        assert s["executed_flops"] <= st.exec_flops <= 1.1 * s["executed_flops"]
        assert st.recompute_flops == pytest.approx(s["recompute_flops"], rel=1e-9)
        assert st.model_flops == pytest.approx(s["model_flops"], rel=1e-9)


def test_collective_matching_waits_and_last_rank(run: Run) -> None:
    matched = {(m.call.pg_name, m.call.seq, m.call.rank): m for m in run.analysis.run.matched}
    for c in run.truth["collectives"]:
        for rank in c["ranks"]:
            m = matched[(c["pg_name"], c["seq"], rank)]
            assert m.n_matched == len(c["ranks"])
            assert m.wait_ns == pytest.approx(c["wait_ns"][str(rank)], abs=1000)  # within 1 µs
            assert m.last_rank == c["last_rank"] or c["wait_ns"][str(m.last_rank)] <= 1000


def test_clock_offsets(run: Run) -> None:
    offsets = run.analysis.run.offsets
    for r in run.truth["ranks"]:
        if not r["clock_linked"]:   # nothing connects this rank's clock to rank 0's: unknown, said so
            assert not offsets[r["rank"]].linked and run.report["clock_offsets_us"][str(r["rank"])] is None
            continue
        assert offsets[r["rank"]].offset_ns == pytest.approx(r["clock_offset_ns"], abs=1000), run.case  # 1 µs
        # The generator ends every member of an instance at one instant: nothing is left unexplained.
        assert run.report["clock_offset_residual_max_us"][str(r["rank"])] <= 1.0, run.case
    assert set(run.report["clock_offsets_us"]) == {str(r["rank"]) for r in run.truth["ranks"]}


@pytest.mark.parametrize("case", PIPELINED)
def test_pipeline_layout_matches_truth(case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """MFU002 reads stages, microbatches and schedule from the send/recv pattern alone; its ideal
    bubble is (p-1)/(m+p-1) ÷ v of the generator's layout, and it says how far the measured one is."""
    run = run_case(case, tmp_path_factory)
    layout = run.truth["layout"]
    p, m, v = layout["pp"], layout["microbatches"], layout["interleave"]
    f = next(f for f in run.report["findings"] if f["code"] == "MFU002")
    d = f["details"]
    assert (d["stages"], d["microbatches"], d["schedule"], d["virtual_stages"]) == (p, m, layout["schedule"], v)
    assert d["pipelines"] == layout["dp"] * layout["tp"]
    if layout["schedule"] in TIMED:   # its ideal is a time from the F, I, W the trace measures: test_pipeline.py
        return
    ideal = (p - 1) / (m + p - 1) / v
    assert d["theoretical_bubble"] == pytest.approx(ideal, rel=1e-12)
    assert d["bubble_vs_theoretical_points"] == pytest.approx((f["lost_fraction"] - ideal) * 100, rel=1e-12)
    gap = d["bubble_vs_theoretical_points"]
    assert f"= {ideal:.1%}, measured {abs(gap):.1f} points {'above' if gap >= 0 else 'below'}" in f["summary"]


def test_a_model_description_that_cannot_fit_the_run_is_refused(tmp_path: Path) -> None:
    from helpers import run_diag

    generate("healthy", tmp_path, world_size=2, steps=2)
    r = run_diag("analyze", str(tmp_path), "--model", "llama3-8b", "--tokens-per-step", "65536")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "llama3-8b" in r.stderr and "× the FLOPs" in r.stderr
    ok = run_diag("analyze", str(tmp_path), "--format", "json")   # model.toml beside the traces fits
    assert ok.returncode == 0 and 0 < json.loads(ok.stdout)["mfu"] < 1


def test_flight_recorder_calls_join_the_kineto_collectives(tmp_path: Path) -> None:
    """A Flight Recorder JSON dump beside the traces (told apart by content, named as PyTorch names
    it) joins each Kineto collective of the same rank, process group and Seq."""
    from diag.api import open_store
    from diag.engine.run import analyze

    truth = generate("healthy", tmp_path, world_size=2, steps=2)
    calls = [c for c in truth.to_json()["collectives"] if c["pg_name"] == "0"]
    entries = [{
        "record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": c["seq"],
        "p2p_seq_id": 0, "op_id": i, "profiling_name": "nccl:all_reduce", "time_created_ns": 1, "duration_ms": 0.5 + i,
        "state": "completed", "input_sizes": [[1024]], "input_dtypes": ["BFloat16"], "output_sizes": [[1024]],
        "output_dtypes": ["BFloat16"], "is_p2p": False, "retired": True, "timeout_ms": 600000,
    } for i, c in enumerate(calls)]
    dump = {"version": "2.4", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {}, "entries": entries}
    (tmp_path / "nccl_trace_rank_0").write_text(json.dumps(dump))
    opened = open_store(str(tmp_path), None)
    analyze(opened.con, _options(CASES_DIR / "healthy", tmp_path))
    rows = opened.con.execute("SELECT seq, nccl_duration_ns FROM collectives_nccl WHERE rank = 0 ORDER BY seq").fetchall()
    assert rows and [r[0] for r in rows] == [c["seq"] for c in calls]
    assert [r[1] for r in rows] == [round((0.5 + i) * 1e6) for i in range(len(calls))]


def test_fp32_without_tf32_is_named_with_its_knob(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The fp32 case's slow GEMMs name the cause and the knob: allow_tf32. Recoverable, by hand: each
    non-thin fp32 GEMM ran at 5.5% of 989 TFLOP/s where its shape reaches 0.75 × 989 (its intensity
    × 3,350 GB/s is higher), so a fix wins 1 − 0.055/0.75 = 92.7% of its time; the bucket holds
    1 − 0.055 = 94.5% of it: recoverable ÷ lost = 0.927 / 0.945 = 0.981 (attention, at 60% against
    75%, adds a little lost and less recoverable)."""
    f = next(f for f in run_case("fp32_matmul", tmp_path_factory).report["findings"] if f["code"] == "MFU009")
    assert "allow_tf32" in f["advice"]
    assert f["recoverable_fraction"] / f["lost_fraction"] == pytest.approx(0.981, abs=0.015)


def test_thin_recoverable_is_the_gap_to_the_part_ceiling_without_well_shaped_gemms(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """thin_microbatch has no well-shaped GEMM, so the target is the part's ceiling, 0.75 × 989 TFLOP/s.
    Its thin GEMMs run at 35%: thin_gemm claims 1 − 0.35 = 65% of their time, a fix wins
    1 − 0.35/0.75 = 53.3%: recoverable ÷ lost = 0.533 / 0.65 = 0.8205."""
    f = next(f for f in run_case("thin_microbatch", tmp_path_factory).report["findings"] if f["code"] == "MFU003")
    assert f["recoverable_fraction"] / f["lost_fraction"] == pytest.approx(0.8205, abs=0.002)
    assert f["details"]["other_gemms_tflops"] is None and "no well-shaped GEMM" in f["summary"]
    assert "32 output tiles for 132 SMs" in " ".join(s["why"] for s in f["details"]["shapes"])


def _finding(case: str, code: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return next(f for f in run_case(case, tmp_path_factory).report["findings"] if f["code"] == code)


def test_item_syncs_are_named_with_their_op(tmp_path_factory: pytest.TempPathFactory) -> None:
    """item_sync calls .item() after each of 4 layers: the host-bound gaps after them are the
    largest cause, and the op is named (no with_stack, so no Python caller)."""
    f = _finding("item_sync", "MFU010", tmp_path_factory)
    d = f["details"]
    assert max(d["by_cause"], key=lambda k: d["by_cause"][k]["share"]) == "sync"
    assert d["syncs"][0]["op"] == "aten::_local_scalar_dense" and d["syncs"][0]["caller"] == "?"
    # 4 forward layers × 3 steps × 8 ranks open a gap each; loss.item() at the step's end opens none
    # (the next step's data loader fills it).
    assert d["syncs"][0]["gaps"] == 4 * 3 * 8
    assert "remove host syncs" in f["advice"] and ".item()" in f["advice"]
    assert sum(c["fraction"] for c in d["by_cause"].values()) == pytest.approx(f["lost_fraction"])


def test_idle_causes_count_the_steps_the_ledger_counts(tmp_path_factory: pytest.TempPathFactory) -> None:
    """warmup_teardown's last step stays open 5 ms after its work (the profiler stopping): a step
    tail in a step the means leave out. MFU013's causes split the bucket of the steps analyzed:
    step for step their gap time is the ledger's idle_other, no left-out step's gap is listed, and
    the teardown's tail is not in the step-tail share."""
    run = run_case("warmup_teardown", tmp_path_factory).analysis.run
    bucket = {(lg.rank, lg.step): lg.buckets["idle_other"] for lg in run.ledgers}
    kept = dropped = tail = 0
    for r in run.ranks:
        d = r.rules["MFU013"]
        for i, number in enumerate(r.steps.step):
            if (r.rank, number) in bucket:
                assert sum(v[i] for v in d.gap_ns.values()) / 1e9 == pytest.approx(bucket[r.rank, number], abs=1e-9)
                kept += sum(v[i] for v in d.gap_ns.values())
                tail += d.gap_ns["step_tail"][i]
            else:
                dropped += d.gap_ns["step_tail"][i]
    assert dropped >= 2 * 5e6          # each rank's teardown tail, at least the 5 ms the profiler took
    [f] = Idle(IdleParams(min_fraction=0.0)).findings(run)
    # (The healthy steps between leave the GPU idle for no time at all: no share, where the
    # teardown's tail alone would have made it all step tail.)
    assert f.details["by_cause"]["step_tail"]["share"] == pytest.approx(tail / kept if kept else 0.0)
    excluded = {(rank, step) for rank, step, _ in run.steps_excluded}
    assert excluded and not {(g["rank"], g["step"]) for g in f.details["largest_gaps"]} & excluded


def test_launch_bound_names_tiny_kernels_and_cuda_graphs(tmp_path_factory: pytest.TempPathFactory) -> None:
    f = _finding("launch_bound", "MFU010", tmp_path_factory)
    d = f["details"]
    assert d["kernels_under_tiny_share"] > 0.5 and d["cpu_us_per_launch"] > 4
    assert "reduce-overhead" in f["advice"]
