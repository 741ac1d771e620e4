"""`diag analyze` on every real trace in ../shared/traces: it runs to the end, the ledger sums to
each step, its GPU-state split equals an independent sweep of the JSON (tests/plain_split.py)
within half a point, and the JSON is the diag.report/1 contract."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import NO_TRACES, kineto_traces, run_diag, shared_traces, unexplained_buckets
from plain_split import mismatch

from diag.api import analyze_path
from diag.attribution.ledger import BUCKETS
from diag.ingest.options import IngestOptions
from diag.outputs.consistency import contradictions
from diag.outputs.report import to_json
from diag.outputs.report_types import to_typed

CONTRACT = {"schema", "world_size", "steps", "device", "step_time_s", "mfu", "hfu", "ledger", "ledger_by_rank",
            "findings", "clock_offsets_us"}
FINDING = {"code", "slug", "severity", "bucket", "lost_fraction", "recoverable_fraction", "lost_s", "ranks", "steps",
           "evidence", "advice"}


def _traces() -> list[Any]:
    """Every shared trace, or one skipped case that says they are missing (not an empty, silent set)."""
    try:
        return kineto_traces()
    except pytest.skip.Exception:
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_TRACES), id="no-shared-traces")]


@pytest.mark.parametrize("trace", _traces(), ids=lambda p: p.name)
def test_analyze_runs_to_the_end_and_the_ledger_sums(trace: Path) -> None:
    # No flags: a trace without distributedInfo or a rank in its name is one process, rank 0.
    analysis, report = analyze_path(str(trace), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    for lg in analysis.run.ledgers:
        assert sum(lg.buckets.values()) == pytest.approx(lg.window_s, rel=1e-9, abs=1e-12)
        assert min(lg.buckets.values()) >= 0
    assert sum(report["ledger"].values()) == pytest.approx(1.0, abs=0.01)
    assert set(report) >= CONTRACT and report["schema"] == "diag.report/1"
    assert set(report["ledger"]) == set(BUCKETS)
    [rank] = report["ranks"]
    assert mismatch(report, {rank: [trace]}) == {}
    for f in report["findings"]:
        assert set(f) >= FINDING
    # DESIGN.md's invariant: every bucket but model_compute with ≥ 5% of the step is explained by
    # findings naming it whose lost_fraction sums to at least half of it.
    assert unexplained_buckets(report) == {}, trace.name
    recoverable = [f["recoverable_fraction"] for f in report["findings"]]
    assert recoverable == sorted(recoverable, reverse=True)
    if report["mfu"] is not None:
        assert 0 < report["mfu"] <= 1 and report["hfu"] >= report["mfu"]
    # One truth per report (issue 39): nothing in it contradicts the rest, and it reads as typed records.
    assert contradictions(report, analysis) == [], trace.name
    assert not [n for n in report["notes"] if n.startswith("internal check failed")]
    to_typed(json.loads(to_json(report)))


# The public traces with no rank anywhere (no distributedInfo.rank, none in the name), which
# `diag analyze` once refused without --rank.
RANKLESS = [
    "kineto/docs/traces/after_fix_trace.json",
    "kineto/docs/traces/before_fix_trace.json",
    "param/et_replay/tests/inputs/linear_kineto.json.gz",
    "param/et_replay/tests/inputs/resnet_kineto.json.gz",
    "HolisticTraceAnalysis/tests/data/triton_example/triton_example.json.gz",
    "HolisticTraceAnalysis/tests/data/rank_unavailable/rank_not_found.json.gz",
    "HolisticTraceAnalysis/tests/data/distributed_info_unavailable/distributed_info_not_found.json.gz",
    "HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
]


@pytest.mark.parametrize("trace", RANKLESS, ids=lambda p: Path(p).name)
def test_a_trace_without_a_rank_analyzes_with_no_flags(trace: str) -> None:
    r = run_diag("analyze", str(shared_traces() / trace), "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["ranks"] == [0]
    assert "no trace or file name gave a rank: one process, taken as rank 0" in report["notes"]


def test_json_report_contract_from_the_cli(tmp_path: Path) -> None:
    src = shared_traces() / "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz"
    out = tmp_path / "report.json"
    r = run_diag("analyze", str(src), "--format", "json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    assert set(report) >= CONTRACT
    assert report["device"]["name"] == "A100 40GB" and report["device"]["dtype"] == "tf32"
    # A100 dense TF32 156 for the tensorop_s1688 GEMMs, FP32 19.5 for the ampere_sgemm ones: the
    # effective peak over the two (diag/attribution/dtype_mix.py), not 156 for all.
    mix = report["device"]["dtype_mix"]
    assert set(mix) == {"tf32", "fp32"} and mix["tf32"] > 0.9
    assert report["device"]["peak_tflops"] == pytest.approx(1 / (mix["tf32"] / 156 + mix["fp32"] / 19.5))
    assert report["mfu_bf16"] == pytest.approx(report["mfu"] * report["device"]["peak_tflops"] / 312)
    assert report["world_size"] == 8 and report["ranks"] == [3]
    assert set(report["ledger_by_rank"]) == {"3"} and report["clock_offsets_us"] == {"3": 0.0}
    md = run_diag("analyze", str(src), "--format", "markdown")
    assert md.returncode == 0 and md.stdout.startswith("# diag report") and "| − exposed_comm |" in md.stdout


def test_unknown_part_says_how_to_fix_it(tmp_path: Path) -> None:
    real = shared_traces() / "HolisticTraceAnalysis/tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz"
    # The Quadro GP100 capture, its device renamed to a part the table does not list (the AWS A10G).
    trace = json.loads(gzip.decompress(real.read_bytes()))
    for props in trace["deviceProperties"]:
        props["name"] = "NVIDIA A10G"
    src = tmp_path / real.name
    src.write_bytes(gzip.compress(json.dumps(trace).encode()))
    r = run_diag("analyze", str(src), "--format", "json")
    report = json.loads(r.stdout)
    assert report["mfu"] is None and "--gpu" in report["device"]["peak_source"]
    r = run_diag("analyze", str(src), "--format", "json", "--peak-tflops", "10.6")
    assert json.loads(r.stdout)["device"]["peak_tflops"] == 10.6


@pytest.mark.parametrize(
    ("args", "key", "want"),
    [
        (["--tokens-per-s", "12000"], "mfu", 0.00498),          # 70B on 1,024 H100 at 12k tokens/s ≈ 0.5%
        (["--mfu", "0.40"], "tokens_per_s", 964_510),          # ≈ 965,000 tokens/s at 40%
    ],
)
def test_diag_mfu_worked_examples(args: list[str], key: str, want: float) -> None:
    r = run_diag("mfu", "--params", "70e9", "--gpus", "1024", "--gpu", "h100-sxm", *args, "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert list(out) == ["mfu", "tokens_per_s", "peak_tflops", "flops_per_token"]
    assert out[key] == pytest.approx(want, rel=1e-3)


def test_an_unknown_gpu_name_is_bad_input() -> None:
    src = shared_traces() / "kineto/docs/traces/after_fix_trace.json"
    r = run_diag("analyze", str(src), "--rank", "0", "--gpu", "h900")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "h100-sxm" in r.stderr


def test_unexplained_idle_lists_the_largest_gaps() -> None:
    """An A100 rank idle two thirds of each step with no launch pending and no host event around the
    gaps: MFU013 explains idle_other whole and lists its largest gaps, largest first."""
    src = shared_traces() / "HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz"
    _, report = analyze_path(str(src), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    f = next(f for f in report["findings"] if f["code"] == "MFU013")
    assert f["bucket"] == "idle_other" and f["lost_fraction"] == pytest.approx(report["ledger"]["idle_other"])
    gaps = [g["ms"] for g in f["details"]["largest_gaps"]]
    assert gaps and gaps == sorted(gaps, reverse=True) and "largest gaps" in f["summary"]


def test_gaps_under_a_millisecond_are_said_in_their_own_unit() -> None:
    """HTA's with_gpu_user_annotation trace: its unexplained idle is many µs-long gaps, which the
    summary printed as "0.00 ms"; each listed gap now reads as its details' value, in µs."""
    src = shared_traces() / "HolisticTraceAnalysis/tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz"
    _, report = analyze_path(str(src), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    f = next(f for f in report["findings"] if f["code"] == "MFU013")
    assert "0.00 ms" not in f["summary"]
    for g in f["details"]["largest_gaps"][:3]:
        assert f"{g['ms'] * 1e3:.2f} µs on rank {g['rank']} step {g['step']}" in f["summary"]


def test_a_capture_with_no_matmul_says_so() -> None:
    # kineto's docs trace: one kernel, named `Kernel`; no GEMM ran, so there is no share of GEMM time to cover.
    r = run_diag("analyze", str(shared_traces() / "kineto/docs/traces/after_fix_trace.json"), "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["mfu"] is None
    assert any("no GEMM or attention kernel ran, so model FLOPs and MFU are unknown" in n for n in report["notes"])


def test_cpu_per_launch_is_the_median_over_the_whole_capture() -> None:
    """MFU010's "µs CPU per launch" is the median duration of the launch calls of GPU work (all of
    them up to 5,000 a rank, else 5,000 spread over the capture): derived here from the JSON."""
    src = shared_traces() / "param/et_replay/tests/inputs/resnet_kineto.json.gz"
    events = json.loads(gzip.decompress(src.read_bytes()))["traceEvents"]
    gpu = {e["args"]["correlation"] for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    launches = sorted(e["dur"] for e in events if e.get("cat") == "cuda_runtime" and e["args"]["correlation"] in gpu)
    _, report = analyze_path(str(src), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    d = next(f for f in report["findings"] if f["code"] == "MFU010")["details"]
    assert len(launches) == 10113 and launches[len(launches) // 2] == 9
    assert d["cpu_us_per_launch"] == 9      # the first 5,000 alone read 7.0


def test_a_gpu_trace_without_gpu_activity_names_its_gpu_and_how_to_record_it() -> None:
    """HTA's CUPTI range-profiler capture lists eight A100s (deviceProperties) but holds no kernel,
    copy or memset: the GPU work is 77 cuda_profiler_range counter events. The host timeline stands
    in, as for a CPU-only run, but the report says the GPU ran unrecorded and names the switch that
    records it, where it used to say "unknown GPU · CPU-only run" and "no GPU in the trace"."""
    trace = shared_traces() / "HolisticTraceAnalysis/tests/data/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"
    r = run_diag("analyze", str(trace), "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["timeline"] == "host" and report["mfu"] is None
    assert report["device"]["name"] == "A100 40GB" and report["device"]["part"] is None
    assert "no GPU activity in the trace" in report["device"]["peak_source"]
    note = next(n for n in report["notes"] if n.startswith("no GPU activity recorded"))
    assert "A100 40GB" in note and "ProfilerActivity.CUDA" in note
    text = run_diag("analyze", str(trace)).stdout.splitlines()[1]
    assert "· A100 40GB · no GPU activity recorded: host timeline" in text
    cpu = shared_traces() / "HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    assert "· no GPU · CPU-only run: host timeline" in run_diag("analyze", str(cpu)).stdout.splitlines()[1]
