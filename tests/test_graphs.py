"""CUDA/HIP graphs: a graph launch is one runtime call whose correlation id every kernel of the
graph carries (CUPTI; Kineto draws the call's flow to each). The trace here is a generated inference
rank made into one: each step's kernels all launched by the step's first launch call, renamed
cudaGraphLaunch (cbid 311) as CUPTI names it, the other launch calls removed."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import load_json, shared_traces

from diag.api import analyze_path
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.runtime import store
from diag.timeline.rank import load_rank, rank_files
from fixtures.generate import generate
from fixtures.scenarios import load_case

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")


def _graphed(src: Path, dst: Path) -> tuple[dict[int, int], float, dict[int, int]]:
    """Rewrite a trace: per ProfilerStep, one graph launch for all its kernels. Returns each kernel's
    (by ts) graph launch correlation, the graph share of summed kernel time, and launch → External id."""
    doc = json.loads(src.read_text())
    ev = doc["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name", "").startswith("ProfilerStep#"))
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver"}
    graph_of_step: dict[int, dict[str, Any]] = {}
    kernel_graph: dict[int, int] = {}
    for k in sorted((e for e in ev if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        call = calls[k["args"]["correlation"]]
        if call["name"] not in LAUNCHES:
            continue
        step = next(i for i, (a, b) in enumerate(steps) if a <= call["ts"] <= b)
        g = graph_of_step.setdefault(step, call)
        g.update(name="cudaGraphLaunch")
        g["args"]["cbid"] = 311
        if g is not call:
            call["drop"] = True
        k["args"]["correlation"] = g["args"]["correlation"]
        k["args"]["External id"] = g["args"]["External id"]
        kernel_graph[k["ts"]] = g["args"]["correlation"]
    dropped = {c for c, e in calls.items() if e.get("drop")}
    doc["traceEvents"] = [e for e in ev if not e.get("drop") and not (e.get("ph") in ("s", "f") and e.get("id") in dropped)]
    dst.write_text(json.dumps(doc))
    total: dict[str, float] = defaultdict(float)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            total["all"] += e["dur"]
            total["graph"] += e["dur"] if e["ts"] in kernel_graph else 0.0
    ext = {g["args"]["correlation"]: g["args"]["External id"] for g in graph_of_step.values()}
    return kernel_graph, total["graph"] / total["all"], ext


def test_graph_kernels_belong_to_the_launching_op_and_step(tmp_path: Path) -> None:
    s = load_case("inference", world_size=1, tp=1, steps=3)
    generate(s, tmp_path / "src")
    (tmp_path / "g").mkdir()
    kernel_graph, share, ext_of = _graphed(tmp_path / "src" / "rank-0.json", tmp_path / "g" / "rank-0.json")
    con = store.connect(None)
    ingest([str(tmp_path / "g")], con, IngestOptions(jobs=1))
    tl = load_rank(con, rank_files(con)[0])
    ops = dict(con.execute("SELECT external_id, name FROM cpu_ops WHERE external_id IS NOT NULL").fetchall())
    graph = np.asarray(tl.acts.column("graph"), bool)
    assert graph.sum() == len(kernel_graph) > 3
    for i in np.nonzero(graph)[0]:
        corr = tl.correlation[i]
        assert tl.step_of[i] >= 0 and tl.op_name[i] == ops[ext_of[corr]]
    # One step per graph launch: the kernels of a launch are all in its step.
    by_launch: dict[int, set[int]] = defaultdict(set)
    for i in np.nonzero(graph)[0]:
        by_launch[tl.correlation[i]].add(int(tl.step_of[i]))
    assert all(len(v) == 1 for v in by_launch.values()) and len(by_launch) == 3
    _, report = analyze_path(str(tmp_path / "g"), None, warn=False)
    assert report["device"]["graph_kernel_fraction"] == pytest.approx(share, rel=1e-6)
    assert any("inside CUDA/HIP graphs (3 graph launches)" in n for n in report["notes"])


def test_real_graph_launches(tmp_path: Path) -> None:
    """An A100 rank whose torch.compile regions replay CUDA graphs (70 cudaGraphLaunch calls, 135
    kernels and 210 memsets on their correlation ids): each graph activity belongs to the step and
    op of its launch (CompiledFunction or CompiledFunctionBackward), and the graph share of summed
    kernel time is the JSON's."""
    path = shared_traces() / "HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz"
    if not path.exists():
        pytest.skip(f"{path} absent")
    ev = load_json(path)["traceEvents"]
    launch = {e["args"]["correlation"]: e for e in ev if e.get("name") == "cudaGraphLaunch"}
    host = [e for e in ev if e.get("cat") in ("cpu_op", "user_annotation")]

    def innermost(call: dict[str, Any]) -> str:
        # This trace's launch calls carry an External id of their own (their correlation) that names
        # no op: the launching op is the innermost host op on the thread around the call.
        around = [e for e in host if e["tid"] == call["tid"] and e["ts"] <= call["ts"] <= e["ts"] + e["dur"]]
        return min(around, key=lambda e: e["dur"])["name"]

    kernels = [e for e in ev if e.get("cat") == "kernel"]
    share = sum(k["dur"] for k in kernels if k["args"]["correlation"] in launch) / sum(k["dur"] for k in kernels)
    con = store.connect(None)
    ingest([str(path)], con, IngestOptions(jobs=1))
    tl = load_rank(con, rank_files(con)[0])
    graph = np.nonzero(np.asarray(tl.acts.column("graph"), bool))[0]
    assert len(graph) == 135 + 210
    for i in graph:
        call = launch[tl.correlation[i]]
        assert tl.op_name[i] == innermost(call)
        assert tl.steps.cpu_start_ns[tl.step_of[i]] <= round(call["ts"] * 1000) <= tl.steps.cpu_end_ns[tl.step_of[i]]
    _, report = analyze_path(str(path), None, warn=False)
    assert report["device"]["graph_kernel_fraction"] == pytest.approx(share, rel=1e-9)
