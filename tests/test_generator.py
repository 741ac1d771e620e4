"""The fixture generator: its files read as Kineto traces, and its truth agrees with them by arithmetic.

Every check re-reads the written files with the standard library and recomputes from the events
alone (step windows, GPU states, FLOPs from op shapes, collective ends), independently of both the
generator's bookkeeping and diag's ingest.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fixtures.generate import generate, main
from fixtures.scenarios import (
    CASES_DIR,
    Scenario,
    case_names,
    load_case,
    process_groups,
    read_case_file,
    spans_hosts,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

CODES = tuple(f"MFU{i:03d}" for i in range(1, 15))
# MFU014 fires on a tensor-, context- or expert-parallel group spanning hosts, or an FSDP group (the
# generator's is the default group) that does: a fact of the layout.
LAYER_GROUPS = ("TENSOR_MODEL_PARALLEL_GROUP", "EXPERT_MODEL_PARALLEL_GROUP")
CODE_BUCKET = {
    "MFU001": "exposed_comm", "MFU002": "pipeline_bubble", "MFU003": "thin_gemm",
    "MFU004": "recompute", "MFU005": "straggler", "MFU006": "dataloader",
    "MFU009": "gemm_inefficiency", "MFU010": "host_bound", "MFU011": "memcpy", "MFU012": "non_matmul",
    "MFU013": "idle_other",
}
# Bars for "a rule must fire" / "must not fire", in ledger points, away from any rule's threshold.
FIRES_AT, QUIET_BELOW = 0.03, 0.015
# H100 SXM BF16 "with sparsity" on the datasheet: 1,979 TFLOP/s (twice the dense 989, rounded).
SPARSE_PEAK_TFLOPS = 1979.0
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

Event = dict[str, Any]


def ns(us: float) -> int:
    return round(us * 1000)


@dataclass
class Run:
    case: str
    scenario: Scenario
    truth: dict[str, Any]
    traces: dict[int, dict[str, Any]]  # rank (from distributedInfo) -> the parsed file
    files: dict[int, Path]
    model: dict[str, int]
    expected: dict[str, Any]
    comm_ops: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)  # rank → External id → args

    def events(self, rank: int) -> list[Event]:
        return self.traces[rank]["traceEvents"]

    def rank_truth(self, rank: int) -> dict[str, Any]:
        return next(r for r in self.truth["ranks"] if r["rank"] == rank)


def read_trace(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


@pytest.fixture(scope="module", params=case_names())
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    case = request.param
    out = tmp_path_factory.mktemp(case)
    generate(case, out)
    traces, files = {}, {}
    for path in out.iterdir():
        if path.name in ("truth.json", "model.toml"):
            continue
        trace = read_trace(path)
        rank = trace["distributedInfo"]["rank"]
        assert rank not in traces, f"{path.name}: rank {rank} written twice"
        traces[rank], files[rank] = trace, path
    return Run(
        case=case, scenario=load_case(case), truth=json.loads((out / "truth.json").read_text()),
        traces=traces, files=files, model=tomllib.loads((out / "model.toml").read_text())["model"],
        expected=yaml.safe_load((CASES_DIR / case / "expected.yml").read_text()),
    )


# ---- the files are Kineto traces -----------------------------------------------------------------------

def test_files_have_kineto_form(run: Run) -> None:
    s = run.scenario
    assert sorted(run.traces) == list(range(s.world_size))
    for rank, trace in run.traces.items():
        assert trace["schemaVersion"] == 1 and trace["displayTimeUnit"] == "ms"
        assert isinstance(trace["baseTimeNanoseconds"], int)
        assert trace["traceName"] == run.files[rank].name
        # deviceProperties lists the host's GPUs (the mesh counts hosts by them), this rank's among them.
        assert len(trace["deviceProperties"]) == s.gpus_per_node
        dev = trace["deviceProperties"][rank % s.gpus_per_node]
        assert (dev["name"], dev["numSms"], dev["totalGlobalMem"], dev["computeMajor"]) == (
            "NVIDIA H100 80GB HBM3", 132, 85045379072, 9)
        info = trace["distributedInfo"]
        assert (info["backend"], info["world_size"], info["pg_count"]) == ("nccl", s.world_size, len(info["pg_config"]))
        assert all(g["backend_config"] == "cuda:nccl" and rank in g["ranks"] for g in info["pg_config"])
        for e in trace["traceEvents"]:
            assert e["ph"] in ("X", "s", "f", "M", "i"), e
            for key in ("ts", "dur"):
                if isinstance(e.get(key), float):
                    assert abs(e[key] * 1000 - ns(e[key])) < 1e-3, f"{key} {e[key]} has more than 3 decimals"
        # Fixtures stay small: about 1 MB of JSON per rank
        text = gzip.decompress(run.files[rank].read_bytes()) if s.gzip else run.files[rank].read_bytes()
        # (the schedule cases hold every microbatch's F/I/W action spans: up to 2.4 MB)
        assert len(text) < 2_500_000, f"{run.files[rank].name}: {len(text)} bytes"


def test_file_names_follow_the_naming(run: Run) -> None:
    pattern = r"[\w-]+_\d+\.\d+\.pt\.trace\.json" if run.scenario.naming == "tensorboard" else r"rank-\d+\.json"
    for rank, path in run.files.items():
        assert re.fullmatch(pattern + (r"\.gz" if run.scenario.gzip else ""), path.name), path.name
        if run.scenario.naming == "rank":
            assert path.name.startswith(f"rank-{rank}.")


def test_every_kernel_has_one_launch_and_its_flows(run: Run) -> None:
    for rank in run.traces:
        ev = run.events(rank)
        cpu = {e["args"]["External id"]: e for e in ev if e["ph"] == "X" and e["cat"] in ("cpu_op", "user_annotation")}
        launches = [e for e in ev if e["ph"] == "X" and e["cat"] in LAUNCH_CATS and e["name"] != "cudaStreamSynchronize"]
        gpu = [e for e in ev if e["ph"] == "X" and e["cat"] in GPU_CATS]
        by_corr = {e["args"]["correlation"]: e for e in launches}
        assert len(by_corr) == len(launches) and len(gpu) == len(launches)
        flows = Counter((e["ph"], e["id"]) for e in ev if e.get("cat") == "ac2g")
        for k in gpu:
            call = by_corr[k["args"]["correlation"]]
            assert call["args"]["External id"] == k["args"]["External id"] in cpu
            assert ns(k["ts"]) > ns(call["ts"]), "a kernel starts after its launch call begins"
            assert flows[("s", call["args"]["correlation"])] == flows[("f", call["args"]["correlation"])] == 1
            if k["name"].startswith("nccl"):
                op = cpu[k["args"]["External id"]]
                assert op["name"] == "record_param_comms"
                for field in ("Collective name", "Process Group Name", "Process Group Ranks", "In msg nelems"):
                    assert k["args"][field] == op["args"][field]
                # Seq and the peer are on the CPU op only, as Kineto writes them (DESIGN.md).
                assert not {"Seq", "Rank", "Src Rank", "Dst Rank"} & set(k["args"])
                assert "Seq" in op["args"] and "Rank" in op["args"]
        assert sum(flows.values()) == 2 * len(gpu)


def test_fwdbwd_flows_link_forward_ops_to_their_backward(run: Run) -> None:
    for rank in run.traces:
        ev = run.events(rank)
        at = {(e["tid"], e["ts"]): e for e in ev if e["ph"] == "X" and e["cat"] == "cpu_op"}
        ends: dict[int, dict[str, Event]] = defaultdict(dict)
        for e in ev:
            if e.get("cat") == "fwdbwd":
                ends[e["id"]][e["ph"]] = at[(e["tid"], e["ts"])]
        # Inference runs no backward: nothing to link.
        assert bool(ends) == (run.scenario.workload == "training"), "backward ops link to forward ops"
        for pair in ends.values():
            assert pair["s"]["args"]["Sequence number"] == pair["f"]["args"]["Sequence number"]
            assert pair["s"]["tid"] != pair["f"]["tid"] or run.scenario.recompute != "none"
            assert pair["f"]["args"]["Fwd thread id"] == 1


# ---- windows and GPU states, recomputed from the events -----------------------------------------------

@dataclass
class Activity:
    start_ns: int
    end_ns: int
    state: str  # compute | comm | copy
    launch_ns: int
    args: dict[str, Any]
    name: str


def activities(ev: list[Event]) -> list[Activity]:
    calls = {e["args"]["correlation"]: e for e in ev if e["ph"] == "X" and e["cat"] in LAUNCH_CATS}
    out = []
    for e in ev:
        if e["ph"] == "X" and e["cat"] in GPU_CATS:
            state = "copy" if e["cat"] != "kernel" else "comm" if e["name"].startswith("nccl") else "compute"
            start = ns(e["ts"])
            out.append(Activity(start, start + ns(e["dur"]), state, ns(calls[e["args"]["correlation"]]["ts"]),
                                e["args"], e["name"]))
    return out


def step_windows(ev: list[Event], acts: list[Activity]) -> list[tuple[int, int, list[Activity]]]:
    """docs/ledger.md: a step owns the GPU work launched inside its CPU span; windows tile."""
    spans = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in ev
                   if e["ph"] == "X" and e["name"].startswith("ProfilerStep#"))
    windows, start = [], spans[0][0]
    for s0, s1 in spans:
        mine = [a for a in acts if s0 <= a.launch_ns <= s1]
        end = max([s1, *(a.end_ns for a in mine)])
        windows.append((start, end, mine))
        start = end
    assert sum(len(w[2]) for w in windows) == len(acts), "every GPU activity belongs to a step"
    return windows


def sweep_states(w0: int, w1: int, acts: list[Activity]) -> dict[str, int]:
    marks = sorted((t, d, a.state) for a in acts for t, d in ((a.start_ns, 1), (a.end_ns, -1)))
    active: Counter[str] = Counter()
    total: Counter[str] = Counter()
    prev = w0
    for t, d, state in [*marks, (w1, 0, "copy")]:
        if t > prev:
            label = next((s for s in ("compute", "comm", "copy") if active[s]), "idle")
            total[label] += t - prev
            prev = t
        active[state] += d
    return {k: total[k] for k in ("compute", "comm", "copy", "idle")}


def test_windows_tile_and_states_match_truth(run: Run) -> None:
    for rank in run.traces:
        ev = run.events(rank)
        acts = activities(ev)
        truth_steps = run.rank_truth(rank)["steps"]
        windows = step_windows(ev, acts)
        assert len(windows) == len(truth_steps) == run.scenario.steps
        for (w0, w1, mine), st in zip(windows, truth_steps, strict=True):
            assert (w0, w1) == (st["window_start_ns"], st["window_end_ns"])
            assert all(w0 <= a.start_ns and a.end_ns <= w1 for a in mine)
            states = sweep_states(w0, w1, mine)
            assert states == st["state_ns"]
            assert sum(states.values()) == w1 - w0


def test_ledger_sums_to_each_step(run: Run) -> None:
    steps = [st for r in run.truth["ranks"] for st in r["steps"]]
    for st in steps:
        step_s = (st["window_end_ns"] - st["window_start_ns"]) / 1e9
        buckets = st["ledger_s"]
        assert len(buckets) == 12 and min(buckets.values()) >= -1e-15
        assert sum(buckets.values()) == pytest.approx(step_s, abs=1e-12)
        assert sum(st["ledger_fraction"].values()) == pytest.approx(1.0, abs=1e-9)
        compute = sum(buckets[k] for k in ("model_compute", "recompute", "thin_gemm", "gemm_inefficiency", "non_matmul"))
        assert compute == pytest.approx(st["state_ns"]["compute"] / 1e9, abs=1e-12)
        assert buckets["memcpy"] == pytest.approx(st["state_ns"]["copy"] / 1e9, abs=1e-12)
    kept = analyzed(run)   # warm-up and teardown are not in the MFU
    # Σ model seconds ÷ Σ windows (docs/ledger.md): the MFU over the analyzed time
    mfu = (sum(st["ledger_s"]["model_compute"] for st in kept)
           / sum((st["window_end_ns"] - st["window_start_ns"]) / 1e9 for st in kept))
    assert run.truth["mfu"] == pytest.approx(mfu, rel=1e-12)


# ---- FLOPs from shapes ----------------------------------------------------------------------------------

def op_flops(op: Event) -> int:
    dims = op["args"]["Input Dims"]
    if op["name"] == "aten::mm":
        (m, k), (_, n) = dims[0], dims[1]
        return 2 * m * k * n
    if op["name"] == "aten::addmm":
        (m, k), (_, n) = dims[1], dims[2]
        return 2 * m * k * n
    b, h, t, d = dims[0]
    forward = 4 * b * h * t * t * d  # 4·B·H·T²·D, no causal halving
    return forward if op["name"] == "aten::_scaled_dot_product_flash_attention" else 2 * forward


def test_flops_from_shapes_equal_the_model_description(run: Run) -> None:
    m, s = run.model, run.scenario
    per_token = 6 * m["params"] + 12 * m["layers"] * m["heads"] * m["head_dim"] * m["seq_len"]
    if run.truth["workload"] == "inference":
        per_token = 2 * m["params"] + 4 * m["layers"] * m["heads"] * m["head_dim"] * m["seq_len"]   # forward only
    assert m["params"] == 12 * s.layers * s.hidden**2 and m["tokens_per_step"] == s.tokens_per_step
    model_flops = m["tokens_per_step"] * per_token // s.world_size
    for rank in run.traces:
        ev = run.events(rank)
        cpu = {e["args"]["External id"]: e for e in ev if e["ph"] == "X" and e["cat"] == "cpu_op"}
        windows = step_windows(ev, activities(ev))
        for (_, _, mine), st in zip(windows, run.rank_truth(rank)["steps"], strict=True):
            ran = [cpu[a.args["External id"]] for a in mine
                   if a.name.startswith(("nvjet", "sm90_xmma", "void pytorch_flash"))]
            assert sum(op_flops(op) for op in ran) == st["executed_flops"]
            assert st["model_flops"] == model_flops
            assert st["executed_flops"] == model_flops + st["recompute_flops"]
            if s.recompute == "full":
                # Full recomputation runs every forward GEMM and attention again: 2N + 4LHQT per token.
                again = 2 * m["params"] + 4 * m["layers"] * m["heads"] * m["head_dim"] * m["seq_len"]
                assert st["recompute_flops"] == m["tokens_per_step"] * again // s.world_size
            elif s.recompute == "none":
                assert st["recompute_flops"] == 0


# ---- collectives and clocks -----------------------------------------------------------------------------

def launcher(run: Run, rank: int, kernel: Event) -> dict[str, Any]:
    """The args of the record_param_comms op that launched an NCCL kernel (same External id)."""
    if rank not in run.comm_ops:
        run.comm_ops[rank] = {e["args"]["External id"]: e["args"] for e in run.events(rank)
                              if e["ph"] == "X" and e["name"] == "record_param_comms"}
    return run.comm_ops[rank][kernel["args"]["External id"]]


# c10d's names of the collectives the generator draws (record_param_comms "Collective name").
COLLECTIVES = ("allreduce", "all_to_all", "_allgather_base", "_reduce_scatter_base")


def collective_kernels(run: Run) -> Iterator[tuple[tuple[str, int], int, int, int]]:
    """(pg, Seq), rank, start and end on rank 0's clock, for every collective kernel."""
    for rank in run.traces:
        offset = run.rank_truth(rank)["clock_offset_ns"]
        for e in run.events(rank):
            if e["ph"] == "X" and e["cat"] == "kernel" and e["args"].get("Collective name") in COLLECTIVES:
                start = ns(e["ts"]) + offset
                yield (e["args"]["Process Group Name"], launcher(run, rank, e)["Seq"]), rank, start, start + ns(e["dur"])


