"""The pipeline layout from send/recv calls (diag/timeline/pipeline_layout.py) on patterns the generator does not make:
an interleaved ring and a pipeline whose end stages were not traced. GPipe and 1F1B chains are
checked against the generator's truth in test_cases.py. Then the schedules torch.distributed.pipelining
names action by action (pipeline_actions.py, pipeline_schedules.py): the generated zero-bubble and
interleaved cases against a reading of their trace files by hand, and ZB-V, ZB-H2, DualPipe(V) patterns."""

from __future__ import annotations

import json
import re
import socket
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from diag.api import analyze_path
from diag.engine.run import AnalyzeOptions
from diag.timeline.collectives import Call, Matched
from diag.timeline.pipeline_actions import PipeAction, parse_action
from diag.timeline.pipeline_layout import INTERLEAVED, UNKNOWN, detect_layout
from diag.timeline.pipeline_schedules import DUALPIPE, DUALPIPE_V, INTERLEAVED_ZB, ZB_H1, ZB_H2, ZB_V
from fixtures.generate import generate


def _p2p(rank: int, peer: int, direction: str, ts_ns: int, group_size: int | None = None) -> Call:
    return Call(rank, rank, 0, 0, 5, "1", "PIPELINE_MODEL_PARALLEL_GROUP", "sendrecv", None, group_size, None,
                1 << 20, "BFloat16", ts_ns, ts_ns + 1000, direction, peer)


def _transfers(src: int, dst: int, n: int, group_size: int | None = None, t0: int = 0) -> list[Call]:
    """n transfers src → dst in one step, seen on both sides, from t0 on."""
    return [c for i in range(n) for c in (_p2p(src, dst, "send", t0 + i * 10_000, group_size),
                                           _p2p(dst, src, "recv", t0 + i * 10_000, group_size))]


def test_interleaved_ring_gives_m_and_v() -> None:
    # Megatron interleaved, p = 4, v = 2, m = 8: each microbatch crosses rank k → k+1 once per model
    # chunk (v·m = 16 per step), and 3 → 0 between chunks only ((v−1)·m = 8); gradients the reverse.
    p, v, m = 4, 2, 8
    calls: list[Call] = []
    for k in range(p):
        n = (v - 1) * m if k == p - 1 else v * m
        calls += _transfers(k, (k + 1) % p, n) + _transfers((k + 1) % p, k, n)
    layout = detect_layout(calls)
    assert layout is not None
    assert (layout.stages, layout.microbatches, layout.schedule, layout.virtual_stages) == (p, m, INTERLEAVED, v)
    assert layout.theoretical_bubble == pytest.approx((p - 1) / (m + p - 1) / v)


def test_untraced_end_stages_fall_back_to_the_group_size() -> None:
    # Only the middle stages 1 and 2 of a 4-stage pipeline were traced: their peers 0 and 3 look like
    # chain ends but are not traced, so the chain's length says nothing; the pipeline group's size does.
    calls = _transfers(1, 2, 4, group_size=4) + _transfers(2, 1, 4, group_size=4)
    calls += [_p2p(1, 0, "recv", 0, 4), _p2p(2, 3, "send", 0, 4)]
    layout = detect_layout(calls)
    assert layout is not None and (layout.stages, layout.microbatches, layout.schedule) == (4, 4, UNKNOWN)
    assert "group" in layout.how


def test_send_recv_without_a_peer_gives_no_layout() -> None:
    calls = [msgspec.structs.replace(c, peer=None) for c in _transfers(0, 1, 4)]
    assert detect_layout(calls) is None


# ---- schedules named by their actions (torch.distributed.pipelining's PP: record_functions) -------------

def _pipeline_finding(case: str, tmp_path: Path) -> dict[str, Any]:
    """MFU002's finding on a generated case, analyzed with its model.toml."""
    generate(case, tmp_path)
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    return next(f for f in report["findings"] if f["code"] == "MFU002")


