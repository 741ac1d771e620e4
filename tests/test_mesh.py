"""The parallel layout (diag/attribution/mesh.py): the group-name table row by row, the inference on
hand-made collectives (traffic, sharding, certainty), figures derived by hand on a generated run, and
a real DeviceMesh capture on gloo."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest

from diag.api import analyze_path
from diag.attribution.mesh import DEGREES, Mesh, infer
from diag.engine.run import AnalyzeOptions
from diag.knowledge.process_groups import named, rows
from diag.outputs.report import mesh_line, mesh_rows, render_markdown, render_text
from diag.timeline.collectives import Call, Matched
from fixtures.generate import generate
from fixtures.scenarios import load_case

# ---- the table ----------------------------------------------------------------------------------


@pytest.mark.parametrize("row", rows(), ids=lambda r: r.example)
def test_every_row_names_its_own_example(row: object) -> None:
    assert named(row.example) is row  # type: ignore[attr-defined]


def test_undescribed_groups_are_left_to_their_traffic() -> None:
    assert named("undefined") is None and named("") is None and named(None) is None
    assert named("mesh_dp_shard_cp").dim == "other"  # type: ignore[union-attr]


# ---- the inference on hand-made calls ------------------------------------------------------------

def calls(pg: str, desc: str | None, ranks: Iterable[int], kinds: Iterable[tuple[str, int]],
          steps: int = 2, nbytes: int = 1 << 20) -> list[Matched]:
    """Each rank of the group runs the collectives (kind, start ns within the step) in each step."""
    ranks = tuple(ranks)
    text = ",".join(map(str, ranks))
    out = []
    for r in ranks:
        for step in range(steps):
            for i, (kind, ts) in enumerate(kinds):
                t = step * 1_000_000 + ts
                c = Call(r, r, 0, i, step, pg, desc, kind, None, len(ranks), text, nbytes, "BFloat16", t, t + 100)
                out.append(Matched(c, i, f"{pg}|{step}|{i}", 0, None, len(ranks)))
    return out


def mesh(matched: list[Matched], world: int, configs: Iterable[object] = (), gpn: int | None = 8) -> Mesh:
    return infer(configs, matched, world, [gpn], host_timeline=False)


def test_fsdp_on_the_default_group_gathers_before_its_gradients() -> None:
    m = mesh(calls("0", "default_pg", range(8), [("allgather", 10), ("allgather", 20), ("reducescatter", 500)]), 8)
    assert m.dim_of("0") == "fsdp" and m.sharding == "fsdp"
    assert m.dims == {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 1}


def test_zero2_and_zero1_gather_after_the_gradients() -> None:
    tp = [x for d in range(2) for x in calls(f"t{d}", "TENSOR_MODEL_PARALLEL_GROUP", range(4 * d, 4 * d + 4),
                                             [("allreduce", 5)])]
    dp = [x for t in range(4) for x in calls(f"d{t}", "DATA_PARALLEL_GROUP", (t, t + 4),
                                             [("reducescatter", 500), ("allgather", 900)])]
    m = mesh(tp + dp, 8)
    assert (m.dims["tp"], m.dims["dp"], m.sharding) == (4, 2, "zero2")
    assert m.dim_of("d0") == "dp" and m.dim_of("t1") == "tp"
    dp1 = [x for t in range(4) for x in calls(f"d{t}", "DATA_PARALLEL_GROUP", (t, t + 4),
                                              [("allreduce", 500), ("allgather", 900)])]
    assert mesh(tp + dp1, 8).sharding == "zero1"


def test_hsdp_from_a_two_dimensional_device_mesh() -> None:
    config = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 16, "ranks": list(range(16))},
              {"pg_name": "1", "pg_desc": "mesh_dp_replicate", "pg_size": 2, "ranks": [0, 8]},
              {"pg_name": "2", "pg_desc": "mesh_dp_shard", "pg_size": 8, "ranks": list(range(8))}]
    m = mesh([], 16, [config])
    assert m.sharding == "hsdp" and m.dims["dp"] == 16
    assert [(g.name, g.dim, g.hosts, g.link) for g in m.groups] == [
        ("2", "fsdp", 1, "intra-node"), ("1", "dp", 2, "network"), ("0", "world", 2, "network")]


def test_undescribed_groups_by_their_traffic() -> None:
    tp = calls("5", "undefined", range(4), [("allreduce", 5), ("allreduce", 50)])
    dp = calls("6", "undefined", (0, 4), [("allreduce", 900)])
    ep = calls("7", None, (0, 1, 2, 3), [("alltoall", 10), ("alltoall", 60)])
    pp = calls("8", "undefined", (0, 8), [("sendrecv", 10), ("sendrecv", 20)])   # collectives.py's name for send, recv
    m = mesh(tp + dp + ep + pp, 16)
    assert [m.dim_of(n) for n in "5678"] == ["tp", "dp", "ep", "pp"]
    # Decided by traffic alone: nothing in the trace settles any degree.
    assert m.certain == ()
    assert m.dims == {"dp": 2, "tp": 4, "pp": 2, "cp": 1, "ep": 4}


def test_a_rank_s_pg_config_settles_the_degrees_when_only_some_ranks_were_traced() -> None:
    config = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 64, "ranks": list(range(64))},
              {"pg_name": "3", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "pg_size": 8, "ranks": list(range(8))},
              {"pg_name": "2", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP", "pg_size": 2, "ranks": [0, 32]}]
    m = mesh([], 64, [config])
    assert m.dims == {"dp": 4, "tp": 8, "pp": 2, "cp": 1, "ep": 1}
    assert set(m.certain) == {"dp", "tp", "pp", "cp", "ep"}
    assert m.spanning(["tp"]) == [] and [g.name for g in m.spanning(["pp"])] == ["2"]


def test_hosts_are_unknown_without_gpus() -> None:
    config = [{"pg_name": "1", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": [0, 1]}]
    m = infer([config], [], 4, [None], host_timeline=True)
    assert (m.groups[0].hosts, m.groups[0].link, m.gpus_per_host) == (None, None, None)
    assert "hosts unknown" in m.how


# ---- figures by hand on a generated run ---------------------------------------------------------

def test_by_dim_is_the_tensor_parallel_kernel_time_over_the_step(tmp_path: Path) -> None:
    """In tp_across_hosts the compute waits for every TP all-reduce and nothing runs beside it, so
    the TP share of the step is the TP kernels' time over the step windows (their waits for a late
    rank, a few µs of jitter a step, are inside the tolerance)."""
    truth = generate("tp_across_hosts", tmp_path, steps=2)
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    tp_ns = window_ns = 0
    for r in truth.ranks:
        doc = json.loads((tmp_path / r.file).read_text())
        for st in r.steps:
            window_ns += st.step_ns
            for e in doc["traceEvents"]:
                a = e.get("args") or {}
                if e.get("cat") == "kernel" and a.get("Process Group Description") == "TENSOR_MODEL_PARALLEL_GROUP":
                    start = round(e["ts"] * 1000)
                    if st.window_start_ns <= start < st.window_end_ns:
                        tp_ns += round(e["dur"] * 1000)
    mfu001 = next(f for f in report["findings"] if f["code"] == "MFU001")
    by_dim = mfu001["details"]["by_dim"]
    assert mfu001["details"]["by_dim"]["tp"] == pytest.approx(tp_ns / window_ns, abs=0.005)
    assert sum(mfu001["details"]["by_dim"].values()) == pytest.approx(mfu001["lost_fraction"], rel=1e-9)
    assert mfu001["summary"].startswith("tensor-parallel all-reduces: ")
    layout = next(f for f in report["findings"] if f["code"] == "MFU014")
    assert layout["details"]["exposed_fraction"] == mfu001["details"]["by_dim"]["tp"]
    assert (layout["details"]["dim"], layout["details"]["hosts"]) == ("tp", 2)
    # What NVLink would save: all but 50 of the 450 GB/s (IB NDR against NVLink 4, diag/knowledge/links.py).
    assert layout["recoverable_fraction"] == pytest.approx(layout["lost_fraction"] * (1 - 50 / 450))
    # The HTML report's mesh table: one row per kind of group, with MFU001's points for its dimension.
    assert mesh_rows(report) == [
        ["tp", "TENSOR_MODEL_PARALLEL_GROUP", "2", "8", "2", "network", f"{by_dim['tp'] * 100:.1f}"],
        ["dp", "DATA_PARALLEL_GROUP", "8", "2", "2", "network", f"{by_dim['dp'] * 100:.1f}"],
        ["world", "default_pg", "1", "16", "4", "network", ""]]


# ---- a real capture: torch DeviceMesh on gloo ---------------------------------------------------

MESH_JOB = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.distributed.device_mesh import init_device_mesh

    def worker(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=4)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        x = torch.ones(1024)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                dist.all_reduce(x, group=mesh.get_group("tp"))
                dist.all_reduce(torch.ones(4096), group=mesh.get_group("dp"))
                prof.step()
        prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
        dist.destroy_process_group()

    if __name__ == "__main__":
        # Forked rather than spawned: four fresh imports of torch took 24 s of this 2-core machine, a
        # fork 10 s; safe here, no CUDA context exists to be copied.
        mp.start_processes(worker, args=(sys.argv[1], int(sys.argv[2])), nprocs=4, start_method="fork")
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_device_mesh_capture_on_gloo_names_its_dimensions(tmp_path: Path) -> None:
    """4 processes in a 2 × 2 DeviceMesh ("dp", "tp"): torch names the groups mesh_dp and mesh_tp in
    each rank's distributedInfo.pg_config (a gloo capture has no collective fields), ~10 s here."""
    pytest.importorskip("torch")
    script = tmp_path / "mesh_job.py"
    script.write_text(MESH_JOB)
    out = tmp_path / "traces"
    out.mkdir()
    subprocess.run([sys.executable, str(script), str(out), str(_free_port())], check=True, timeout=240,
                   capture_output=True)
    _, report = analyze_path(str(out), None, AnalyzeOptions(), warn=False)
    p = report["parallelism"]
    assert p["dims"] == {"dp": 2, "tp": 2, "pp": 1, "cp": 1, "ep": 1}
    assert set(p["certain"]) == {"dp", "tp", "pp", "cp", "ep"}
    got = sorted((g["desc"], g["dim"], tuple(g["ranks"])) for g in p["groups"])
    assert got == [("default_pg", "world", (0, 1, 2, 3)), ("mesh_dp", "dp", (0, 2)), ("mesh_dp", "dp", (1, 3)),
                   ("mesh_tp", "tp", (0, 1)), ("mesh_tp", "tp", (2, 3))]
    assert all(g["hosts"] is None for g in p["groups"])   # no GPUs: hosts are not counted


