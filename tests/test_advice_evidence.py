"""Advice chosen by the evidence the report shows (issue 35): the vendor's own link, library and
tools; the workload family from the kernel mix; what the run already uses is never recommended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.attribution.workload_mix import family_of
from diag.knowledge import hardware
from diag.knowledge.links import LINKS
from rules.MFU001_exposed_collectives import _Group, alltoall_advice


@pytest.mark.parametrize("part", sorted({p.key for p in hardware.PARTS.values()}))
def test_every_part_names_a_vendor(part: str) -> None:
    p = hardware.PARTS[part]
    assert p.vendor in hardware.VENDORS
    # AMD's Instinct parts are AMD's; the rest NVIDIA's.
    assert (p.vendor == "amd") == p.key.startswith("mi")


def test_vendor_facts() -> None:
    amd, nvidia = hardware.VENDORS["amd"], hardware.VENDORS["nvidia"]
    assert "xGMI" in amd.link and amd.collectives == "RCCL" and "amd-smi" in amd.smi and "rocm-smi" in amd.smi
    assert nvidia.link == "NVLink" and nvidia.collectives == "NCCL" and nvidia.smi.startswith("nvidia-smi")
    assert hardware.vendor_of("mi300x", None) is amd
    assert hardware.vendor_of(None, "AMD Radeon Graphics") is amd          # HTA's MI250 capture's name
    assert hardware.vendor_of(None, "NVIDIA A100-PG509-200") is nvidia
    assert hardware.vendor_of(None, None) is hardware.UNKNOWN_VENDOR


def test_an_amd_group_is_judged_on_xgmi_with_rccl() -> None:
    """The issue's MI300X run read '31% of the 407 GB/s this size can reach on NVLink'."""
    amd = hardware.VENDORS["amd"]
    g = _Group("0", None, "allreduce", link=LINKS["nvlink4"], link_gbps=448.0, fabric=amd.link, library=amd.collectives)
    assert g.link_name == "xGMI (Infinity Fabric)"
    assert _Group("0", None, "allreduce", link=LINKS["ib-ndr"]).link_name == "network (IB NDR)"


def test_all_to_all_advice_follows_the_family_and_what_is_in_use() -> None:
    assert "DeepEP or HybridEP" not in alltoall_advice("moe", deepep=True)
    assert "deep_ep.Buffer.set_num_sms" in alltoall_advice("moe", deepep=True)
    assert "DeepEP or HybridEP" in alltoall_advice("moe", deepep=False)
    rec = alltoall_advice("recommender", deepep=False)
    assert "TrainPipelineSparseDist" in rec and "MoE" not in rec and "Ulysses" not in rec
    other = alltoall_advice("other", deepep=False)
    assert "TrainPipelineSparseDist" in other and "MoE" in other and "Ulysses" in other


def test_family_from_the_kernel_mix() -> None:
    base = {"kernel": 1000, "gemm": 600, "conv": 0, "attention": 0, "embedding": 0, "moe": 0}
    assert family_of(base | {"conv": 400}, set()).family == "convnet"
    assert family_of(base | {"conv": 200}, set()).family == "other"
    assert family_of(base | {"attention": 50}, set()).family == "transformer"
    assert family_of(base | {"embedding": 30, "attention": 50}, set()).family == "recommender"
    assert family_of(base, {"embedding_tables"}).family == "recommender"
    assert family_of(base | {"moe": 150, "attention": 50}, set()).family == "moe"
    moe = family_of(base | {"attention": 50}, {"deepep"})
    assert moe.family == "moe" and any("DeepEP" in e for e in moe.evidence)
    assert family_of({}, set()).family == "other"