def _action_times_by_hand(trace_dir: Path) -> dict[str, float]:
    """Median GPU time, seconds, of each kind of PP: compute action over every rank's steps, read from
    the trace files directly: the compute kernels whose launch call began inside the action's span."""
    per_kind: dict[str, list[float]] = {}
    for path in sorted(trace_dir.glob("rank-*.json")):
        events = json.loads(path.read_text())["traceEvents"]
        steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name", "").startswith("ProfilerStep#")]
        kernels = {e["args"]["correlation"]: e["dur"] for e in events
                   if e.get("cat") == "kernel" and not e["name"].startswith("nccl")}
        launches = [(e["ts"], e["args"]["correlation"]) for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
        for e in events:
            m = re.fullmatch(r"PP:(?:\d+([FIWB])\d+|\(\d+F\d+;\d+[IB]\d+\)OVERLAP_F_B)", e.get("name", ""))
            if m is None or not any(a <= e["ts"] < b for a, b in steps):
                continue
            end = e["ts"] + e["dur"]
            gpu_us = sum(kernels.get(c, 0.0) for t, c in launches if e["ts"] <= t <= end)
            per_kind.setdefault(m[1] or "F&B", []).append(gpu_us * 1e-6)
    return {k: statistics.median(v) for k, v in per_kind.items()}


def test_zero_bubble_is_detected_with_its_own_ideal_bubble(tmp_path: Path) -> None:
    # ZB-H1 (Qi et al. 2023): bubble (p-1)(F+B-2W) per step, B = I + W (DeepSeek-V3 Table 2), over the
    # step as that time over itself plus the rank's work m·(F+B).
    generate("pipeline_zero_bubble", tmp_path)
    truth = json.loads((tmp_path / "truth.json").read_text())["layout"]
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    f = next(f for f in report["findings"] if f["code"] == "MFU002")
    d = f["details"]
    p, m = truth["pp"], truth["microbatches"]
    assert (d["schedule"], d["stages"], d["microbatches"], d["virtual_stages"]) == (ZB_H1, p, m, 1) == (
        truth["schedule"], p, m, truth["interleave"])
    t = _action_times_by_hand(tmp_path)
    assert set(t) == {"F", "I", "W"}
    b = t["I"] + t["W"]
    ideal_s = (p - 1) * (t["F"] + b - 2 * t["W"])
    assert d["chunk_times_ms"] == pytest.approx({"F": t["F"] * 1e3, "I": t["I"] * 1e3, "W": t["W"] * 1e3, "B": b * 1e3},
                                                rel=1e-9)
    assert d["theoretical_bubble_s"] == pytest.approx(ideal_s, rel=1e-9)
    assert d["theoretical_bubble"] == pytest.approx(ideal_s / (ideal_s + m * (t["F"] + b)), rel=1e-9)
    assert d["bubble_formula"] == "(p-1)(F+B-2W)"
    assert "zero-bubble ZB-H1" in f["summary"] and f"p={p}" in f["summary"]
    # Advice fits the schedule: no "try zero-bubble" for a run that is zero-bubble, no interleaving pitch.
    assert "zero-bubble already" in f["advice"] and "interleaved schedule" not in f["advice"]


def test_dualpipe_v_is_detected_with_its_own_ideal_bubble(tmp_path: Path) -> None:
    # DualPipeV on p = 4 ranks (8 stages in a V): DeepSeek-V3 Table 2's (PP/2-1)(F&B+B-3W) for PP = 2p
    # stages, F&B the overlapped pair's time, B the full backward's, W the weight gradient's.
    f = _pipeline_finding("pipeline_dualpipe", tmp_path)
    d = f["details"]
    assert (d["schedule"], d["stages"], d["microbatches"], d["virtual_stages"]) == (DUALPIPE_V, 4, 8, 2)
    assert "V-placed" in d["layout_from"]
    t = _action_times_by_hand(tmp_path)
    assert set(t) == {"F", "B", "I", "W", "F&B"}
    ideal_s = (4 - 1) * (t["F&B"] + t["B"] - 3 * t["W"])
    assert d["chunk_times_ms"]["F&B"] == pytest.approx(t["F&B"] * 1e3, rel=1e-9)
    assert d["theoretical_bubble_s"] == pytest.approx(ideal_s, rel=1e-9)
    assert d["theoretical_bubble"] == pytest.approx(ideal_s / (ideal_s + 8 * 2 * (t["F"] + t["B"])), rel=1e-9)
    # The runtime ran each pair one pass after the other (no custom overlap): F&B is F + B, and the
    # advice is the overlap, not another schedule.
    assert t["F&B"] == pytest.approx(t["F"] + t["B"], rel=0.05)
    assert "OVERLAP_F_B" in f["advice"] and "zero-bubble" not in f["advice"]


def test_interleaved_actions_give_v_and_the_ring(tmp_path: Path) -> None:
    f = _pipeline_finding("pipeline_interleaved", tmp_path)
    d = f["details"]
    assert (d["schedule"], d["stages"], d["microbatches"], d["virtual_stages"]) == (INTERLEAVED, 4, 8, 2)
    assert d["theoretical_bubble"] == pytest.approx(3 / 11 / 2, rel=1e-12)
    assert "loop-placed" in d["layout_from"]
    assert "or use the interleaved schedule" not in f["advice"]
    # Without the PP: names the send/recv ring alone gives the same layout (Megatron names no action).
    layout = detect_layout(m.call for m in _matched(tmp_path))
    assert layout is not None and (layout.schedule, layout.stages, layout.microbatches, layout.virtual_stages) == (
        INTERLEAVED, 4, 8, 2)


def _matched(trace_dir: Path) -> list[Matched]:
    analysis, _ = analyze_path(str(trace_dir), None, AnalyzeOptions(model=str(trace_dir / "model.toml")), warn=False)
    return analysis.run.matched


def _act(stage: int | tuple[int, int], kind: str, mb: int, ns: int, step: int = 0) -> PipeAction:
    stages = stage if isinstance(stage, tuple) else (stage,)
    return PipeAction(stages, kind, mb, step, 0, ns)


def test_action_names_as_torch_writes_them() -> None:
    assert parse_action("PP:3F1") == ((3,), "F", 1)
    assert parse_action("PP:12W10") == ((12,), "W", 10)
    assert parse_action("PP:(0F4;7I0)OVERLAP_F_B") == ((0, 7), "F&B", 4)
    assert parse_action("PP:2SEND_F1") is None and parse_action("PP:0RECV_B3") is None
    assert parse_action("Forward 0") is None


def test_v_placed_split_backward_is_zb_v_and_overlap_is_dualpipe_v() -> None:
    # p = 2 ranks, 4 stages in a V: rank 0 holds 0 and 3, rank 1 holds 1 and 2 (ScheduleZBVZeroBubble).
    def rank(stages: tuple[int, int], overlap: bool) -> list[PipeAction]:
        out = []
        for mb in range(4):
            for s in stages:
                out += [_act(s, "F", mb, 100), _act(s, "I", mb, 100), _act(s, "W", mb, 100)]
        if overlap:
            out.append(_act((stages[0], stages[1]), "F&B", 0, 150))
        return out

    zbv = detect_layout([], {0: rank((0, 3), False), 1: rank((1, 2), False)})
    assert zbv is not None and (zbv.schedule, zbv.stages, zbv.virtual_stages, zbv.microbatches) == (ZB_V, 2, 2, 4)
    assert zbv.bubble_s == 0.0 and zbv.theoretical_bubble == 0.0
    dv = detect_layout([], {0: rank((0, 3), True), 1: rank((1, 2), True)})
    assert dv is not None and dv.schedule == DUALPIPE_V
    # DualPipe's (PP/2-1)(F&B+B-3W) with PP = 4 stages on p = 2 ranks: (2-1)(150 + 200 - 300) ns.
    assert dv.bubble_s == pytest.approx(50e-9)


def test_zb_h2_warms_up_with_more_forwards_than_stages() -> None:
    # ZB-H2 (Qi et al. Figure 3): stage 0 runs up to 2p-1 forwards before its first I; ZB-H1 p.
    p, m = 2, 6
    def stage0(warm: int) -> list[PipeAction]:
        out = [_act(0, "F", k, 100) for k in range(warm)]
        for k in range(m - warm):
            out += [_act(0, "F", warm + k, 100), _act(0, "I", k, 100), _act(0, "W", k, 100)]
        return out + [a for k in range(m - warm, m) for a in (_act(0, "I", k, 100), _act(0, "W", k, 100))]
    last = [a for k in range(m) for a in (_act(1, "F", k, 100), _act(1, "I", k, 100), _act(1, "W", k, 100))]
    h1 = detect_layout([], {0: stage0(p - 1), 1: last})
    h2 = detect_layout([], {0: stage0(2 * p - 1), 1: last})
    assert h1 is not None and h2 is not None and (h1.schedule, h2.schedule) == (ZB_H1, ZB_H2)
    assert h1.bubble_s == pytest.approx((p - 1) * (100 + 200 - 200) * 1e-9) and h2.bubble_s == 0.0


def test_both_chain_ends_sending_first_is_dualpipe() -> None:
    # DeepSeek's DualPipe feeds microbatches in from both ends: rank 0 and rank 3 both send first
    # (each direction's first transfer out of an end at t = 0, the other direction's arrive later).
    calls = _transfers(0, 1, 4) + _transfers(1, 2, 4, t0=1000) + _transfers(2, 3, 4, t0=2000)
    calls += _transfers(3, 2, 4) + _transfers(2, 1, 4, t0=1000) + _transfers(1, 0, 4, t0=2000)
    layout = detect_layout(calls)
    assert layout is not None and (layout.schedule, layout.stages) == (DUALPIPE, 4)
    assert layout.theoretical_bubble is None   # F, B, W unmeasured without the actions' names


def test_a_capture_of_the_first_stage_alone_takes_p_from_the_pipeline_group() -> None:
    # Only rank 0 of a 4-stage ZB-H1 pipeline was traced: its actions name the schedule, its
    # send/recv group's size (4) the stages its own actions cannot show.
    p, m = 4, 6
    acts = [_act(0, "F", k, 100) for k in range(p - 1)]
    for k in range(m - p + 1):
        acts += [_act(0, "F", p - 1 + k, 100), _act(0, "I", k, 100), _act(0, "W", k, 100)]
    acts += [a for k in range(m - p + 1, m) for a in (_act(0, "I", k, 100), _act(0, "W", k, 100))]
    calls = [_p2p(0, 1, "send", i * 10_000, 4) for i in range(m)] + [_p2p(0, 1, "recv", 5_000 + i * 10_000, 4)
                                                                     for i in range(m)]
    layout = detect_layout(calls, {0: acts})
    assert layout is not None and (layout.schedule, layout.stages, layout.microbatches) == (ZB_H1, p, m)
    assert layout.bubble_s == pytest.approx((p - 1) * (100 + 200 - 200) * 1e-9)


PIPELINE_JOB = textwrap.dedent('''
    import os, sys
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble

    def main(rank, world, out, port, kind):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.manual_seed(0)
        d, p, n_stages = 64, world, 2 * world
        held = [rank, 2 * p - 1 - rank] if kind == "zbv" else [rank, rank + p]
        stages = [PipelineStage(torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU()), s, n_stages,
                                torch.device("cpu")) for s in held]
        cls = ScheduleZBVZeroBubble if kind == "zbv" else ScheduleInterleavedZeroBubble
        sched = cls(stages, n_microbatches=4, loss_fn=lambda y, t: ((y - t) ** 2).mean())
        x, t = torch.randn(8, d), torch.randn(8, d)
        first, last = 0 in held, n_stages - 1 in held
        def step():
            kwargs = {"target": t} if last else {}
            sched.step(*([x] if first else []), **kwargs)
        step()
        done = lambda prof: prof.export_chrome_trace(os.path.join(out, f"rank-{rank}.json"))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], on_trace_ready=done,
                                    schedule=torch.profiler.schedule(wait=0, warmup=1, active=2)) as prof:
            for _ in range(3):
                step()
                prof.step()
        dist.destroy_process_group()

    if __name__ == "__main__":
        torch.multiprocessing.spawn(main, args=(2, sys.argv[1], int(sys.argv[2]), sys.argv[3]), nprocs=2)
''')


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "schedule"), [("zbv", ZB_V), ("izb", INTERLEAVED_ZB)])
def test_real_torch_pipelining_captures_name_their_schedule(kind: str, schedule: str, tmp_path: Path) -> None:
    """torch.distributed.pipelining on gloo, 2 ranks × 2 stages, 4 microbatches: ScheduleZBVZeroBubble
    (a V: rank 0 holds stages 0 and 3) and ScheduleInterleavedZeroBubble (a loop: 0 and 2) write their
    actions as `PP:0F0`, `PP:3I0`, `PP:3W0` (beside PP:0UNSHARD, PP:3SEND_B0, ... which are no compute),
    ~30 s each here."""
    pytest.importorskip("torch")
    script = tmp_path / "pipeline_job.py"
    script.write_text(PIPELINE_JOB)
    out = tmp_path / "traces"
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    subprocess.run([sys.executable, str(script), str(out), str(port), kind], check=True, timeout=240,
                   capture_output=True)
    analysis, _ = analyze_path(str(out), None, AnalyzeOptions(), warn=False)
    actions: dict[int, list[PipeAction]] = {}
    for r in analysis.run.ranks:
        actions.setdefault(r.rank, []).extend(r.pipeline_actions)
    assert {a.kind for acts in actions.values() for a in acts} == {"F", "I", "W"}
    layout = detect_layout([m.call for m in analysis.run.matched], actions)
    assert layout is not None
    assert (layout.schedule, layout.stages, layout.virtual_stages, layout.microbatches) == (schedule, 2, 2, 4)