def test_malformed_pg_config_is_read_as_far_as_it_goes() -> None:
    """Odd entries (ranks as text, a size that is not a number, a config that is not JSON) give a
    group without ranks or nothing, never a traceback."""
    configs = [[{"pg_name": "1", "pg_desc": "mesh_tp", "pg_size": "2", "ranks": ["a", 1]}, {"no": "name"}, 7],
               "{not json", {"2": {"desc": "mesh_dp", "ranks": "[0, 2]"}, "3": "x"}]
    m = infer(configs, [], 4, [8], host_timeline=False)
    assert [(g.name, g.dim, g.size, g.ranks) for g in m.groups] == [("1", "tp", None, None), ("2", "dp", 2, (0, 2))]


@pytest.mark.parametrize(("case", "exposed_gathers"), [("fsdp_no_prefetch", 4), ("fsdp_prefetch", 1)])
def test_fsdp_all_gathers_exposed_with_and_without_prefetch(case: str, exposed_gathers: int, tmp_path: Path) -> None:
    """A layer's all-gather moves S(p−1)/p of its 12·h² bf16 parameters at the ring's 100 GB/s, plus
    NCCL's 5 µs: 12 · 1024² · 2 B · 7/8 ÷ 100 GB/s = 220.2 µs + 5 µs. Without prefetch the compute
    waits for all 4 layers' all-gathers a step; with it only for the first, the others run beside the
    layer before. The mesh reads FSDP from the traffic: the default group gathers before it reduces."""
    generate(case, tmp_path, steps=2)
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    assert report["parallelism"]["sharding"] == "fsdp"
    assert [(g["name"], g["dim"]) for g in report["parallelism"]["groups"]] == [("0", "fsdp")]
    mfu001 = next(f for f in report["findings"] if f["code"] == "MFU001")
    gather = next(g for g in mfu001["details"]["groups"] if g["collective"] == "allgather")
    one = (12 * 1024**2 * 2 * 7 / 8 / 100e9 + 5e-6) * 1e3   # ms
    assert gather["exposed_ms_per_step"] == pytest.approx(exposed_gathers * one, rel=0.01)
    assert mfu001["summary"].startswith("FSDP all-gathers: ") and "forward_prefetch=True" in mfu001["advice"]


