"""MFU001's words against its numbers, derived by hand from the generator's truth: the exposed
milliseconds are the transfer alone (waits for a late rank are MFU005's), an unknown size is said to
be unknown, and bus bandwidth is judged against what the message size can reach (links.reach)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from diag.api import analyze_path
from diag.engine.run import AnalyzeOptions
from diag.knowledge.links import LINKS, normalize_collective, reach, ring_steps
from fixtures.generate import generate
from rules.MFU001_exposed_collectives import ExposedCollectives, Params

# NCCL's cost model (tuning.cc): Ring/LL 6.6 µs fixed, 0.47 µs per ring step over NVLink.
ALPHA_8_RANK_ALLREDUCE_US = 6.6 + 2 * 7 * 0.47
ALPHA_8_RANK_ALLGATHER_US = 6.6 + 7 * 0.47


def _analyze(d: Path) -> dict:  # type: ignore[type-arg]
    return analyze_path(str(d), None, AnalyzeOptions(model=str(d / "model.toml")), warn=False)[1]


def _read(path: Path) -> dict:  # type: ignore[type-arg]
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def test_exposed_ms_is_the_transfer_and_bandwidth_is_judged_by_size(tmp_path: Path) -> None:
    # demo: one 8-rank gradient all-reduce per step after the backward pass, alone on the GPU, on a
    # 100 GB/s ring; rank 5 computes 15% slower, so the other seven wait inside each all-reduce.
    truth = generate("demo", tmp_path, steps=2)
    report = _analyze(tmp_path)
    f = next(f for f in report["findings"] if f["code"] == "MFU001")
    g = f["details"]["groups"][0]
    calls = [c for c in truth.collectives if c.pg_name == "0"]
    # By hand: each rank's exposed transfer is end − last arrival (nothing runs beside it); the wait
    # before the last arrival is straggler time, not counted here.
    transfer_ns = sum(c.end_ns - max(c.arrival_ns.values()) for c in calls for _ in c.ranks)
    waits_ns = sum(sum(c.wait_ns.values()) for c in calls)
    assert waits_ns > transfer_ns / 10   # the waits are large enough to matter
    assert g["exposed_ms"] == pytest.approx(transfer_ns / 1e6, rel=1e-9)
    rank_steps = truth.world_size * truth.steps
    assert g["exposed_ms_per_step"] == pytest.approx(transfer_ns / 1e6 / rank_steps, rel=1e-9)
    # ... which is the ledger's exposed_comm bucket of the truth, per rank-step.
    bucket_ms = sum(st.ledger_s["exposed_comm"] for r in truth.ranks for st in r.steps) / rank_steps * 1e3
    assert g["exposed_ms_per_step"] == pytest.approx(bucket_ms, rel=1e-6)
    assert f"{g['exposed_ms_per_step']:.2f} ms of transfer exposed per step" in f["summary"]
    # Bus bandwidth: S·2(n−1)/n over the transfer; the size can reach S·1.75 / (α + S·1.75 / 450 GB/s).
    rank0 = _read(next(tmp_path.glob("*.gz")))
    nelems = next(e["args"]["In msg nelems"] for e in rank0["traceEvents"]
                  if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_AllReduce"))
    volume = nelems * 2 * 2 * 7 / 8
    busbw = sorted(volume / (c.end_ns - max(c.arrival_ns.values())) for c in calls)[len(calls) // 2]
    can = volume / (ALPHA_8_RANK_ALLREDUCE_US * 1e3 + volume / 450)   # bytes/ns = GB/s
    assert g["msg_bytes"] == nelems * 2 and g["busbw_gbps"] == pytest.approx(busbw, rel=1e-9)
    assert g["reachable_busbw_gbps"] == pytest.approx(can, rel=1e-9)
    assert g["busbw_vs_reachable"] == pytest.approx(busbw / can, rel=1e-9) and busbw / can < 0.5
    assert g["latency_bound"] is False and "check NCCL topology" in f["advice"]
    assert f"bus bandwidth {busbw:.0f} GB/s: {busbw / can:.0%} of the {can:.0f} GB/s" in f["summary"]


def test_step_latencies_are_nccls() -> None:
    # NVIDIA/nccl src/graph/tuning.cc, hwLat for Ring/LL: NVLink .47, PCI 1.0, NET 2.7 µs per step.
    assert {k: link.step_us for k, link in LINKS.items()} == {"hbm3": None, "nvlink4": 0.47, "ib-ndr": 2.7,
                                                              "pcie5": 1.0}
    assert ring_steps("all_reduce", 8) == 14 and ring_steps("_allgather_base", 8) == 7
    assert ring_steps("reduce_scatter", 8) == 7 and ring_steps("send", 2) == 1


def test_a_latency_bound_collective_is_not_called_slow() -> None:
    # A 64 KiB all-gather over 8 ranks in 22 µs: 2.6 GB/s of bus bandwidth, 0.6% of NVLink's 450,
    # yet NCCL's fixed cost alone is 9.89 µs against 0.13 µs for the bytes.
    r = reach("allgather", 8, 65536, LINKS["nvlink4"])
    assert r.latency_s == pytest.approx(ALPHA_8_RANK_ALLGATHER_US * 1e-6)
    assert r.transfer_s == pytest.approx(65536 * 7 / 8 / 450e9)
    assert r.latency_bound and r.busbw_gbps == pytest.approx(57344 / (9.89e-6 + 57344 / 450e9) / 1e9)
    big = reach("allgather", 8, 256 << 20, LINKS["nvlink4"])
    vol = (256 << 20) * 7 / 8   # 235 MB: 522 µs at 450 GB/s, against the same 9.89 µs
    assert not big.latency_bound and big.busbw_gbps == pytest.approx(vol / (9.89e-6 + vol / 450e9) / 1e9)


def test_small_gradient_all_reduces_are_latency_bound_not_slow(tmp_path: Path) -> None:
    # healthy on 2 ranks: DDP all-reduces each weight as its gradient is ready. The h·h = 1024² bf16
    # output projection is 2 MiB; the generator's ring runs it in 5 µs + 2 MiB / 360 GB/s = 10.83 µs:
    # 193.7 GB/s of bus bandwidth, 43% of NVLink's 450 (under half: what the old judgement flagged).
    # NCCL's fixed cost for 2 ranks is 6.6 + 2 × 0.47 = 7.54 µs against 4.66 µs for the bytes:
    # latency-bound, and no size like it can show more than 2 MiB / (7.54 + 4.66) µs = 171.9 GB/s.
    generate("healthy", tmp_path, world_size=2, steps=1)
    analysis, _ = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    groups = {g.msg_bytes: g for g in ExposedCollectives()._groups(analysis.run)}
    proj = groups[1024 * 1024 * 2]
    mib2 = 2 * 2**20
    assert proj.busbw_gbps == pytest.approx(mib2 / (5000 + mib2 / 360), rel=1e-3)
    assert proj.busbw_gbps is not None and proj.busbw_gbps / 450 < 0.5
    assert proj.reach_gbps == pytest.approx(mib2 / (7540 + mib2 / 450), rel=1e-9)
    assert proj.latency_bound and not proj.slow(0.5)
    assert "latency-bound" in proj.bandwidth_text()


def test_a_latency_bound_group_is_told_its_kinds_way_to_larger_messages(tmp_path: Path) -> None:
    """launch_bound: its largest exposed group is a 512 KiB gradient all-reduce, latency-bound. The
    hint names the all-reduce's knob, or for inference larger batches, beside coalescing."""
    generate("launch_bound", tmp_path, steps=1)
    analysis, _ = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    rule = ExposedCollectives(Params(min_fraction=0.0))
    hint = "; the largest group is latency-bound: fewer, larger messages ({}) amortize NCCL's fixed cost per call"
    advice = rule.findings(analysis.run)[0].advice
    assert advice.endswith(hint.format("a larger bucket_cap_mb, coalesced collectives")), advice
    analysis.run.workload = "inference"
    advice = rule.findings(analysis.run)[0].advice
    assert advice.endswith(hint.format("larger batches per forward, coalesced collectives")), advice