def test_clock_offsets_align_collective_ends(run: Run) -> None:
    offsets = {r["rank"]: r["clock_offset_ns"] for r in run.truth["ranks"]}
    assert offsets[0] == 0 and max(abs(o) for o in offsets.values()) <= run.scenario.max_clock_skew_us * 1000
    # Without data parallelism or pipelining (thin_gemm: tp = world) nothing links the clocks.
    linked = {r["rank"] for r in run.truth["ranks"] if r["clock_linked"]}
    assert linked == (set(run.traces) if run.scenario.tp < run.scenario.world_size else {0})
    instances: dict[tuple[str, int], dict[int, tuple[int, int]]] = defaultdict(dict)
    for key, rank, start, end in collective_kernels(run):
        instances[key][rank] = (start, end)
    truth = {(c["pg_name"], c["seq"]): c for c in run.truth["collectives"]}
    assert set(instances) == set(truth)
    for key, by_rank in instances.items():
        c = truth[key]
        assert sorted(by_rank) == sorted(c["ranks"])
        assert {end for _, end in by_rank.values()} == {c["end_ns"]}
        # The last to arrive has the shortest kernel; the others' extra time is the wait.
        shortest = min(end - start for start, end in by_rank.values())
        waits = {str(r): (end - start) - shortest for r, (start, end) in by_rank.items()}
        assert waits == c["wait_ns"]
        assert c["wait_ns"][str(c["last_rank"])] == 0


