"""`diag analyze PATH`, no flags, on traces laid out the way the world writes them.

Real CPU captures made here with torch.profiler (a small MLP, a few steps): the default
tensorboard_trace_handler names with no distributed init, a schedule with several cycles (one
.json.gz file per cycle), two processes without distributed init, with_stack=True; then a file merged from
two ranks the way merge tools write one, and a pretty-printed copy re-saved with "metadata" first.
Each runs through the real CLI and must exit 0 with the ranks and windows the rules give
(docs/reference.md "Ranks and captures"), and its state split (the host timeline of a CPU run) must equal an
independent sweep of the files as written (tests/plain_split.py) within half a point.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import run_diag
from plain_split import mismatch, python_frames_in_gaps

from diag.api import analyze_path
from diag.attribution.analysis import Finding
from diag.ingest.options import IngestOptions
from rules.MFU013_idle import Idle
from rules.MFU013_idle import Params as IdleParams

pytest.importorskip("torch")
pytestmark = pytest.mark.xdist_group("conformance")

# One process: a 3-layer MLP trained for a few steps under torch.profiler with
# tensorboard_trace_handler, writing into DIR with the given schedule and options.
CAPTURE = textwrap.dedent(
    """
    import sys, torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    out, cycles, stack, gz = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "stack", sys.argv[4] == "gzip"
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=stack,
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=cycles),
                 on_trace_ready=tensorboard_trace_handler(out, use_gzip=gz)) as prof:
        for _ in range(4 * cycles + 1):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            prof.step()
    """
)


def _capture(out: Path, cycles: int = 1, stack: bool = False, gz: bool = False) -> subprocess.Popen[bytes]:
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", CAPTURE, str(out), str(cycles), "stack" if stack else "-",
                             "gzip" if gz else "-"])


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layouts")
    runs = [_capture(root / "default"), _capture(root / "cycles", cycles=3, gz=True), _capture(root / "stack", stack=True),
            _capture(root / "two"), _capture(root / "two")]
    for p in runs:
        assert p.wait(timeout=300) == 0
    return root


def _analyze(path: Path) -> dict[str, Any]:
    r = run_diag("analyze", str(path), "--format", "json")
    assert r.returncode == 0, r.stderr
    report: dict[str, Any] = json.loads(r.stdout)
    return report


def _steps_found(report: dict[str, Any]) -> int:
    """The steps analyzed and those set aside by name (steps_excluded). These captures are real CPU
    runs: the profiler stops (and gzips its trace, in the cycles case) inside each window's last
    step, and on a loaded machine that tail can reach half a step, which makes it a teardown step
    (diag/timeline/step_outliers.py). CI once counted 5 of the cycles' 6 steps in `steps`."""
    return int(report["steps"]) + len({e["step"] for e in report["steps_excluded"]})


def _by_pid(folder: Path) -> list[Path]:
    """tensorboard_trace_handler's files `<hostname>_<pid>.<time_ns>.pt.trace.json`, by pid."""
    return sorted(folder.iterdir(), key=lambda f: int(re.search(r"_(\d+)\.\d+\.pt\.trace\.json$", f.name)[1]))  # type: ignore[index]


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_default_names_without_distributed_init_are_rank_0(captured: Path) -> None:
    [f] = list((captured / "default").iterdir())
    assert f.name.endswith(".pt.trace.json") and "distributedInfo" not in _load(f)
    report = _analyze(captured / "default")
    assert report["ranks"] == [0] and _steps_found(report) == 2
    assert any("one process, taken as rank 0" in n for n in report["notes"])
    assert mismatch(report, {0: [f]}) == {}
    idle = _idle(f)   # no Python frames to name
    assert "by_frame" not in idle.details and "with_stack=True" in idle.advice


def test_a_schedule_with_several_cycles_is_capture_windows_of_one_rank(captured: Path) -> None:
    files = sorted((captured / "cycles").iterdir())
    assert len(files) == 3 and len({f.name.split(".")[0] for f in files}) == 1   # one worker, three cycles
    assert all(f.name.endswith(".pt.trace.json.gz") for f in files)
    report = _analyze(captured / "cycles")
    assert report["ranks"] == [0] and _steps_found(report) == 6
    assert any("3 capture windows" in n for n in report["notes"])
    assert mismatch(report, {0: files}) == {}


def test_two_processes_without_ranks_are_ranks_0_and_1_by_pid(captured: Path) -> None:
    files = _by_pid(captured / "two")
    assert len(files) == 2
    report = _analyze(captured / "two")
    assert report["ranks"] == [0, 1]
    [note] = [n for n in report["notes"] if "numbered by process" in n]
    assert f"rank 0 = {files[0].name}" in note and f"rank 1 = {files[1].name}" in note
    assert mismatch(report, {0: [files[0]], 1: [files[1]]}) == {}


