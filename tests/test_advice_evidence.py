"""Advice chosen by the evidence the report shows (issue 35): the vendor's own link, library and
tools; the workload family from the kernel mix; what the run already uses is never recommended."""

from __future__ import annotations

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