def test_send_recv_pairs_end_together(run: Run) -> None:
    """The k-th send from a to b and the k-th receive on b from a end at one aligned instant; an
    eager send (p2p_eager_bytes) ends at or before its receive, together when the receiver waited."""
    ends: dict[tuple[int, int, str], list[int]] = defaultdict(list)
    for rank in run.traces:
        offset = run.rank_truth(rank)["clock_offset_ns"]
        for e in run.events(rank):
            if e["ph"] == "X" and e["cat"] == "kernel" and e["args"].get("Collective name") in ("send", "recv"):
                a = launcher(run, rank, e)
                pair = (rank, a["Dst Rank"], "send") if "Dst Rank" in a else (a["Src Rank"], rank, "recv")
                ends[pair].append(ns(e["ts"]) + ns(e["dur"]) + offset)
    assert bool(ends) == (run.scenario.pp > 1)
    eager = run.scenario.p2p_eager_bytes > 0
    early = 0
    for (src, dst, side), times in ends.items():
        if side == "send":
            recv = ends[(src, dst, "recv")]
            if not eager:
                assert sorted(times) == sorted(recv)
                continue
            assert len(times) == len(recv) and all(s <= r for s, r in zip(times, recv, strict=True))
            early += sum(s < r for s, r in zip(times, recv, strict=True))
    assert (early > 0) == eager