def test_with_stack(captured: Path) -> None:
    [f] = list((captured / "stack").iterdir())
    assert any(e.get("cat") == "python_function" for e in _load(f)["traceEvents"])
    report = _analyze(f)
    assert report["ranks"] == [0]
    assert mismatch(report, {0: [f]}) == {}
    # The time between ops, named by the innermost Python frame of the training thread: each
    # frame's share as an independent sweep of the file finds it, and the parts add up to the bucket.
    idle = _idle(f)
    d: dict[str, Any] = idle.details
    theirs = python_frames_in_gaps(f, {e["step"] for e in report["steps_excluded"]})
    total = sum(theirs.values())
    assert d["by_frame"] and idle.summary.startswith("the host is outside aten ops")
    for row in d["by_frame"]:
        assert row["share"] == pytest.approx(theirs[row["frame"]] / total, abs=0.01), row["frame"]
    assert d["outside_frames"]["share"] == pytest.approx(theirs.get("", 0) / total, abs=0.01)
    parts = [row["fraction"] for row in d["by_frame"]] + [d["other_frames"]["fraction"], d["outside_frames"]["fraction"]]
    assert sum(parts) == pytest.approx(idle.lost_fraction)
    assert "with_stack=True" not in idle.advice


def _idle(path: Path) -> Finding:
    """MFU013's finding at any size: the captures' idle time is most of a step on a quiet machine,
    but a loaded one can stretch a single op over nearly all of it (CI saw idle_other at 0.74%, under
    the rule's 1%), and the frames are checked all the same."""
    analysis, _ = analyze_path(str(path), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    [idle] = Idle(IdleParams(min_fraction=0.0)).findings(analysis.run)
    return idle


def test_pretty_printed_with_metadata_first(captured: Path, tmp_path: Path) -> None:
    [f] = list((captured / "default").iterdir())
    doc = _load(f)
    resaved = {"metadata": {"saved_by": "a viewer"}, **{k: v for k, v in doc.items() if k != "traceEvents"},
               "traceEvents": doc["traceEvents"]}
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(resaved, indent=2))
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(resaved))
    for path in (pretty, compact):
        report = _analyze(path)
        assert report["ranks"] == [0] and _steps_found(report) == 2
        assert mismatch(report, {0: [path]}) == {}


def _two(captured: Path) -> list[dict[str, Any]]:
    return [_load(f) for f in _by_pid(captured / "two")]


def _sglang(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """python/sglang/srt/utils/profile_merger.py: each pid becomes the string "[TPnn] <pid>"."""
    merged: dict[str, Any] = {"traceEvents": []}
    for rank, doc in enumerate(docs):
        for e in doc["traceEvents"]:
            e["pid"] = f"[TP{rank:02d}] {e['pid']}"
        merged["traceEvents"].extend(doc["traceEvents"])
        merged.update({k: v for k, v in doc.items() if k != "traceEvents" and k not in merged})
    return merged


def _tracelens(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """TraceLens TraceFusion/trace_fuse.py: args.rank on every event, pid and ids offset by rank × 10^k."""
    pid_step = 10 ** (len(str(max(e["pid"] for e in docs[0]["traceEvents"] if isinstance(e.get("pid"), int)))) + 1)
    events = []
    for rank, doc in enumerate(docs):
        for e in doc["traceEvents"]:
            if e.get("cat") == "Trace":
                continue
            e.setdefault("args", {})["rank"] = rank
            if isinstance(e.get("pid"), int):
                e["args"]["pid_raw"] = e["pid"]
                e["pid"] += rank * pid_step
            events.append(e)
    return {"traceEvents": events}


def _renamed(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Megatron-LM-AutoTuner tools/merge_profiler_traces.py: pid = rank + 1, named "Rank N"."""
    events = []
    for rank, doc in enumerate(docs):
        for e in doc["traceEvents"]:
            e["pid"] = rank + 1
            events.append(e)
        events.append({"name": "process_name", "ph": "M", "pid": rank + 1, "tid": 0, "args": {"name": f"Rank {rank}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


@pytest.mark.parametrize("merge", [_sglang, _tracelens, _renamed], ids=["sglang", "tracelens", "rank-names"])
def test_a_merged_file_is_split_into_its_ranks(captured: Path, tmp_path: Path, merge: Any) -> None:
    apart = _analyze(captured / "two")
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(merge(_two(captured))))
    report = _analyze(path)
    assert report["ranks"] == [0, 1]
    assert any("merges 2 ranks" in n for n in report["notes"])
    # Each rank's timeline is the one its own file gives.
    assert report["steps"] == apart["steps"]
    for rank, ledger in apart["ledger_by_rank"].items():
        assert report["ledger_by_rank"][rank] == pytest.approx(ledger, abs=1e-9)
    assert mismatch(report, {i: [f] for i, f in enumerate(_by_pid(captured / "two"))}) == {}