def test_an_fsdp_group_across_hosts_could_be_hsdp(tmp_path: Path) -> None:
    """fsdp_no_prefetch on 4-GPU hosts: the FSDP group spans 2 hosts and its all-gathers are exposed,
    so MFU014 names it with HSDP as the knob (on 8-GPU hosts, the case itself, it stays silent)."""
    generate(dataclasses.replace(load_case("fsdp_no_prefetch"), gpus_per_node=4), tmp_path, steps=2)
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    layout = next(f for f in report["findings"] if f["code"] == "MFU014")
    by_dim = next(f for f in report["findings"] if f["code"] == "MFU001")["details"]["by_dim"]
    assert (layout["details"]["dim"], layout["details"]["hosts"]) == ("fsdp", 2)
    assert layout["details"]["exposed_fraction"] == by_dim["fsdp"]
    assert layout["advice"].startswith("HSDP")


def test_too_little_gemm_per_tensor_parallel_collective(tmp_path: Path) -> None:
    """tp_intra_node with hidden 1024 over 1,024 tokens: 8-way TP leaves each all-reduce (2 MiB) ~17 µs
    of GEMM, under the 6.6 + 14 × 0.47 + 2 MiB · 7/4 ÷ 450 GB/s = 21 µs it needs on NVLink, so MFU014
    fires inside one host. gemm_us_per_collective is the analyzed steps' GEMM/attention kernel time
    over their TP kernels, counted from the trace."""
    s = dataclasses.replace(load_case("tp_intra_node"), hidden=1024, heads=8, head_dim=128, seq_len=1024)
    truth = generate(s, tmp_path, steps=2)
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    layout = next(f for f in report["findings"] if f["code"] == "MFU014")
    d = layout["details"]
    assert (d["dim"], d["hosts"], d["groups_spanning"]) == ("tp", 1, 0)
    floor_us = 6.6 + 14 * 0.47 + 2 * 2**20 * 7 / 4 / 450e9 * 1e6
    assert d["collective_floor_us"] == pytest.approx(floor_us, rel=1e-6)
    assert d["gemm_us_per_collective"] < d["collective_floor_us"]
    assert layout["advice"].startswith("a lower --tensor-model-parallel-size")
    matmul_ns = calls = 0
    for r in truth.ranks:
        doc = json.loads((tmp_path / r.file).read_text())
        for st in r.steps:
            for e in doc["traceEvents"]:
                start = round(e.get("ts", 0) * 1000)
                if e.get("cat") != "kernel" or not st.window_start_ns <= start < st.window_end_ns:
                    continue
                if e["args"].get("Process Group Description") == "TENSOR_MODEL_PARALLEL_GROUP":
                    calls += 1
                elif e["name"].startswith(("nvjet", "sm90_xmma_gemm", "void pytorch_flash::flash_")):   # GEMM, attention
                    matmul_ns += round(e["dur"] * 1000)
    assert d["gemm_us_per_collective"] == pytest.approx(matmul_ns / calls / 1e3, rel=0.01)