def _resident_trace() -> dict[str, object]:
    """One 2 ms step on an H100: four bf16 4096³ GEMMs of 400 µs each (139 µs at the dense peak:
    slow), and a DeepEP dispatch kernel of 24 blocks resident from 20 µs to 1,820 µs beside them."""
    from test_host_parts import _launch, _x, build  # the issue-35 trace builder's pieces

    doc = build(with_stack=False)
    ev: list[dict[str, object]] = [_x("user_annotation", "ProfilerStep#1", 0, 2000)]
    dims = {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}
    for i in range(4):
        t = 10 + 450 * i
        ev += [_x("cpu_op", "aten::mm", t, 8, **{"External id": 10 + i}, **dims),
               *_launch(10 + i, 10 + i, t + 1, 5, t + 10, 400, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")]
    dispatch = _launch(99, 99, 12, 5, 20, 1800, "void dpsk::ep::internode::dispatch<false, 4>(int4*, float*)")
    dispatch[1]["tid"] = 20
    dispatch[1]["args"] = {**dispatch[1]["args"], "stream": 20, "grid": [24, 1, 1], "block": [768, 1, 1]}  # type: ignore[dict-item]
    ev += [_x("cpu_op", "deep_ep::dispatch", 11, 8, **{"External id": 99}), *dispatch]
    doc["traceEvents"] = ev
    return doc


def test_resident_communication_is_evidence_beside_the_slow_gemms(tmp_path: Path) -> None:
    from diag.api import analyze_path
    from diag.ingest.pipeline import IngestOptions

    f = tmp_path / "resident.pt.trace.json"
    f.write_text(json.dumps(_resident_trace()))
    _, report = analyze_path(str(f), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    [slow] = [x for x in report["findings"] if x["code"] == "MFU009"]
    beside = slow["details"]["resident_comm"]
    # By construction: the GEMMs' 1,600 µs all lie under the dispatch kernel; the step is 2 ms.
    assert beside["share_of_step_beside_gemms"] == pytest.approx(1600 / (report["step_time_s"] * 1e6), rel=1e-6)
    assert beside["sms_held"] == 24 and beside["sms"] == 132
    assert "holding 24 of 132 SMs" in slow["advice"] and "deep_ep.Buffer.set_num_sms" in slow["advice"]
    assert report["workload_family"]["family"] == "moe" and "deepep" in report["workload_family"]["uses"]


def _eager_serving_trace(op: str, kernel: str) -> dict[str, object]:
    """One 2 ms step of 40 host ops of 40 µs, each launching one 4 µs kernel (the host holds the
    GPU: host-bound), with no graph launch: a serving engine run eager."""
    from test_host_parts import _launch, _x, build

    doc = build(with_stack=False)
    ev: list[dict[str, object]] = [_x("user_annotation", "ProfilerStep#1", 0, 2000)]
    for i in range(40):
        t = 10 + 48 * i
        ev += [_x("cpu_op", op, t, 40, **{"External id": 100 + i}),
               *_launch(100 + i, 100 + i, t + 30, 5, t + 36, 4, kernel)]
    doc["traceEvents"] = ev
    return doc


@pytest.mark.parametrize(("op", "kernel", "engine", "knob"), [
    ("_C::rms_norm", "void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, c10::BFloat16 const*, long, "
     "c10::BFloat16 const*, float, int, int)", "vllm", "enforce_eager"),
    ("sgl_kernel::rmsnorm", "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*)", "sglang",
     "--disable-cuda-graph"),
    ("aten::add", "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)", None,
     'torch.compile(mode="reduce-overhead")'),
])
def test_cuda_graph_advice_names_the_serving_engines_switch(tmp_path: Path, op: str, kernel: str,
                                                            engine: str | None, knob: str) -> None:
    """A vLLM or SGLang run with no graph launches is told its own switch (vLLM's enforce_eager,
    SGLang's --disable-cuda-graph), not torch.compile's mode, which it does not call."""
    from diag.api import analyze_path
    from diag.ingest.pipeline import IngestOptions

    f = tmp_path / "serving.pt.trace.json"
    f.write_text(json.dumps(_eager_serving_trace(op, kernel)))
    _, report = analyze_path(str(f), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    [host] = [x for x in report["findings"] if x["code"] == "MFU010"]
    assert knob in host["advice"]
    uses = report["workload_family"]["uses"]
    assert (engine in uses) if engine else not {"vllm", "sglang"} & set(uses)
    others = {"enforce_eager", "--disable-cuda-graph", 'torch.compile(mode="reduce-overhead")'} - {knob}
    assert not [o for o in others if o in host["advice"]], host["advice"]
