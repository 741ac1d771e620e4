"""Real GPU traces laid out the ways other tools and settings write them, through `diag analyze
PATH` with no flags: each exits 0, finds the ranks the rules give (docs/reference.md "Ranks and captures"),
and its GPU-state split equals an independent sweep of the JSON as written (tests/plain_split.py)
within half a point (issue 13). The CPU captures' layouts are in test_conformance_layouts.py.

The traces: two ranks of a 128-rank A100 job (HTA's trace_filter), and the A100 rank of
trace_diff/control. Each layout is built as the tool builds it: tensorboard_trace_handler's
`<hostname>_<pid>.<time_ns>.pt.trace.json.gz` names with no distributedInfo (no dist init), sglang's
`-TP-<rank>` names, a
re-save with "metadata" first and pretty-printed, ranks merged into one file sglang-style, and
with_stack's `python_function` frames around the ops.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import run_diag, shared_traces
from plain_split import load, mismatch

pytestmark = pytest.mark.xdist_group("conformance_gpu")


def _ranks() -> list[Path]:
    d = shared_traces() / "HolisticTraceAnalysis/tests/data/trace_filter"
    return [d / "sampled_rank-0.json.gz", d / "sampled_rank-1.json.gz"]


def _analyze(path: Path) -> dict[str, Any]:
    r = run_diag("analyze", str(path), "--format", "json")
    assert r.returncode == 0, r.stderr
    report: dict[str, Any] = json.loads(r.stdout)
    return report


def _write(path: Path, doc: dict[str, Any], indent: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=indent)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def _without_dist(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "distributedInfo"}


def test_tensorboard_names_without_dist_init_are_rank_0(tmp_path: Path) -> None:
    src = shared_traces() / "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz"
    f = _write(tmp_path / "run" / "node7_4242.1701388800123456789.pt.trace.json.gz", _without_dist(load(src)))
    report = _analyze(tmp_path / "run")
    assert report["ranks"] == [0]
    assert "A100" in report["device"]["name"]
    assert mismatch(report, {0: [f]}) == {}


def test_two_processes_without_ranks_are_numbered_by_host_then_pid(tmp_path: Path) -> None:
    # Two hosts, the same pid on each (as containers give): rank order is by hostname first.
    a, b = (_without_dist(load(p)) for p in _ranks())
    fa = _write(tmp_path / "run" / "nodeB_31.1701388800000000001.pt.trace.json.gz", a)
    fb = _write(tmp_path / "run" / "nodeA_31.1701388800000000002.pt.trace.json.gz", b)
    report = _analyze(tmp_path / "run")
    assert report["ranks"] == [0, 1]
    [note] = [n for n in report["notes"] if "numbered by process" in n]
    assert f"rank 0 = {fb.name}" in note and f"rank 1 = {fa.name}" in note
    assert mismatch(report, {0: [fb], 1: [fa]}) == {}


def test_sglang_per_rank_files_take_the_tp_rank(tmp_path: Path) -> None:
    """sglang writes `<time.time()>-TP-<tp rank>.trace.json.gz` per rank (scheduler_profiler_mixin.py);
    the ranks here are swapped against the files' own to show the name is what is read."""
    files = {rank: _write(tmp_path / "run" / f"1764547200.5160012-TP-{rank}.trace.json.gz", _without_dist(load(src)))
             for rank, src in zip((1, 0), _ranks(), strict=True)}
    report = _analyze(tmp_path / "run")
    assert report["ranks"] == [0, 1]
    assert mismatch(report, {rank: [f] for rank, f in files.items()}) == {}


def test_metadata_first_and_pretty_printed(tmp_path: Path) -> None:
    doc = load(_ranks()[1])
    resaved = {"metadata": {"saved_by": "a viewer"}, **{k: v for k, v in doc.items() if k != "traceEvents"},
               "traceEvents": doc["traceEvents"]}
    f = _write(tmp_path / "pretty.json", resaved, indent=2)
    report = _analyze(f)
    assert report["ranks"] == [1] and report["world_size"] == 128
    assert mismatch(report, {1: [f]}) == {}


def test_ranks_merged_sglang_style_split_back(tmp_path: Path) -> None:
    """python/sglang/srt/utils/profile_merger.py: each pid becomes "[TPnn] <pid>"; the first
    file's other keys are kept. The split is checked against the files before the merge."""
    merged: dict[str, Any] = {"traceEvents": []}
    for rank, path in enumerate(_ranks()):
        doc = load(path)
        for e in doc["traceEvents"]:
            e["pid"] = f"[TP{rank:02d}] {e['pid']}"
        merged["traceEvents"].extend(doc["traceEvents"])
        merged.update({k: v for k, v in doc.items() if k not in merged})
    report = _analyze(_write(tmp_path / "merged.json.gz", merged))
    assert report["ranks"] == [0, 1]
    assert mismatch(report, {0: [_ranks()[0]], 1: [_ranks()[1]]}) == {}


def test_with_stack_frames_change_nothing(tmp_path: Path) -> None:
    """with_stack=True records `python_function` frames that nest around the ops on their thread:
    here one frame around each step and one around every op, as the training loop and the module
    calls would give. The GPU split and the whole ledger stay those of the trace without them."""
    src = _ranks()[0]
    doc = load(src)
    frames = []
    for i, e in enumerate(doc["traceEvents"]):
        if e.get("ph") == "X" and (e.get("cat") == "cpu_op" or str(e.get("name", "")).startswith("ProfilerStep#")):
            name = "train.py(41): train_step" if e["name"].startswith("ProfilerStep#") else f"torch/nn/modules/module.py(1532): _call_impl [{i}]"
            frames.append({"ph": "X", "cat": "python_function", "name": name, "pid": e["pid"], "tid": e["tid"],
                           "ts": e["ts"], "dur": e["dur"], "args": {"Python id": i, "Python parent id": None}})
    assert len(frames) > 1000
    doc["traceEvents"].extend(frames)
    f = _write(tmp_path / "stack.json.gz", doc)
    report, plain = _analyze(f), _analyze(src)
    assert mismatch(report, {0: [f]}) == {}
    for rank, ledger in plain["ledger_by_rank"].items():
        assert report["ledger_by_rank"][rank] == pytest.approx(ledger, abs=1e-9)
    assert report["mfu"] == plain["mfu"]