# ---- expected findings agree with the truth ---------------------------------------------------------------

def analyzed(run: Run) -> list[dict[str, Any]]:
    """The truth's steps that go into the means: warm-up and teardown steps left out, as diag does."""
    return [st for r in run.truth["ranks"] for st in r["steps"] if st["excluded"] is None]


def mean_fraction(run: Run, bucket: str) -> float:
    steps = analyzed(run)
    return sum(st["ledger_fraction"][bucket] for st in steps) / len(steps)


def roofline_ratio(run: Run) -> float:
    """Non-matmul time over the time its bytes need at 3,350 GB/s (MFU008's evidence)."""
    steps = analyzed(run)
    return sum(st["ledger_s"]["non_matmul"] for st in steps) / sum(st["nonmatmul_roofline_s"] for st in steps)


def test_expected_findings_agree_with_truth(run: Run) -> None:
    exp = run.expected
    s = run.scenario
    assert exp["generator"] == {"case": run.case, "ranks": s.world_size, "steps": s.steps, "seed": s.seed}
    fire, quiet = set(exp["must_fire"]), set(exp["must_not_fire"])
    assert fire <= set(CODES) and quiet <= set(CODES) and not fire & quiet
    # A top finding is one that must fire; a case without one (healthy, or led by a denominator
    # finding that wins no time) may still fire rules that explain its compute buckets.
    assert exp["top_finding"] is None or exp["top_finding"] in fire
    assert exp["tolerance_points"] == 2
    args = read_case_file(run.case)["analyze"]["args"]
    wrong_peak = "--peak-tflops" in args and float(args[args.index("--peak-tflops") + 1]) == SPARSE_PEAK_TFLOPS
    for code in fire | quiet:
        if code == "MFU007":
            assert wrong_peak == (code in fire)
        elif code == "MFU008":
            assert roofline_ratio(run) >= 3.0 if code in fire else roofline_ratio(run) < 1.5
        elif code == "MFU014":
            spanning = any(spans_hosts(s, g) for g in process_groups(s) if g.desc in LAYER_GROUPS) or (
                s.fsdp and any(spans_hosts(s, g) for g in process_groups(s) if g.desc == "default_pg"))
            assert spanning == (code in fire)
        else:
            frac = mean_fraction(run, CODE_BUCKET[code])
            assert frac >= FIRES_AT if code in fire else frac < QUIET_BELOW, f"{code}: {frac:.4f}"
    top = exp["top_finding"]
    if top in CODE_BUCKET:
        assert all(mean_fraction(run, CODE_BUCKET[top]) >= mean_fraction(run, CODE_BUCKET[c])
                   for c in fire if c in CODE_BUCKET)


