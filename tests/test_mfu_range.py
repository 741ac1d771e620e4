"""MFU as a range where only part of the GEMM time has FLOPs from op shapes (issue 36).

A hand-written one-step inference capture on an H100 SXM: two bf16 GEMMs, one under an aten::mm
with shapes, one under an aten::mm that recorded none. Every figure is derived here from the events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from diag.api import analyze_path
from diag.engine.run import AnalyzeOptions
from diag.outputs.report import render_text

H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132, "totalGlobalMem": 85045379072,
        "computeMajor": 9, "computeMinor": 0}
PEAK = 989e12                      # H100 SXM dense bf16, FLOP/s
GEMM = "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN"
M = N = K = 4096
STEP_US = 1000.0                   # the ProfilerStep span; every kernel ends inside it


def _trace(shaped_us: float, unshaped_us: float, carried_us: float = 0.0) -> dict[str, Any]:
    """ProfilerStep#1 over [0, 1000] µs; op 1 (shapes) launches a GEMM of `shaped_us`, op 2 (no
    shapes) one of `unshaped_us`; with `carried_us`, a GEMM with no launch record runs first, from
    5 µs (an earlier iteration's, still queued when the capture began)."""
    host = {"pid": 10, "tid": 10}
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", **host, "ts": 0.0, "dur": STEP_US,
         "args": {"External id": 100}},
    ]
    if carried_us:
        events.append({"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": 5.0, "dur": carried_us,
                       "args": {"External id": 0, "device": 0, "stream": 7, "correlation": 99}})
    t = 10.0 + carried_us
    for ext, us, dims in ((1, shaped_us, [[M, K], [K, N]]), (2, unshaped_us, [])):
        args = {"External id": ext, "Input Dims": dims, "Input type": ["c10::BFloat16", "c10::BFloat16"] if dims else []}
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", **host, "ts": t, "dur": 20.0, "args": args},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", **host, "ts": t + 5, "dur": 5.0,
             "args": {"External id": ext, "cbid": 211, "correlation": ext}},
            {"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": t + 30, "dur": us,
             "args": {"External id": ext, "device": 0, "stream": 7, "correlation": ext}},
        ]
        t += 40 + us
    return {"schemaVersion": 1, "deviceProperties": [H100], "traceEvents": events}


def _analyze(tmp_path: Path, shaped_us: float, unshaped_us: float, carried_us: float = 0.0) -> dict[str, Any]:
    d = tmp_path / f"run_{shaped_us:g}_{unshaped_us:g}_{carried_us:g}"
    d.mkdir()
    (d / "trace.json").write_text(json.dumps(_trace(shaped_us, unshaped_us, carried_us)))
    _, report = analyze_path(str(d), None, AnalyzeOptions(), warn=False)
    return report


def test_partial_coverage_gives_a_range_with_its_reason(tmp_path: Path) -> None:
    r = _analyze(tmp_path, shaped_us=300.0, unshaped_us=100.0)
    assert r["workload"] == "inference" and r["step_time_s"] == pytest.approx(STEP_US * 1e-6)
    assert r["flops_coverage"] == pytest.approx(300 / 400)
    assert r["mfu"] is None
    flops = 2.0 * M * N * K                      # the shaped GEMM: 1.37e11 FLOPs
    lower = flops / (STEP_US * 1e-6 * PEAK)      # 13.9%
    rate = flops / 300.0                         # FLOPs per µs the shaped kernel achieved
    upper = (flops + 100.0 * rate) / (STEP_US * 1e-6 * PEAK)
    assert r["mfu_range"] == pytest.approx([lower, upper])
    assert any("75% of GEMM/attention kernel time has FLOPs from op shapes; the rest: under aten::mm 25%" in n
               for n in r["notes"])
    assert f"MFU {lower * 100:.1f}–{upper * 100:.1f}% (FLOPs of 75.0% of GEMM time)" in render_text(r)


def test_at_ninety_percent_coverage_the_point_and_no_range(tmp_path: Path) -> None:
    r = _analyze(tmp_path, shaped_us=900.0 * 0.5, unshaped_us=50.0)
    assert r["flops_coverage"] == pytest.approx(0.9)
    assert r["mfu_range"] is None
    assert r["mfu"] == pytest.approx(2.0 * M * N * K / (STEP_US * 1e-6 * PEAK))


def test_nothing_shaped_no_range_but_the_reason(tmp_path: Path) -> None:
    r = _analyze(tmp_path, shaped_us=0.0, unshaped_us=100.0)
    assert r["mfu"] is None and r["mfu_range"] is None and r["flops_coverage"] == 0.0


