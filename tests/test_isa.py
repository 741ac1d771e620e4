"""An AMD trace without deviceProperties: the ISA its kernel names carry gives the family, the
range of its parts' peaks and the --gpu that pins it (diag/knowledge/data/isa.toml; issue 36)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers import load_json, shared_traces

from diag.api import analyze_path
from diag.engine.run import AnalyzeOptions
from diag.knowledge import isa
from diag.knowledge.hardware import PARTS

MI250 = "HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"


@pytest.mark.parametrize("row", list(isa.families().values()), ids=lambda r: r.isa)
def test_every_row_names_parts_of_the_table_and_a_real_name_with_its_isa(row: isa.Family) -> None:
    assert row.parts and all(k in PARTS for k in row.parts)
    assert isa.isa_of(row.example) == row.isa and row.source


def test_names_without_an_isa() -> None:
    assert isa.isa_of("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn") is None
    assert isa.isa_of("miopenSp3AsmConv_v21_1_3_gfx9_fp32_f2x3_stride1") is None   # a generation, not a target
    assert isa.most_common_isa(["x_ISA942_y", "z_ISA942_w", "a_ISA90a_b", "nccl"]) == "gfx942"


def test_the_mi250_capture_without_device_properties_names_its_family(tmp_path: Path) -> None:
    doc = load_json(shared_traces() / MI250)
    del doc["deviceProperties"]
    d = tmp_path / "run"
    d.mkdir()
    with gzip.open(d / "trace.json.gz", "wt") as f:
        json.dump(doc, f)
    _, r = analyze_path(str(d), None, AnalyzeOptions(), warn=False)
    dev = r["device"]
    assert dev["name"] == "AMD MI200 (CDNA2), gfx90a" and dev["peak_tflops"] is None and r["mfu"] is None
    peaks = sorted(PARTS[k].dense_tflops[dev["dtype"]] for k in ("mi250x", "mi250"))
    assert f"dense {dev['dtype']} peak {peaks[0]:g}–{peaks[-1]:g} TFLOP/s by part (mi250x, mi250)" in dev["peak_source"]
    assert "pin the part with --gpu mi250x" in dev["peak_source"]
    _, pinned = analyze_path(str(d), None, AnalyzeOptions(gpu="mi250"), warn=False)
    assert pinned["device"]["part"] == "mi250" and pinned["device"]["peak_tflops"] is not None


def test_with_no_isa_in_kernel_names_the_hip_runtime_still_says_amd(tmp_path: Path) -> None:
    doc = load_json(shared_traces() / MI250)
    del doc["deviceProperties"]
    for e in doc["traceEvents"]:
        if isinstance(e.get("name"), str):
            e["name"] = e["name"].replace("_ISA90a_", "_")
    d = tmp_path / "run"
    d.mkdir()
    with gzip.open(d / "trace.json.gz", "wt") as f:
        json.dump(doc, f)
    _, r = analyze_path(str(d), None, AnalyzeOptions(), warn=False)
    assert r["device"]["name"] == "AMD GPU (HIP runtime)" and r["mfu"] is None
    assert "the runtime calls are HIP's" in r["device"]["peak_source"] and "--gpu (mi250, " in r["device"]["peak_source"]