# ---- the command line, determinism, refusals ---------------------------------------------------------------

def test_cli_writes_a_smaller_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pipeline_bubble", str(tmp_path), "--ranks", "4", "--steps", "1", "--seed", "3"]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["model.toml", "rank-0.json", "rank-1.json", "rank-2.json", "rank-3.json", "truth.json"]
    assert "4 ranks × 1 steps" in capsys.readouterr().out
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth["layout"] == {"dp": 1, "tp": 1, "pp": 4, "ep": 1, "gpus_per_node": 8, "microbatches": 4,
                               "interleave": 1, "schedule": "gpipe"}


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    small = Scenario(world_size=2, steps=1, seed=7)
    generate(small, tmp_path / "a")
    generate(small, tmp_path / "b")
    for path in (tmp_path / "a").iterdir():
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name


@pytest.mark.parametrize("case", ["straggler", "pipeline_1f1b", "moe_rotating", "item_sync"])
def test_streamed_run_writes_the_same_bytes(tmp_path: Path, case: str) -> None:
    """Streamed (every rank laid down again alone from the collectives of a run that kept nothing,
    as generate does above STREAM_RANKS), a case's files and truth are byte-equal with the run
    held whole: pipelines' sends, experts' all-to-alls, the host's syncs inside a step."""
    generate(case, tmp_path / "whole", stream=False)
    generate(case, tmp_path / "streamed", stream=True)
    for path in (tmp_path / "whole").iterdir():
        assert path.read_bytes() == (tmp_path / "streamed" / path.name).read_bytes(), path.name


@pytest.mark.parametrize(("argv", "reason"), [
    (["thin_gemm", "--ranks", "4"], "not a multiple of tp"),
    (["straggler", "--ranks", "4"], "straggler_rank 5"),
    (["no_such_case"], "no case"),
])
def test_cli_refuses_what_it_cannot_lay_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], reason: str
) -> None:
    assert main([argv[0], str(tmp_path), *argv[1:]]) == 2
    assert reason in capsys.readouterr().err


def test_selective_recompute_repeats_only_attention(tmp_path: Path) -> None:
    s = Scenario(world_size=2, steps=1, recompute="selective")
    truth = generate(s, tmp_path)
    st = truth.ranks[0].steps[0]
    tokens = s.tokens_per_step // s.world_size
    assert st.recompute_flops == tokens * 4 * s.layers * s.heads * s.head_dim * s.seq_len