def test_unknown_mfu_keeps_matmul_time_out_of_the_losses(tmp_path: Path) -> None:
    """With the part known and no FLOPs, GEMM time is no loss: its own waterfall row, no advice on
    its efficiency, no "= MFU 0.0", and the hint names --model, not --gpu."""
    from diag.outputs.html_report import waterfall_svg
    from tui.views.overview import headline
    from tui.widgets.waterfall import waterfall_rows

    r = _analyze(tmp_path, shaped_us=0.0, unshaped_us=100.0)
    gemm_points = r["ledger"]["gemm_inefficiency"] * 100
    assert gemm_points == pytest.approx(100.0 / STEP_US * 100)   # the unshaped GEMM's 100 µs of 1000
    text = render_text(r)
    assert f"? matmul, FLOPs unknown  {gemm_points:.1f}" in text and "− gemm_inefficiency" not in text
    assert "= model_compute (MFU) unknown" in text
    (slow,) = [f for f in r["findings"] if f["code"] == "MFU009"]
    assert slow["recoverable_fraction"] == 0.0 and slow["advice"].startswith("pass --model with tokens_per_step")
    svg = waterfall_svg(r)
    assert "? matmul, FLOPs unknown" in svg and ">= MFU<" not in svg and "− gemm_inefficiency" not in svg
    assert "gemm_inefficiency" not in dict(waterfall_rows(r["ledger"], mfu_known=False))
    head = headline(r).plain
    assert "MFU ?" in head and "--model" in head and "--gpu" not in head


def test_the_first_step_begins_after_work_it_did_not_launch(tmp_path: Path) -> None:
    """A GEMM with no launch record runs [5, 305] µs: the step is [305, 1000] µs, the GEMM is in no
    step and no coverage, and every GEMM the step launched has shapes: MFU is a point."""
    r = _analyze(tmp_path, shaped_us=300.0, unshaped_us=0.0, carried_us=300.0)
    window_s = (STEP_US - 305.0) * 1e-6
    assert r["step_time_s"] == pytest.approx(window_s)
    assert r["flops_coverage"] == pytest.approx(1.0) and r["mfu_range"] is None
    assert r["mfu"] == pytest.approx(2.0 * M * N * K / (window_s * PEAK))
    assert any(n.startswith("1 GPU activities (0.3 ms) with no launch record ran before the first step's own on "
                            "rank(s) 0") for n in r["notes"])


def test_a_kernels_ceiling_is_its_own_dtypes_peak(tmp_path: Path) -> None:
    """An fp8/bf16 run's peak is the effective one of its mix (between 989 and 1979 on H100 SXM); a
    bf16 GEMM's reachable rate is 75% (data/gemm_ceiling.csv) of the bf16 peak, 989, never of the
    effective peak, and an fp8 GEMM's of the fp8 peak, 1979."""
    host = {"pid": 10, "tid": 10}
    events: list[dict[str, Any]] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", **host,
                                     "ts": 0.0, "dur": STEP_US, "args": {"External id": 100}}]
    fp8, bf16 = "c10::Float8_e4m3fn", "c10::BFloat16"
    ops = ((1, "aten::_scaled_mm", [[M, K], [K, N], [], []], [fp8, fp8, "float", "float"],
            "nvjet_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT"),
           (2, "aten::mm", [[M, K], [K, N]], [bf16, bf16], GEMM))
    t = 10.0
    for ext, name, dims, types, kernel in ops:
        events += [
            {"ph": "X", "cat": "cpu_op", "name": name, **host, "ts": t, "dur": 20.0,
             "args": {"External id": ext, "Input Dims": dims, "Input type": types}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", **host, "ts": t + 5, "dur": 5.0,
             "args": {"External id": ext, "cbid": 211, "correlation": ext}},
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": t + 30, "dur": 400.0,
             "args": {"External id": ext, "device": 0, "stream": 7, "correlation": ext}},
        ]
        t += 440
    d = tmp_path / "mix"
    d.mkdir()
    (d / "trace.json").write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [H100], "traceEvents": events}))
    _, r = analyze_path(str(d), None, AnalyzeOptions(), warn=False)
    assert r["device"]["dtype_mix"] == {"fp8": 0.5, "bf16": 0.5}
    assert 989 < r["device"]["peak_tflops"] < 1979          # 1 / (0.5/1979 + 0.5/989) = 1319
    (slow,) = [f for f in r["findings"] if f["code"] == "MFU009"]
    reach = {row["dtype"]: row["reachable_tflops"] for row in slow["details"]["shapes"]}
    assert reach == pytest.approx({"bf16": 0.75 * 989, "fp8": 0.75 * 1979})