def _parallelism(dims: dict[str, int], groups: list[dict[str, object]], sharding: str | None = "none",
                 certain: tuple[str, ...] = DEGREES) -> dict[str, object]:
    full = dict.fromkeys(DEGREES, 1) | dims
    return {"parallelism": {"dims": full, "sharding": sharding, "groups": groups, "certain": list(certain)}}


def test_the_mesh_line_names_degrees_sharding_and_groups_across_hosts() -> None:
    tp = {"dim": "tp", "hosts": 2}
    assert mesh_line(_parallelism({"dp": 4, "tp": 2, "pp": 2}, [tp, {"dim": "dp", "hosts": 4}], "fsdp")) == \
        "mesh: dp 4 × tp 2 × pp 2 (fsdp), TP group spans 2 hosts"
    assert mesh_line(_parallelism({"dp": 8}, [{"dim": "dp", "hosts": 1}])) == "mesh: dp 8"
    assert mesh_line(_parallelism({"dp": 16}, [{"dim": "world", "hosts": None}], None, ())) == \
        "mesh: dp 16 (dp inferred from traffic)"
    # Not known: no process group in the trace, nothing wider than one, or an older report without the block.
    assert mesh_line(_parallelism({"dp": 16}, [], None, ())) is None
    assert mesh_line(_parallelism({}, [{"dim": "world", "hosts": 1}])) is None
    assert mesh_line({}) is None


