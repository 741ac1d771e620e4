"""MFU010 names host-bound time by what the launching thread did (issue 35): the innermost span at
each instant of a gap's host-bound part — a sync call for the call's own time, a launch call, an op
outside its children and launches, a Python frame — adding up to the bucket.

The built trace is the issue's inference pipeline in small: a kernel, a 14 µs cudaDeviceSynchronize
that returns 4 µs after the GPU drained, 214 ms of Python preprocessing (a decode, then a resize)
and the next op's launch. The sync is the cause for its own 14 µs: without it, the host would have
begun the decode 10 µs sooner, while the GPU still ran. Every expected figure below is read off
the construction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from diag.api import analyze_path
from diag.ingest.pipeline import IngestOptions
from fixtures.generate import generate

PID, TID, STREAM = 4242, 4242, 7
T0 = 1_700_000_000_000.0  # µs


def _x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": T0 + ts, "dur": dur, "args": args}


def _launch(ext: int, corr: int, ts: float, dur: float, k_ts: float, k_dur: float, kernel: str) -> list[dict[str, Any]]:
    call = _x("cuda_runtime", "cudaLaunchKernel", ts, dur, cbid=211, correlation=corr, **{"External id": ext})
    k = {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": STREAM, "ts": T0 + k_ts, "dur": k_dur,
         "args": {"device": 0, "stream": STREAM, "correlation": corr, "External id": ext,
                  "grid": [132, 1, 1], "block": [256, 1, 1]}}
    flow = [{"ph": "s", "id": corr, "pid": PID, "tid": TID, "ts": T0 + ts, "cat": "ac2g", "name": "ac2g"},
            {"ph": "f", "id": corr, "pid": 0, "tid": STREAM, "ts": T0 + k_ts, "cat": "ac2g", "name": "ac2g", "bp": "e"}]
    return [call, k, *flow]


def build(with_stack: bool) -> dict[str, Any]:
    ev = [
        _x("user_annotation", "ProfilerStep#1", 40, 216_100 - 40),
        # The first op and its kernel: 1 µs of the op before its launch call, 5 µs of launch.
        _x("cpu_op", "aten::mm", 40, 20, **{"External id": 1}),
        *_launch(1, 1, 41, 5, 46, 1100 - 46, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"),
        # The sync: called at 1090, the GPU drains at 1100, it returns at 1104 — 4 µs of it in the gap.
        _x("cuda_runtime", "cudaDeviceSynchronize", 1090, 14, cbid=165, correlation=2),
        # The next op: 26 µs of it before its launch call, then 10 µs of launch.
        _x("cpu_op", "aten::linear", 215_104, 46, **{"External id": 3}),
        *_launch(3, 3, 215_130, 10, 215_145, 855, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64"),
    ]
    if with_stack:
        ev += [
            _x("python_function", "infer.py(12): <module>", 0, 216_200, **{"Python id": 1}),
            _x("python_function", "video.py(40): decode", 1104, 150_000 - 1104, **{"Python id": 2}),
            _x("python_function", "image_processing.py(88): resize", 150_000, 215_104 - 150_000, **{"Python id": 3}),
        ]
    props = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_045_870_592, "computeMajor": 9,
              "computeMinor": 0, "numSms": 132, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
              "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "regsPerMultiprocessor": 65536,
              "sharedMemPerMultiprocessor": 233472}]
    return {"schemaVersion": 1, "deviceProperties": props, "traceEvents": ev, "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 1_700_000_000_000_000_000}


# µs, by construction (the gap's host-bound part runs from the first kernel's end, 1100, to the end
# of the next launch call, 215,140; the first gap, 40 to 46, is the first op and its launch call).
EXPECTED_US = {"sync_wait": 14, "python": (150_000 - 1104 - 10) + (215_104 - 150_000), "dispatch": 26 + 1,
               "launch": 10 + 5, "dataloader": 0, "other": 0}


def _mfu010(tmp_path: Path, with_stack: bool) -> dict[str, Any]:
    f = tmp_path / f"infer_{int(with_stack)}.pt.trace.json"
    f.write_text(json.dumps(build(with_stack)))
    _, report = analyze_path(str(f), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    return next(x for x in report["findings"] if x["code"] == "MFU010")


@pytest.mark.parametrize("with_stack", [True, False])
def test_parts_are_what_the_host_did(tmp_path: Path, with_stack: bool) -> None:
    f = _mfu010(tmp_path, with_stack)
    parts = f["details"]["parts"]
    total = sum(EXPECTED_US.values())
    for part, us in EXPECTED_US.items():
        assert parts[part]["share"] == pytest.approx(us / total, abs=1e-9), part
    assert sum(p["fraction"] for p in parts.values()) == pytest.approx(f["lost_fraction"], rel=1e-9)
    # The sync is named, for its own 14 µs only; the summary and advice follow the Python.
    assert parts["sync_wait"]["top"][0]["name"] == "cudaDeviceSynchronize" + (
        " from infer.py(12): <module>" if with_stack else "")
    assert "in Python" in f["summary"] and "remove host syncs" not in f["advice"]
    assert parts["python"]["in_long_gaps_share"] == 1.0
    assert "off the GPU's path" in f["advice"]
    top = [t["name"] for t in parts["python"]["top"]]
    if with_stack:
        assert top == ["video.py(40): decode", "image_processing.py(88): resize"]
        assert parts["python"]["top"][0]["share"] == pytest.approx((150_000 - 1104 - 10) / EXPECTED_US["python"])
        assert "video.py(40): decode" in f["summary"]
    else:
        assert top == ["between ops in ProfilerStep"]
        assert not parts["python"]["frames_recorded"]
    assert [t["name"] for t in parts["dispatch"]["top"]] == ["aten::linear", "aten::mm"]
    # One launch per kernel: two in the step.
    assert parts["launch"]["us_per_launch"] == pytest.approx(15 / 2)


@pytest.mark.parametrize("case", ["host_bound", "launch_bound"])
def test_generated_cases_name_their_construction(tmp_path: Path, case: str) -> None:
    """host_bound: 100 µs of Python between ops (the generator advances the clock outside any
    span): Python is the largest part. launch_bound: tiny kernels, each op's own host time plus a
    5-7 µs launch call: the parts inside ops (dispatch and launch) outweigh the 12 µs of Python."""
    out = tmp_path / case
    generate(case, out, world_size=2, steps=2)
    _, report = analyze_path(str(out), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    f = next(x for x in report["findings"] if x["code"] == "MFU010")
    parts = f["details"]["parts"]
    assert sum(p["share"] for p in parts.values()) == pytest.approx(1.0)
    top = max(parts, key=lambda k: parts[k]["share"])
    if case == "host_bound":
        assert top == "python" and parts["python"]["us_per_launch"] > 10
        assert "of it in Python between ops" in f["summary"]
    else:
        assert parts["dispatch"]["share"] + parts["launch"]["share"] > parts["python"]["share"]
        assert "launches per step" in f["advice"]
