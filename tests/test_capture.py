"""diag.capture.profiler and the example job, proven on runs captured here: 2 processes, gloo, CPU.

Each real run (marked slow, ~5 s: every process imports torch and torch._dynamo) belongs to one
test, which makes all its checks on it, so that `pytest -n` never makes a run twice. The checks
read the raw Kineto JSON, not diag's ingest.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from diag.capture.example import launch
from diag.capture.example.launch import ExampleConfig, add_job_arguments, run_example
from diag.capture.profiler import (
    FLIGHT_RECORDER_PREFIX,
    MODEL_FILE,
    add_capture_arguments,
    flight_recorder_env,
    model_toml,
    read_model_toml,
    run_capture,
    run_capture_command,
    write_model_toml,
)
from diag.runtime.errors import BadInput, ExitCode

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

LOADER_SPAN = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
MODEL = {"params": 1.2e9, "layers": 16, "heads": 16, "head_dim": 128, "seq_len": 4096, "tokens_per_step": 524288}


# ---------------------------------------------------------------- reading a Kineto trace


@dataclass(frozen=True)
class Trace:
    path: Path
    doc: dict[str, Any]

    @property
    def rank(self) -> int:
        return int(self.doc["distributedInfo"]["rank"])

    @property
    def spans(self) -> list[dict[str, Any]]:
        return [e for e in self.doc["traceEvents"] if e.get("ph") == "X"]

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.spans if e["name"] == name]

    def steps(self) -> list[dict[str, Any]]:
        return sorted((e for e in self.spans if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])

    def thread_names(self, tid: int) -> set[str]:
        return {
            e["args"]["name"]
            for e in self.doc["traceEvents"]
            if e.get("ph") == "M" and e["name"] == "thread_name" and e["tid"] == tid
        }

    def inside(self, outer: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        """Spans called `name` within one of `outer`, on the same thread."""
        return [
            e
            for e in self.named(name)
            if any(
                o["tid"] == e["tid"] and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in outer
            )
        ]

    def backward(self) -> list[dict[str, Any]]:
        return [e for e in self.spans if e["name"].startswith(BACKWARD_PREFIX)]


@functools.cache
def traces(out: Path) -> list[Trace]:
    """The run's traces, parsed once for all the tests that read them."""
    return [Trace(p, json.loads(p.read_text())) for p in sorted(out.glob("*.pt.trace.json"))]


def by_rank(out: Path) -> dict[int, list[Trace]]:
    found: dict[int, list[Trace]] = {}
    for trace in traces(out):
        found.setdefault(trace.rank, []).append(trace)
    return found


def within(step: dict[str, Any], spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in spans if step["ts"] <= e["ts"] < step["ts"] + step["dur"]]


# ---------------------------------------------------------------- fast: no torch process


def test_the_core_imports_without_torch() -> None:
    code = "import sys, diag.capture.profiler, diag.capture.example; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_model_toml_is_designs_model_form(tmp_path: Path) -> None:
    path = write_model_toml(tmp_path, MODEL)
    assert path.name == MODEL_FILE
    assert tomllib.loads(path.read_text())["model"] == MODEL
    assert read_model_toml(path) == MODEL
    assert not list(tmp_path.glob(".*")), "no temporary file left behind"


def test_an_incomplete_model_description_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing \\['tokens_per_step'\\]"):
        model_toml({k: v for k, v in MODEL.items() if k != "tokens_per_step"})
    with pytest.raises(ValueError, match="layers = 0"):
        model_toml({**MODEL, "layers": 0})
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nparams = 7e9\n")
    with pytest.raises(BadInput, match="bad.toml: model description: missing"):
        read_model_toml(bad)


def test_flight_recorder_env_points_dumps_into_the_trace_dir_and_keeps_user_settings(tmp_path: Path) -> None:
    env = flight_recorder_env(tmp_path, {})
    prefix = str(tmp_path.resolve() / FLIGHT_RECORDER_PREFIX)
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    mine = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/elsewhere/fr_", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    assert flight_recorder_env(tmp_path, mine) == {}


