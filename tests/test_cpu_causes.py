"""Real CPU captures made here with torch.profiler, each with its cause set by construction (issue 35),
and the part diag names checked against it:

- a Python data-preparation loop before each forward, with and without with_stack: the idle time
  is named by that function's frame, or the advice asks for with_stack;
- a recommender's feature interaction (bmm [16,27,16]×[16,16,27], no softmax) and hand-written
  attention (bmm, softmax, bmm): only the second's bmms are attention-shaped.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diag.api import analyze_path
from diag.attribution.workload_mix import attention_bmms
from diag.ingest.pipeline import IngestOptions, ingest
from diag.runtime import store
from diag.timeline.rank import load_rank, rank_files
from rules.MFU013_idle import Idle
from rules.MFU013_idle import Params as IdleParams

pytest.importorskip("torch")

CAPTURE = textwrap.dedent(
    """
    import sys, torch
    from torch.profiler import ProfilerActivity, profile

    out, case, stack = sys.argv[1], sys.argv[2], sys.argv[3] == "stack"
    torch.manual_seed(0)

    def prepare_batch(n):
        # A pure-Python loop: the host's data preparation before the forward.
        rows = [[float((i * 7 + j) % 13) for j in range(64)] for i in range(n)]
        return torch.tensor(rows)

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    emb = torch.randn(16, 27, 16)
    q, k, v = torch.randn(16, 27, 16), torch.randn(16, 27, 16), torch.randn(16, 27, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=stack) as prof:
        for _ in range(4):
            if case == "dataprep":
                with torch.no_grad():
                    model(prepare_batch(2000)).sum()
            elif case == "interaction":   # DLRM's dot interaction: features x features^T
                torch.bmm(emb, emb.transpose(1, 2)).sum()
            else:                         # attention by hand
                torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 4.0, dim=-1), v).sum()
            prof.step()
    prof.export_chrome_trace(out)
    """
)


def _capture(tmp_path: Path, case: str, stack: bool) -> Path:
    out = tmp_path / f"{case}_{int(stack)}.pt.trace.json"
    subprocess.run([sys.executable, "-c", CAPTURE, str(out), case, "stack" if stack else "-"], check=True, timeout=300)
    return out


@pytest.mark.parametrize("stack", [True, False])
def test_a_python_data_preparation_loop_is_named(tmp_path: Path, stack: bool) -> None:
    """By construction the step is mostly prepare_batch's Python (2,000 rows of 64 floats built in
    a list comprehension) and a few small ops: the idle time's largest frame is that function's."""
    f = _capture(tmp_path, "dataprep", stack)
    analysis, _ = analyze_path(str(f), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    [idle] = Idle(IdleParams(min_fraction=0.0)).findings(analysis.run)
    if stack:
        # The function's own frame, or its list comprehension's (a frame of its own before Python 3.12).
        rows = idle.details["by_frame"]
        ours = [r for r in rows if "prepare_batch" in r["frame"] or "<listcomp>" in r["frame"]]
        assert rows[0] in ours and sum(r["share"] for r in ours) > 0.5, rows[:4]
    else:
        assert "by_frame" not in idle.details and "with_stack=True" in idle.advice


def _timeline_bmms(path: Path) -> tuple[list[int], set[int]]:
    con = store.connect(None)
    ingest([str(path)], con, IngestOptions(jobs=1))
    [fid] = rank_files(con)
    tl = load_rank(con, fid)
    bmms = [i for i, nm in enumerate(tl.name) if nm == "aten::bmm"]
    return bmms, attention_bmms(tl.op_name, tl.stream, tl.kernel.tolist())


def test_only_bmms_around_a_softmax_are_attention(tmp_path: Path) -> None:
    bmms, attention = _timeline_bmms(_capture(tmp_path, "interaction", False))
    assert len(bmms) >= 4 and not attention & set(bmms)
    bmms, attention = _timeline_bmms(_capture(tmp_path, "attention", False))
    assert len(bmms) >= 8 and set(bmms) <= attention
