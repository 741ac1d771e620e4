"""Real torch.profiler captures (CPU) of one small model in the layouts users record: with and
without `with_stack`, training and inference. The same ops must come out with the same phases and
FLOPs whatever the Python frames around them; a capture with no backward pass is inference."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.runtime import store
from diag.timeline.rank import RankTimeline, load_rank, rank_files

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cpu_captures")]

# Linear(64→128), ReLU, Linear(128→64) on a batch of 32: forward GEMM FLOPs per step are
# 2·32·64·128 + 2·32·128·64 = 1,048,576 (2·m·n·k per aten::addmm), whatever else the trace holds.
FORWARD_FLOPS = 2 * 32 * 64 * 128 + 2 * 32 * 128 * 64
ACTIVE_STEPS = 3

# mode: train (forward, backward, optimizer), infer (under no_grad), or grad (forward with grad
# enabled and nothing after it, no schedule: no ProfilerStep spans, forward ops at the top level).
_CAPTURE = textwrap.dedent("""
    import sys, torch
    out, stack, mode = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    schedule = None if mode == "grad" else torch.profiler.schedule(wait=0, warmup=1, active=3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_stack=stack, schedule=schedule,
                                on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
        for _ in range(4):
            if mode == "train":
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
            elif mode == "infer":
                with torch.no_grad():
                    model(x)
            else:
                model(x)
            if schedule is not None:
                prof.step()
""")


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("captures")
    script = d / "capture.py"
    script.write_text(_CAPTURE)
    out = {}
    for name, stack, mode in (("stack", 1, "train"), ("plain", 0, "train"), ("inference", 1, "infer"),
                              ("grad", 0, "grad")):
        # rank-0 in the name: a lone process's file is rank 0 either way.
        path = d / name / "rank-0.json"
        path.parent.mkdir()
        subprocess.run([sys.executable, str(script), str(path), str(stack), mode], check=True,
                       capture_output=True, timeout=300)
        out[name] = path
    return out


def _timeline(path: Path) -> RankTimeline:
    con = store.connect(None)
    ingest([str(path)], con, IngestOptions(jobs=1))
    return load_rank(con, rank_files(con)[0])


def _ops(tl: RankTimeline) -> Counter[tuple[str | None, str, float]]:
    """Each host op activity as (op, phase, FLOPs), counted: the order of ops within a step is the same
    in both captures, their times are not."""
    return Counter((tl.op_name[i], str(tl.phase[i]), float(tl.flops[i])) for i in range(len(tl)))


def test_python_frames_change_no_phase_or_flops(captures: dict[str, Path]) -> None:
    stack, plain = _timeline(captures["stack"]), _timeline(captures["plain"])
    assert stack.host_timeline and plain.host_timeline
    assert _ops(stack) == _ops(plain)
    for tl in (stack, plain):
        assert len(tl.steps.step) == ACTIVE_STEPS
        # The host timeline holds aten::linear and the aten::addmm inside it: count the GEMM itself.
        addmm = np.array([n == "aten::addmm" for n in tl.op_name])
        assert tl.flops[addmm & (tl.phase == "forward") & (tl.step_of >= 0)].sum() == ACTIVE_STEPS * FORWARD_FLOPS
        assert {"forward", "backward", "optimizer"} <= set(tl.phase.tolist())
        # No op is a Python frame: the launching op of an activity is an aten or user op.
        assert not any((n or "").startswith(("nn.Module:", "<built-in")) or ".py(" in (n or "") for n in tl.op_name)


def test_a_capture_without_backward_is_inference(captures: dict[str, Path]) -> None:
    from diag.api import analyze_path

    for name, workload in (("stack", "training"), ("plain", "training"), ("inference", "inference"),
                           ("grad", "inference")):
        _, report = analyze_path(str(captures[name]), None, warn=False)
        assert report["workload"] == workload, name
    tl = _timeline(captures["inference"])
    assert not tl.backward_pass and set(tl.phase.tolist()) <= {"forward", "other"}