def test_unlaunched_work_after_an_idle_gap_is_not_carried_over(tmp_path: Path) -> None:
    """The same GEMM with no launch record, but starting 200 µs into the step after an idle GPU (over
    the 100 µs a queue's kernels leave between them): not an earlier iteration's queue; the step keeps
    its whole window, and no note."""
    trace = _trace(shaped_us=300.0, unshaped_us=0.0, carried_us=300.0)
    orphan = next(e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e["args"]["correlation"] == 99)
    orphan["ts"], orphan["dur"] = 200.0, 100.0
    d = tmp_path / "gap"
    d.mkdir()
    (d / "trace.json").write_text(json.dumps(trace))
    _, r = analyze_path(str(d), None, AnalyzeOptions(), warn=False)
    assert r["step_time_s"] == pytest.approx(STEP_US * 1e-6)
    assert not any("no launch record ran before" in n for n in r["notes"])
    # It runs in the step's window with no FLOPs: it counts against coverage, and the upper bound adds
    # its 100 µs at the rate the shaped GEMM achieved (its FLOPs in 300 µs), as a launched one's would.
    flops = 2.0 * M * N * K
    assert r["flops_coverage"] == pytest.approx(300 / 400)
    assert r["mfu_range"] == pytest.approx([flops / (STEP_US * 1e-6 * PEAK),
                                            (flops + 100.0 * flops / 300.0) / (STEP_US * 1e-6 * PEAK)])


def test_a_thin_gemm_is_judged_at_its_own_dtypes_peak(tmp_path: Path) -> None:
    """MFU003 in an fp8/bf16 mix: a thin bf16 GEMM (M=64: 1 × 16 output tiles of 128×256 for 132 SMs)
    beside a well-shaped fp8 one that reaches 1374 TFLOP/s, above the bf16 peak. Its thin_gemm time is
    its time less its FLOPs at the bf16 dense peak (989), not at the mix's effective peak (~1950), and a
    reshaped bf16 GEMM is promised 75% of 989 (no well-shaped bf16 GEMM ran), never the fp8 one's rate."""
    host = {"pid": 10, "tid": 10}
    events: list[dict[str, Any]] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", **host,
                                     "ts": 0.0, "dur": STEP_US, "args": {"External id": 100}}]
    fp8, bf16 = "c10::Float8_e4m3fn", "c10::BFloat16"
    thin_m, fp8_us, thin_us = 64, 100.0, 100.0
    ops = ((1, "aten::_scaled_mm", [[M, K], [K, N], [], []], [fp8, fp8, "float", "float"],
            "nvjet_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT", fp8_us),
           (2, "aten::mm", [[thin_m, K], [K, N]], [bf16, bf16], GEMM, thin_us))
    t = 10.0
    for ext, name, dims, types, kernel, us in ops:
        events += [
            {"ph": "X", "cat": "cpu_op", "name": name, **host, "ts": t, "dur": 20.0,
             "args": {"External id": ext, "Input Dims": dims, "Input type": types}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", **host, "ts": t + 5, "dur": 5.0,
             "args": {"External id": ext, "cbid": 211, "correlation": ext}},
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": t + 30, "dur": us,
             "args": {"External id": ext, "device": 0, "stream": 7, "correlation": ext}},
        ]
        t += 40 + us
    d = tmp_path / "thin_mix"
    d.mkdir()
    (d / "trace.json").write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [H100], "traceEvents": events}))
    _, r = analyze_path(str(d), None, AnalyzeOptions(), warn=False)
    fp8_flops, thin_flops = 2.0 * M * N * K, 2.0 * thin_m * N * K
    assert fp8_flops / (fp8_us * 1e-6) / 1e12 == pytest.approx(1374.4, abs=0.1)      # above bf16's 989
    share = thin_flops / (fp8_flops + thin_flops)                                      # bf16: 1.5% of FLOPs
    assert r["device"]["dtype_mix"] == pytest.approx({"fp8": 1 - share, "bf16": share})
    assert r["device"]["peak_tflops"] == pytest.approx(1 / ((1 - share) / 1979 + share / 989))   # ~1950
    window = STEP_US * 1e-6
    assert r["ledger"]["thin_gemm"] == pytest.approx((thin_us * 1e-6 - thin_flops / 989e12) / window)
    (thin,) = [f for f in r["findings"] if f["code"] == "MFU003"]
    assert thin["details"]["target_tflops"] == pytest.approx(0.75 * 989) and 0.75 * 989 <= 989
    assert thin["details"]["target_source"].startswith("per dtype (a dtype mix)")
    assert thin["recoverable_fraction"] == pytest.approx((thin_us * 1e-6 - thin_flops / (0.75 * 989e12)) / window)
    assert f"where a GEMM of its dtype reaches {0.75 * 989:.0f}" in thin["summary"]