def test_example_switches_round_trip_through_the_command_line() -> None:
    config = ExampleConfig(
        steps=6, active=2, loader_delay_ms=50.0, slow_rank=1, recompute="full", micro_batch=2, no_overlap=True, pp=2
    )
    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    assert ExampleConfig.from_args(parser.parse_args(config.to_argv())) == config
    assert ExampleConfig.from_args(parser.parse_args([])) == ExampleConfig()


@pytest.mark.parametrize(
    ("switches", "nproc", "named"),
    [
        ({"pp": 2}, 3, "--pp 2"),
        ({"slow_rank": 2}, 2, "--slow-rank 2"),
        ({"micro_batch": 3}, 2, "--micro-batch 3"),
        ({"steps": 3, "active": 2}, 2, "--steps 3"),
    ],
)
def test_a_run_that_cannot_work_is_refused_naming_the_switch(
    tmp_path: Path, switches: dict[str, Any], nproc: int, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        run_example(tmp_path, nproc=nproc, **switches)


def test_a_directory_with_another_runs_traces_is_refused(tmp_path: Path) -> None:
    (tmp_path / "host_1.1.pt.trace.json").write_text("{}")
    with pytest.raises(ValueError, match="already holds traces"):
        run_example(tmp_path)
    with pytest.raises(ValueError, match="already holds traces"):
        run_capture([sys.executable, "-c", "pass"], tmp_path)


def test_the_wrapper_passes_the_status_and_keeps_the_users_sitecustomize(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITE_RAN'] = '1'\n")
    monkeypatch.setenv("PYTHONPATH", str(theirs))
    out = tmp_path / "out"
    code = textwrap.dedent(
        f"""
        import os, sys
        assert os.environ['THEIR_SITE_RAN'] == '1'
        assert os.environ['DIAG_CAPTURE_DIR'] == {str(out.resolve())!r}
        assert os.environ['DIAG_CAPTURE_SCHEDULE'] == '1,1,2,1'
        assert 'torch' not in sys.modules  # the hook waits for the training script to import it
        sys.exit(7)
        """
    )
    assert run_capture([sys.executable, "-c", code], out, active=2) == 7


def test_the_capture_command_needs_a_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_capture_arguments(parser)
    assert run_capture_command(parser.parse_args(["--out", str(tmp_path), "--"])) == ExitCode.BAD_INPUT
    assert "no command given" in capsys.readouterr().err


# ---------------------------------------------------------------- slow: real captured runs


def _parameters() -> tuple[int, int]:
    """(non-embedding, all) parameters, counted over the modules of the model the job builds."""
    from torch import nn

    from diag.capture.example.gpt import GPT

    gpt = GPT(ExampleConfig())
    non_embedding = sum(
        p.numel() for m in gpt.modules() if not isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)
    )
    return non_embedding, sum(p.numel() for p in gpt.parameters())


def check_one_trace_per_rank_per_cycle(out: Path, steps_per_cycle: list[list[str]]) -> None:
    ranks = by_rank(out)
    assert sorted(ranks) == [0, 1]
    for files in ranks.values():
        assert [[s["name"] for s in t.steps()] for t in files] == steps_per_cycle
        for trace in files:
            info = trace.doc["distributedInfo"]
            assert (info["world_size"], info["backend"]) == (2, "gloo")
            assert trace.doc["record_shapes"] == 1
            # tensorboard_trace_handler's `{hostname}_{pid}.{time_ns}.pt.trace.json`
            worker, time_ns, *_ = trace.path.name.split(".")
            assert worker.rsplit("_", 1)[1].isdigit() and time_ns.isdigit()


def check_model_toml(out: Path, tokens_per_step: int) -> None:
    model = tomllib.loads((out / MODEL_FILE).read_text())["model"]
    expected = {"params": _parameters()[0], "layers": 4, "heads": 4, "head_dim": 16, "seq_len": 64}
    assert model == {**expected, "tokens_per_step": tokens_per_step}


def check_gemm_rows(out: Path, rows: int) -> None:
    for trace in traces(out):
        addmms = trace.named("aten::addmm")
        assert addmms
        for op in addmms:
            _bias, a, b, *_ = op["args"]["Input Dims"]
            assert len(a) == len(b) == 2 and a[1] == b[0], op["args"]
            assert a[0] == rows, op["args"]


def check_loader_spans(out: Path, delay_us: int) -> None:
    """Every step fetches its batch inside its ProfilerStep, taking at least the injected delay."""
    for trace in traces(out):
        for step in trace.steps():
            (loader,) = within(step, trace.named(LOADER_SPAN))
            assert loader["dur"] >= delay_us
            assert delay_us or loader["dur"] < 50_000


def check_recomputed(out: Path, op: str, per_step: int) -> None:
    """`op` runs `per_step` times again inside backward (on the CPU, backward is on the main thread)."""
    for trace in traces(out):
        again = trace.inside(trace.backward(), op)
        assert len(again) == per_step * len(trace.steps())
        assert len(trace.named(op)) - len(again) >= len(again), "and once in forward"


def backward_end(trace: Trace, step: dict[str, Any]) -> float:
    return max(e["ts"] + e["dur"] for e in within(step, trace.backward()))


@pytest.mark.slow
def test_ddp_run_with_a_slow_loader_a_slow_rank_and_full_recompute(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from diag.capture.example.gpt import SLOW_RANK_SPAN

    out = run_example(tmp_path, nproc=2, steps=6, active=1, repeat=2, loader_delay_ms=50, slow_rank=1, recompute="full")
    # wait 1, warm-up 1, active 1, twice: step 2, then step 5; one file per rank per cycle
    check_one_trace_per_rank_per_cycle(out, [["ProfilerStep#2"], ["ProfilerStep#5"]])
    check_model_toml(out, tokens_per_step=8 * 64 * 2)  # batch × seq_len × 2 data-parallel ranks
    check_gemm_rows(out, rows=8 * 64)
    check_loader_spans(out, delay_us=50_000)  # the dataset sleeps 50 ms per batch
    # 4 linear layers with bias per block × 4 blocks
    check_recomputed(out, "aten::addmm", per_step=16)

    _, all_params = _parameters()
    for trace in traces(out):
        # On the CPU a gloo collective is two host spans: the c10d op on the main thread, and
        # gloo's own on a gloo worker thread, carrying the flat bucket's shape.
        (step,) = trace.steps()
        assert {e["tid"] for e in trace.named("c10d::allreduce_")} == {step["tid"]}
        buckets = within(step, trace.named("gloo:all_reduce"))
        assert all(f"thread {b['tid']} (pt_gloo_runloop)" in trace.thread_names(b["tid"]) for b in buckets)
        assert 1 < len(buckets) < 10
        assert sum(math.prod(b["args"]["Input Dims"][0]) for b in buckets) == all_params
        # DDP launches a bucket's all-reduce from backward as soon as its gradients are ready
        # (program order on the main thread, not a race with the gloo thread).
        launches = within(step, trace.named("c10d::allreduce_"))
        assert min(e["ts"] for e in launches) < backward_end(trace, step), "the first bucket overlaps backward"

        work = trace.named(SLOW_RANK_SPAN)
        if trace.rank == 1:
            assert len(work) == 1 and work[0]["dur"] >= 50_000
            assert trace.inside(work, "aten::mm"), "real matmuls, not a sleep"
        else:
            assert work == []

    for rank in (0, 1):
        dump = pickle.loads((out / f"{FLIGHT_RECORDER_PREFIX}{rank}").read_bytes())
        reduces = [e for e in dump["entries"] if e["profiling_name"] == "gloo:all_reduce"]
        seqs = [e["collective_seq_id"] for e in reduces]
        assert seqs and seqs == sorted(seqs)


@pytest.mark.slow
def test_pipeline_run_with_microbatches_and_selective_recompute(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = run_example(tmp_path, nproc=2, steps=3, pp=2, micro_batch=2, recompute="selective")
    check_one_trace_per_rank_per_cycle(out, [["ProfilerStep#2"]])
    check_model_toml(out, tokens_per_step=8 * 64)  # one data-parallel replica
    check_gemm_rows(out, rows=2 * 64)  # microbatches of 2 sequences
    check_loader_spans(out, delay_us=0)
    # 2 blocks per stage × 4 microbatches; no GEMM is recomputed
    check_recomputed(out, "aten::scaled_dot_product_attention", per_step=8)
    check_recomputed(out, "aten::addmm", per_step=0)

    ranks = by_rank(out)
    first, last = ranks[0][0], ranks[1][0]
    for trace in (first, last):
        assert len(trace.named("c10d::send")) == len(trace.named("c10d::recv_")) == 4  # one per microbatch each way
        assert trace.named("gloo:send") and trace.named("gloo:recv")
        assert trace.named("c10d::allreduce_") == []  # one replica per stage: no gradient sync
    # GPipe: stage 0 sends every activation before it receives the first gradient; stage 1 the reverse.
    assert max(e["ts"] for e in first.named("c10d::send")) < min(e["ts"] for e in first.named("c10d::recv_"))
    assert max(e["ts"] for e in last.named("c10d::recv_")) < min(e["ts"] for e in last.named("c10d::send"))


@pytest.mark.slow
def test_no_overlap_run_all_reduces_each_gradient_after_backward(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = run_example(tmp_path, nproc=2, steps=3, no_overlap=True)
    check_one_trace_per_rank_per_cycle(out, [["ProfilerStep#2"]])
    check_recomputed(out, "aten::addmm", per_step=0)
    _, all_params = _parameters()
    for trace in traces(out):
        (step,) = trace.steps()
        reduces = within(step, trace.named("gloo:all_reduce"))
        assert len(reduces) == 53  # every parameter tensor on its own
        assert sum(math.prod(r["args"]["Input Dims"][0]) for r in reduces) == all_params
        assert min(e["ts"] for e in within(step, trace.named("c10d::allreduce_"))) >= backward_end(trace, step)
        assert trace.named("DistributedDataParallel.forward") == []


TRAIN_SCRIPT = """\
import sys

import torch

from diag.capture.profiler import capture

torch.set_num_threads(1)
model = torch.nn.Linear(32, 32)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# A scheduler wraps optimizer.step on the instance; the ProfilerStep must still follow each step.
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)


def train_step():
    model(torch.randn(16, 32)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


for _ in range(6):
    train_step()
# The script's own capture takes over from the hook, for good.
with capture(sys.argv[1], wait=0, warmup=1, active=1) as cap:
    for _ in range(2):
        train_step()
        cap.step()
for _ in range(6):
    train_step()
"""


@pytest.mark.slow
def test_the_wrapper_makes_each_optimizer_step_a_profiler_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    status = run_capture([sys.executable, str(script), str(tmp_path / "own")], tmp_path / "out", active=2)
    assert status == 0

    (trace,) = traces(tmp_path / "out")  # and none after the script's own capture began
    steps = trace.steps()
    assert [s["name"] for s in steps] == ["ProfilerStep#2", "ProfilerStep#3"]
    # Each optimizer step ends inside its own ProfilerStep: the boundary comes after it.
    optimizer_steps = trace.named("Optimizer.step#SGD.step")
    for step, opt in zip(steps, optimizer_steps, strict=True):
        assert step["ts"] <= opt["ts"] and opt["ts"] + opt["dur"] <= step["ts"] + step["dur"]
    assert "distributedInfo" not in trace.doc  # a single process, no torch.distributed

    (own,) = traces(tmp_path / "own")
    assert [s["name"] for s in own.steps()] == ["ProfilerStep#1"]


@pytest.mark.skipif(not Path(launch._EPHEMERAL).exists(), reason="the kernel's ephemeral port range is Linux's /proc")
def test_the_jobs_store_port_is_free_and_below_the_ephemeral_range() -> None:
    """No outgoing connection is given it in the seconds before rank 0 listens on it."""
    import socket

    first_ephemeral = int(Path(launch._EPHEMERAL).read_text().split()[0])
    for _ in range(20):
        port = launch._free_port()
        assert launch._PORTS_FROM <= port < first_ephemeral
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
