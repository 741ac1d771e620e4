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
from types import MappingProxyType

import msgspec


class Link(msgspec.Struct, frozen=True):
    key: str
    name: str
    gbps: float  # GB/s per GPU, one direction
    step_us: float | None = None  # NCCL's latency per ring step over this link (None: not a NCCL link)


# DESIGN.md's figures, one direction per GPU. Per-step latencies: NCCL's cost model (NVIDIA/nccl
# src/graph/tuning.cc, hwLat, Ring with the LL protocol, its fastest for small messages): NVLink
# 0.47 µs, PCIe 1.0 µs, network 2.7 µs per ring step.
LINKS: Mapping[str, Link] = MappingProxyType(
    {
        "hbm3": Link("hbm3", "HBM3 (H100 SXM)", 3350.0),  # H100 SXM datasheet: 3.35 TB/s
        "nvlink4": Link("nvlink4", "NVLink 4 (H100/H200 SXM)", 450.0, 0.47),  # 900 GB/s bidirectional
        "ib-ndr": Link("ib-ndr", "InfiniBand NDR 400 Gb/s", 50.0, 2.7),  # one 400 Gb/s NIC per GPU
        "pcie5": Link("pcie5", "PCIe Gen5 x16", 64.0, 1.0),  # 128 GB/s bidirectional
    }
)

# The same model's fixed cost of a ring collective with the LL protocol (tuning.cc, baseLat): 6.6 µs.
NCCL_BASE_US = 6.6


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


def ring_steps(collective: str, n: int) -> int:
    """Steps a ring takes for n ranks (tuning.cc's nsteps): all-reduce 2(n-1), all-gather,
    reduce-scatter and all-to-all n-1, broadcast and reduce n-1 hops down the chain, send/recv 1."""
    kind = normalize_collective(collective)
    if kind == "allreduce":
        return 2 * (n - 1)
    if kind == "sendrecv":
        return 1
    if kind is None:
        raise ValueError(f"no ring model for collective {collective!r}")
    return n - 1


class Reach(msgspec.Struct, frozen=True):
    """What a collective of this size can do on a link, by the α-β model: T = α + volume / bandwidth."""

    latency_s: float      # α: NCCL_BASE_US + ring_steps × the link's step latency
    transfer_s: float     # β term: the bus volume S × bus_factor at the link's bandwidth
    busbw_gbps: float     # the best bus bandwidth such a call can show: volume / (α + β)

    @property
    def latency_bound(self) -> bool:
        """The fixed cost outweighs the bytes: bandwidth says nothing about the link."""
        return self.latency_s >= self.transfer_s


def reach(collective: str, n: int, msg_bytes: int, link: Link, gbps: float | None = None) -> Reach:
    """`gbps` overrides the link's bandwidth (the identified part's NVLink, say)."""
    volume = msg_bytes * bus_factor(collective, n)
    alpha = (NCCL_BASE_US + ring_steps(collective, n) * (link.step_us or 0.0)) * 1e-6
    beta = volume / ((gbps or link.gbps) * 1e9)
    return Reach(alpha, beta, volume / (alpha + beta) / 1e9)
