"""What diag tells the user about each real trace, held as reviewed text (issue 35): for every trace
in ../shared/traces, the findings' (code, summary, advice) and the workload family, in
tests/data/golden_advice/. A change of wording shows up in review as a diff of these files; write
them anew with DIAG_UPDATE_GOLDEN=1 and read the diff before committing it.

Beside the text, two checks no wording may break: no advice names another vendor's tool, link or
library than the part's (parts.toml [vendor.*]), and none recommends what the trace shows in use.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, kineto_traces, shared_traces

from diag.api import analyze_path
from diag.ingest.pipeline import IngestOptions
from diag.knowledge import hardware

GOLDEN = ROOT / "tests" / "data" / "golden_advice"
UPDATE = os.environ.get("DIAG_UPDATE_GOLDEN") == "1"

# What names one vendor: its tools, links and libraries.
_NAMES = {
    "nvidia": re.compile(r"nvidia-smi|NVLink|NVLS|\bNCCL\b(?!_)|cuBLAS|cuDNN"),
    "amd": re.compile(r"amd-smi|rocm-smi|xGMI|Infinity Fabric|\bRCCL\b|hipBLAS|MIOpen"),
}
# What a run that already uses a feature must not be told to adopt.
_ADOPT = {
    "deepep": re.compile(r"DeepEP or HybridEP"),
    "cuda_graphs": re.compile(r"CUDA graphs (?!are)|capture the step in CUDA graphs"),
    "torch_compile": re.compile(r"(?<!under )torch\.compile(?!\(mode)"),
}


def _traces() -> list[Path]:
    return kineto_traces() if (ROOT.parent / "shared" / "traces").is_dir() else []


def _golden_name(trace: Path) -> str:
    return str(trace.relative_to(shared_traces())).replace("/", "__") + ".json"


def _told(report: dict[str, Any]) -> dict[str, Any]:
    return {"workload_family": report["workload_family"],
            "findings": [{"code": f["code"], "summary": f.get("summary"), "advice": f["advice"]}
                         for f in report["findings"]]}


@pytest.fixture(scope="module")
def reports() -> dict[Path, dict[str, Any]]:
    return {}


def _report(trace: Path, cache: dict[Path, dict[str, Any]]) -> dict[str, Any]:
    if trace not in cache:
        _, cache[trace] = analyze_path(str(trace), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    return cache[trace]


@pytest.mark.parametrize("trace", _traces(), ids=lambda p: p.name)
def test_advice_is_as_reviewed(trace: Path, reports: dict[Path, dict[str, Any]]) -> None:
    told = _told(_report(trace, reports))
    path = GOLDEN / _golden_name(trace)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(told, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert path.exists(), f"{path.name}: no golden file; write it with DIAG_UPDATE_GOLDEN=1 and review it"
    assert told == json.loads(path.read_text(encoding="utf-8")), (
        f"{path.name}: what diag says changed; if on purpose, DIAG_UPDATE_GOLDEN=1 and review the diff")


@pytest.mark.parametrize("trace", _traces(), ids=lambda p: p.name)
def test_advice_names_the_parts_vendor_and_never_what_is_in_use(trace: Path,
                                                                reports: dict[Path, dict[str, Any]]) -> None:
    report = _report(trace, reports)
    vendor = hardware.vendor_of(report["device"]["part"], report["device"]["name"]).key
    for f in report["findings"]:
        for other, names in _NAMES.items():
            if vendor in _NAMES and other != vendor:
                assert not names.search(f["advice"]), f"{f['code']} names {other} on a {vendor} part: {f['advice']}"
        for feature in report["workload_family"]["uses"]:
            if feature in _ADOPT:
                assert not _ADOPT[feature].search(f["advice"]), f"{f['code']} recommends {feature}, in use"


def test_the_checks_catch_what_they_look_for() -> None:
    """The patterns above match the wording they guard against (else the checks pass vacuously)."""
    assert _NAMES["nvidia"].search("GPU throttling (nvidia-smi -q -d PERFORMANCE)")
    assert not _NAMES["nvidia"].search("RCCL topology (NCCL_DEBUG=INFO, NCCL_ALGO)")
    assert _NAMES["amd"].search("31% of the 407 GB/s on xGMI (Infinity Fabric)")
    assert _ADOPT["deepep"].search("DeepEP or HybridEP (--moe-token-dispatcher-type flex)")
    assert _ADOPT["torch_compile"].search("fewer, larger ops (torch.compile)")
    assert not _ADOPT["torch_compile"].search("more of the step under torch.compile (it is in use)")
    assert not _ADOPT["torch_compile"].search('try torch.compile(mode="max-autotune")')
    assert _ADOPT["cuda_graphs"].search('capture the step in CUDA graphs (torch.compile(mode="reduce-overhead"))')