def test_an_unknown_message_size_is_said_to_be_unknown(tmp_path: Path) -> None:
    generate("exposed_comm", tmp_path, steps=1)
    for path in tmp_path.glob("rank-*.json"):
        trace = _read(path)
        for e in trace["traceEvents"]:
            for k in ("In msg nelems", "Out msg nelems"):
                (e.get("args") or {}).pop(k, None)
        path.write_text(json.dumps(trace))
    f = next(f for f in _analyze(tmp_path)["findings"] if f["code"] == "MFU001")
    assert "(size unknown)" in f["summary"] and "MiB" not in f["summary"] and "bus bandwidth" not in f["summary"]
    g = f["details"]["groups"][0]
    assert g["msg_bytes"] is None and g["size_mib"] is None and g["busbw_gbps"] is None


@pytest.mark.parametrize(("written", "knob", "not_said"), [
    ("allreduce", "bucket_cap_mb", "--overlap-moe-expert-parallel-comm"),
    ("all_to_all", "--overlap-moe-expert-parallel-comm", "bucket_cap_mb"),
    ("all_to_all", "TrainPipelineSparseDist", "forward_prefetch"),
    ("_allgather_base", "forward_prefetch=True", "bucket_cap_mb"),
    ("reduce_scatter_tensor_coalesced", "--overlap-param-gather", "bucket_cap_mb"),
])
def test_the_advice_names_the_knobs_of_the_exposed_collectives_kind(tmp_path: Path, written: str, knob: str,
                                                                    not_said: str) -> None:
    """The same exposed collective, written as each kind: a gradient all-reduce is data parallelism
    (DDP's bucket_cap_mb), an all-to-all expert parallelism or sharded embeddings (DDP's knobs would
    not touch it), all-gathers and reduce-scatters sharded data parallelism (FSDP, ZeRO)."""
    generate("exposed_comm", tmp_path, steps=1)
    for path in tmp_path.glob("rank-*.json"):
        path.write_text(path.read_text().replace('"Collective name": "allreduce"', f'"Collective name": "{written}"'))
    f = next(f for f in _analyze(tmp_path)["findings"] if f["code"] == "MFU001")
    assert normalize_collective(f["details"]["groups"][0]["collective"]) == normalize_collective(written)
    assert knob in f["advice"] and not_said not in f["advice"], f["advice"]
