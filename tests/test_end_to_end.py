"""End to end on runs we capture ourselves: the example GPT job on the CPU (gloo, 2 processes),
captured by diag.capture.profiler, analyzed by `diag analyze DIR` with nothing more. Each injected cause
must come out as the finding that names it.

What the CPU cannot show: thin GEMMs (MFU003) are measured against a GPU peak, and a CPU run has
none, so `--micro-batch` is not asserted here. Every analysis of these runs says it used the host
timeline and reports MFU as null."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import run_diag

pytest.importorskip("torch")

from diag.capture.example import ExampleConfig, run_example  # noqa: E402

# A model big enough that its compute, not Python overhead, fills the step.
MODEL = {"head_dim": 32, "seq_len": 128}
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "healthy": ({}, None),
    # Injected delays are wall-clock and the rest of the step is not: on a loaded machine the step
    # stretches (seen: 1.8 s under a CPU hog, where 80 ms of loader came out 4.5 points, below the
    # 5 asserted). Delays large against a stretched step keep each cause well above 5 points.
    "loader": ({"loader_delay_ms": 400}, "MFU006"),
    # 250 ms of extra work per step on rank 1: to make another rank look last in a collective, the
    # machine would have to stall a rank inside that collective for longer than that.
    "slow_rank": ({"slow_rank": 1, "slow_ms": 250}, "MFU005"),
    "recompute": ({"recompute": "full"}, "MFU004"),
    # The gradients' all-reduce after backward, on a quarter of the healthy run's sequences: the
    # gradients (and so the exposed transfer) keep their size while compute shrinks 4×, so load that
    # stretches both cannot bring the exposed share near 5 points (seen: 4.2 points at batch 8
    # beside ten CPU hogs).
    "no_overlap": ({"no_overlap": True, "batch": 2}, "MFU001"),
    # One microbatch: GPipe's bubble is (p-1)/(m+p-1) = 1/2 of each step, and each op is as big as in
    # the healthy run. (The default, four microbatches, makes every op 4× smaller, and on the host
    # timeline the interpreter's gaps between ops, idle_other, then grow by as much as the bubble.)
    "pipeline": ({"pp": 2, "micro_batch": ExampleConfig().batch}, "MFU002"),
}


BUCKET = {"MFU001": "exposed_comm", "MFU002": "pipeline_bubble", "MFU004": "recompute", "MFU005": "straggler",
          "MFU006": "dataloader"}


def analyze(out: Path, switches: dict[str, Any]) -> dict[str, Any]:
    run_example(out, nproc=2, steps=5, **MODEL, **switches)
    r = run_diag("analyze", str(out), "--format", "json")
    assert r.returncode == 0, r.stderr
    report: dict[str, Any] = json.loads(r.stdout)
    # torch.profiler named the files {host}_{pid}.{ns}.pt.trace.json: the ranks come from distributedInfo.
    assert report["ranks"] == [0, 1] and report["world_size"] == 2
    assert report["timeline"] == "host" and report["mfu"] is None
    assert any("CPU-only trace" in n for n in report["notes"])
    assert sum(report["ledger"].values()) == pytest.approx(1.0, abs=0.01)
    return report


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return analyze(tmp_path_factory.mktemp("healthy") / "run", {})


# All captures in one xdist worker, one after another: two ranks already fill the two cores.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cpu_captures")]


# Two ranks on two shared CPU cores wait on each other in gloo by chance, every step: real
# waiting that MFU005 reports and that no capture here injects; its size depends on whatever
# else the machine runs (seen from 3 to over 10 points on an unchanged healthy run).
NOISE = "MFU005"


# On a host timeline the two processes' threads idle while the other holds both cores (the
# scheduler, not the job): MFU013 rose to high on a healthy run twice (CI, 2026-12-04) and was
# low on the next run of the same tree.
SCHEDULER_IDLE = "MFU013"


def test_a_healthy_run_raises_nothing_major(healthy: dict[str, Any]) -> None:
    major = [f["code"] for f in healthy["findings"] if f["severity"] == "high" and f["code"] not in (NOISE, SCHEDULER_IDLE)]
    assert not major, healthy["findings"]


@pytest.mark.parametrize("case", [c for c, (_, code) in CASES.items() if code])
def test_the_injected_cause_is_named_first(case: str, tmp_path: Path, healthy: dict[str, Any]) -> None:
    switches, code = CASES[case]
    assert code is not None
    report = analyze(tmp_path / "run", switches)
    findings = [(f["code"], f["mfu_points"]) for f in report["findings"]]
    assert code in dict(findings) and dict(findings)[code] >= 5, findings
    if code == NOISE:
        # The injected straggler is rank 1: it is named, and it arrived last in most collectives. A
        # count, not the waited time: on a loaded machine one long stall of rank 0 inside a single
        # collective can outweigh rank 1's injected lateness in seconds (seen: rank 0 named first),
        # but it flips one collective, not the majority.
        straggler = next(f for f in report["findings"] if f["code"] == code)
        last = {int(r): n for r, n in straggler["details"]["last_arrivals"].items()}
        assert 1 in straggler["ranks"] and last.get(1, 0) > sum(n for r, n in last.items() if r != 1), straggler
    else:
        # The cause's bucket is the one that grew most against the healthy run captured alike,
        # and the cause leads every finding but the chance waiting (NOISE).
        growth = {b: report["ledger"][b] - healthy["ledger"][b] for b in report["ledger"] if b != BUCKET[NOISE]}
        assert max(growth, key=lambda b: growth[b]) == BUCKET[code], growth
        findings = [f for f in findings if f[0] != NOISE]
    assert findings[0][0] == code, findings
