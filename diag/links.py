"""Link bandwidths and the NCCL bus-bandwidth factor: what a collective should have taken.

A collective of S bytes over n ranks moves `S x bus_factor(collective, n)` bytes through each
rank's link (nccl-tests, doc/PERFORMANCE.md, "Bus bandwidth"). Bus bandwidth = that volume /
time, and it is comparable with the link it ran on whatever n is: an all-reduce showing 90 GB/s
of bus bandwidth inside an H100 node (NVLink, 450 GB/s) is far from its link; across nodes on
IB NDR (50 GB/s) it would be impossible, so it stayed on NVLink.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Link:
    key: str
    name: str
    gbps: float  # GB/s per GPU, one direction


# DESIGN.md's figures, one direction per GPU.
LINKS: Mapping[str, Link] = MappingProxyType(
    {
        "hbm3": Link("hbm3", "HBM3 (H100 SXM)", 3350.0),  # H100 SXM datasheet: 3.35 TB/s
        "nvlink4": Link("nvlink4", "NVLink 4 (H100/H200 SXM)", 450.0),  # 900 GB/s bidirectional
        "ib-ndr": Link("ib-ndr", "InfiniBand NDR 400 Gb/s", 50.0),  # one 400 Gb/s NIC per GPU
        "pcie5": Link("pcie5", "PCIe Gen5 x16", 64.0),  # 128 GB/s bidirectional
    }
)


# NCCL kernel / c10d "Collective name" spellings -> one name per collective. Order matters:
# reducescatter before reduce, allgather before gather. c10d writes e.g. `_allgather_base`,
# `all_gather_into_tensor_coalesced`, `_reduce_scatter_base`, `allreduce_coalesced`, `send`.
_COLLECTIVE_PREFIXES = (
    ("allreduce", "allreduce"),
    ("reducescatter", "reducescatter"),
    ("allgather", "allgather"),
    ("alltoall", "alltoall"),
    ("broadcast", "broadcast"),
    ("reduce", "reduce"),
    ("sendrecv", "sendrecv"),
    ("send", "sendrecv"),
    ("recv", "sendrecv"),
    ("batchisendirecv", "sendrecv"),
)


def normalize_collective(name: str) -> str | None:
    """allreduce | allgather | reducescatter | broadcast | reduce | alltoall | sendrecv, or None."""
    squashed = re.sub(r"[^a-z]", "", name.lower())
    for prefix, collective in _COLLECTIVE_PREFIXES:
        if squashed.startswith(prefix):
            return collective
    return None


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw x this factor, for n ranks.

    AllReduce 2(n-1)/n; ReduceScatter, AllGather, AlltoAll (n-1)/n; Broadcast, Reduce 1;
    Send/Recv 1 (point to point: algbw is the link's own bandwidth).
    """
    if n < 1:
        raise ValueError(f"a collective needs at least one rank, got n={n}")
    kind = normalize_collective(collective)
    if kind == "allreduce":
        return 2 * (n - 1) / n
    if kind in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    if kind in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"no bus-bandwidth factor for collective {collective!r}")