def test_text_and_markdown_reports_show_the_mesh_line_made_inert(tmp_path: Path) -> None:
    generate("tp_across_hosts", tmp_path, steps=1)
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    line = "mesh: dp 2 × tp 8, TP group spans 2 hosts"
    assert render_text(report).splitlines()[3] == line
    assert line in render_markdown(report).splitlines()
    # The line passes through sanitize.py like every other: a control sequence in a value comes out inert.
    report["parallelism"]["sharding"] = "fsdp\x1b[2J"
    assert "\x1b" not in render_text(report) and "\x1b" not in render_markdown(report)


def test_hosts_come_from_the_host_names_in_the_file_names(tmp_path: Path) -> None:
    """tp_intra_node's TP groups fit an 8-GPU host by rank ÷ 8; with tensorboard_trace_handler's
    `{hostname}_{pid}` names putting even and odd ranks on two hosts, the names win and say so."""
    generate(dataclasses.replace(load_case("tp_intra_node"), naming="tensorboard"), tmp_path, steps=1)
    _, before = analyze_path(str(tmp_path), None, AnalyzeOptions(), warn=False)
    tp = [g for g in before["parallelism"]["groups"] if g["dim"] == "tp"]
    assert tp and all(g["hosts"] == 1 for g in tp) and "by the host names" in before["parallelism"]["how"]
    tp_names = {g["name"] for g in tp}
    links = {g["link"] for f in before["findings"] if f["code"] == "MFU001" for g in f["details"]["groups"]
             if g["pg"] in tp_names}
    assert links == {"NVLink"}
    for path in sorted(tmp_path.glob("*.pt.trace.json")):
        rank = json.loads(path.read_text())["distributedInfo"]["rank"]
        path.rename(path.with_name(path.name.replace(path.name.split("_")[0], f"node-{rank % 2}", 1)))
    _, after = analyze_path(str(tmp_path), None, AnalyzeOptions(), warn=False)
    tp = [g for g in after["parallelism"]["groups"] if g["dim"] == "tp"]
    assert tp and all(g["hosts"] == 2 and g["link"] == "network" for g in tp)
    p = after["parallelism"]
    assert f"by the host names in the trace files' names ({{hostname}}_{{pid}}) for {len(p['groups'])} of" in p["how"]
    # MFU001 judges the TP all-reduces' link by the same hosts: the network now, not NVLink.
    groups = next(f for f in after["findings"] if f["code"] == "MFU001")["details"]["groups"]
    assert {g["link"] for g in groups if g["pg"] in tp_names} == {"network (IB NDR)"}
