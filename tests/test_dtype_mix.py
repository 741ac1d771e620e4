"""The peak by the dtype the math ran in (issue 13 class 7): dtype mix, effective peak, mfu_bf16.

Each case is a small Kineto trace written here, one ProfilerStep with GEMMs whose dtypes come
from their recorded shapes or only from their kernels' names, analyzed by the real CLI; the
expected peak is worked out by hand from the H100 SXM datasheet (bf16 989, fp8 1979 dense).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import run_diag

from diag.attribution import dtype_mix
from diag.knowledge import hardware

H100 = {"name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045379072, "numSms": 132,
        "computeMajor": 9, "computeMinor": 0}
FP8, BF16 = "c10::Float8_e4m3fn", "c10::BFloat16"
FP8_KERNEL = "nvjet_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT"
BF16_KERNEL = "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN"
UNKNOWN_KERNEL = "void my_fused_rope_kernel<float>(float*, int)"  # named by no row of kernels.toml
DEEPGEMM_KERNEL = ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>"
                   "(dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel::Params)")   # deepseek-ai/profile-data
H800 = {**H100, "name": "NVIDIA H800"}


def _trace(gemms: Sequence[tuple[str, str | None, int, int, int, int]], device: dict[str, Any] | None = H100) -> dict[str, Any]:
    """One step of GEMMs (op name, input type or None for no shapes, kernel index, m, k, n), one
    after another on the GPU: each op at 10+100i µs on the CPU launches its kernel, which runs 50 µs."""
    kernels = [FP8_KERNEL, BF16_KERNEL, UNKNOWN_KERNEL, DEEPGEMM_KERNEL]
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
         "dur": 100 * len(gemms) + 20},
    ]
    for i, (op, dtype, kernel, m, k, n) in enumerate(gemms):
        ts, ext, corr = 10 + 100 * i, 100 + i, 1000 + i
        args: dict[str, Any] = {"External id": ext}
        if dtype is not None:
            args["Input Dims"] = [[m, k], [k, n], [], []] if op == "aten::_scaled_mm" else [[m, k], [k, n]]
            args["Input type"] = [dtype, dtype, "float", "float"] if op == "aten::_scaled_mm" else [dtype, dtype]
        events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": ts, "dur": 8, "args": args})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 1,
                       "dur": 5, "args": {"External id": ext, "correlation": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": kernels[kernel], "pid": 0, "tid": 7, "ts": ts + 20,
                       "dur": 50, "args": {"External id": ext, "correlation": corr, "device": 0, "stream": 7}})
    trace: dict[str, Any] = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1},
                             "traceEvents": events}
    if device is not None:
        trace["deviceProperties"] = [{"id": 0, **device}]
    return trace


def _analyze(tmp_path: Path, trace: dict[str, Any], *flags: str) -> dict[str, Any]:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(trace))
    out = run_diag("analyze", str(path), "--format", "json", *flags)
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def test_float8_training_sits_between_the_bf16_and_fp8_peaks(tmp_path: Path) -> None:
    # torchao Float8Linear: the linear layers are aten::_scaled_mm on e4m3 inputs, the rest bf16.
    # FLOPs 2·m·k·n: fp8 2·1024³ ×2 GEMMs, bf16 2·1024³ ×1.
    r = _analyze(tmp_path, _trace([("aten::_scaled_mm", FP8, 0, 1024, 1024, 1024),
                                   ("aten::_scaled_mm", FP8, 0, 1024, 1024, 1024),
                                   ("aten::mm", BF16, 1, 1024, 1024, 1024)]))
    d = r["device"]
    assert d["dtype_mix"] == pytest.approx({"fp8": 2 / 3, "bf16": 1 / 3})
    assert d["dtype"] == "fp8"
    effective = 1 / ((2 / 3) / 1979 + (1 / 3) / 989)     # 1,483.9 TFLOP/s
    assert d["peak_tflops"] == pytest.approx(effective)
    assert 989 < d["peak_tflops"] < 1979
    # The same model FLOPs/s against the bf16 peak: MFU × effective / 989.
    assert r["mfu"] is not None
    assert r["mfu_bf16"] == pytest.approx(r["mfu"] * effective / 989)


def test_all_bf16_has_no_second_figure(tmp_path: Path) -> None:
    r = _analyze(tmp_path, _trace([("aten::mm", BF16, 1, 1024, 1024, 1024)]))
    assert r["device"]["dtype_mix"] == {"bf16": 1.0}
    assert r["device"]["peak_tflops"] == 989.0
    assert r["mfu_bf16"] is None


def test_without_shapes_kernel_names_give_the_dtype(tmp_path: Path) -> None:
    # No record_shapes: an FP8 run is at the FP8 peak, not "assumed bf16".
    r = _analyze(tmp_path, _trace([("aten::_scaled_mm", None, 0, 0, 0, 0)] * 2))
    assert r["device"]["dtype_mix"] == {"fp8": 1.0}
    assert r["device"]["peak_tflops"] == 1979.0
    assert "kernel names" in r["device"]["peak_source"]


def test_without_shapes_mixed_names_weigh_kernel_time_by_peak(tmp_path: Path) -> None:
    # 2 fp8 kernels and 1 bf16 kernel of 50 µs each: at equal efficiency, FLOPs_d ∝ time_d × peak_d,
    # so the shares are (2·1979 : 1·989) and the effective peak the time-weighted mean of the peaks.
    r = _analyze(tmp_path, _trace([("aten::_scaled_mm", None, 0, 0, 0, 0)] * 2 + [("aten::mm", None, 1, 0, 0, 0)]))
    d = r["device"]
    assert d["dtype_mix"] == pytest.approx({"fp8": 2 * 1979 / (2 * 1979 + 989), "bf16": 989 / (2 * 1979 + 989)})
    assert d["peak_tflops"] == pytest.approx((2 * 1979 + 989) / 3)


def test_text_report_shows_the_mix(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(_trace([("aten::_scaled_mm", FP8, 0, 1024, 1024, 1024),
                                       ("aten::mm", BF16, 1, 1024, 1024, 1024)])))
    out = run_diag("analyze", str(path), "--format", "text")
    assert out.returncode == 0, out.stderr
    assert "effective peak 1319 TFLOP/s (matmul FLOPs fp8 50%, bf16 50%)" in out.stdout
    assert "against the bf16 peak" in out.stdout


def test_effective_peak_is_a_weighted_harmonic_mean() -> None:
    h100 = hardware.PARTS["h100-sxm"]
    assert hardware.effective_peak_tflops(h100, {"bf16": 1.0}) == 989.0
    assert hardware.effective_peak_tflops(h100, {"fp8": 0.5, "bf16": 0.5}) == pytest.approx(2 / (1 / 1979 + 1 / 989))


def test_a_dtype_the_part_lacks_leaves_the_peak_unknown_unless_negligible() -> None:
    a100 = hardware.PARTS["a100"]   # no fp8 on Ampere
    shares, left_out = dtype_mix.DtypeMix({"fp8": 0.5, "bf16": 0.5}, "test").priced(a100)
    assert shares == {} and left_out == ["fp8"]
    shares, left_out = dtype_mix.DtypeMix({"fp64": 0.001, "bf16": 0.999}, "test").priced(hardware.PARTS["h800"])
    assert shares == {"bf16": 1.0} and left_out == ["fp64"]


def test_unknown_kernel_names_are_counted_in_the_notes(tmp_path: Path) -> None:
    # Three 50 µs kernels, one of them named by no pattern: a third of the kernel time.
    r = _analyze(tmp_path, _trace([("aten::mm", BF16, 1, 1024, 1024, 1024), ("aten::add", None, 2, 0, 0, 0),
                                   ("aten::mm", BF16, 1, 1024, 1024, 1024)]))
    note = next(n for n in r["notes"] if "match no pattern" in n)
    assert note.startswith("1 kernel names (33.3% of kernel time)")
    assert "my_fused_rope_kernel<float> 33.3%" in note


def test_h800_fp8_grouped_gemms_without_shapes_are_at_the_fp8_peak(tmp_path: Path) -> None:
    # DeepSeek's training capture: FP8 grouped GEMMs (CUTLASS, custom ops: no shapes) on H800.
    r = _analyze(tmp_path, _trace([("dpsk::grouped_gemm", None, 3, 0, 0, 0)] * 2, device=H800))
    assert r["device"]["part"] == "h800"
    assert r["device"]["dtype_mix"] == {"fp8": 1.0} and r["device"]["peak_tflops"] == 1979.0
