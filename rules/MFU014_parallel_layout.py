"""MFU014 parallel-layout."""

from __future__ import annotations

import statistics

import msgspec

from diag.attribution.analysis import Finding, RunContext, severity
from diag.attribution.mesh import Mesh, exposed_by_dim
from diag.knowledge.links import LINKS, normalize_collective, reach
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    # Under 1% of the step a group on the network costs less than the noise of the ledger.
    min_fraction: float = 0.01


# The dimensions whose traffic sits on the critical path of every layer: on the network they cannot
# hide, whatever the overlap. Data parallelism and pipelines span nodes by design; FSDP's all-gathers
# are per layer too, and an FSDP group larger than a host can shard inside it and replicate across
# (HSDP), so they are judged as well where the run is not already HSDP.
_LAYER_DIMS = ("tp", "cp", "ep", "fsdp")
_WORDS = {"tp": "tensor-parallel", "cp": "context-parallel", "ep": "expert-parallel", "fsdp": "FSDP"}
_KNOB = {
    "tp": "--tensor-model-parallel-size at most the GPUs per node, TP fastest in the rank order "
          "(Megatron's default order tp-cp-ep-dp-pp; DeviceMesh: tp the last, innermost dimension)",
    "cp": "--context-parallel-size so that tp·cp fits a node, or --cp-comm-type a2a+p2p (hierarchical: "
          "all-to-all inside the node, p2p across)",
    "ep": "--expert-model-parallel-size at most the GPUs per node (or tp·ep when experts are tensor-parallel), "
          "or DeepEP's internode kernels with --moe-token-dispatcher-type flex",
    "fsdp": "HSDP: shard within a node and replicate across nodes (FSDP ShardingStrategy.HYBRID_SHARD, or "
            "fully_shard over a 2-D DeviceMesh (replicate, shard) with shard = the GPUs per node), so the "
            "all-gathers stay on NVLink and only the gradient all-reduce crosses the network",
}


class ParallelLayout(Rule[Params]):
    """A tensor-, context- or expert-parallel group that spans hosts, an FSDP group that could be HSDP,
    or tensor-parallel collectives with too little compute beside them to hide.

    What it finds: from the inferred mesh (diag/attribution/mesh.py: each process group's dimension,
    its ranks and the hosts they are on), a TP, CP or EP group whose ranks are on more than one host,
    and the exposed communication of that dimension (the share of MFU001's exposed transfer time on
    groups of that dimension); likewise an FSDP group spanning hosts in a run that is not HSDP (its
    all-gathers could stay inside a node). One finding per dimension, naming its widest group. For
    tensor parallelism also the GEMM/attention time per TP collective (the analyzed rank-steps' matmul
    kernel time over their TP calls) against the median call's floor at its size on its link
    (links.reach, α + β): under it no overlap can hide them, even inside a node.

    Why it costs MFU: these groups talk inside every layer, forward and backward; NVLink carries
    450 GB/s per H100, an NDR InfiniBand NIC 50 GB/s, so the same all-reduce or all-to-all takes about
    nine times as long once its ring leaves the node, and the next layer waits for it. The recoverable
    part is the exposed time less what the bytes would take on NVLink (1 − 50/450 of it).

    What to do: lay the mesh out so that the dimension fits a node — `--tensor-model-parallel-size`
    (or CP, EP) at most the GPUs per node, and that dimension fastest in the rank order; for MoE across
    nodes, DeepEP's internode kernels; for context parallelism, the hierarchical a2a+p2p; for FSDP,
    HSDP (shard inside a node, replicate across); for too little compute per TP collective, a lower
    TP degree, a larger micro-batch, or sequence parallelism.
    """

    code = "MFU014"
    slug = "parallel-layout"
    bucket = "exposed_comm"
    Params = Params

    def findings(self, run: RunContext) -> list[Finding]:
        mesh = run.mesh
        if mesh is None:
            return []
        spanning = mesh.spanning(_LAYER_DIMS)
        if mesh.sharding == "hsdp":   # already sharded inside and replicated across
            spanning = [g for g in spanning if g.dim != "fsdp"]
        hide = _compute_per_collective(run, mesh, "tp", run.peak.nvlink_gbps)
        thin = hide is not None and hide[0] < hide[1]
        if not spanning and not thin:
            return []
        frac = run.mean_fraction("exposed_comm")
        ns = exposed_by_dim(mesh, run.matched, run.exposed_ns)
        total = sum(ns.values())
        nvlink = run.peak.nvlink_gbps or LINKS["nvlink4"].gbps
        # The bytes at the network's bandwidth instead of NVLink's: all but network ÷ NVLink of the time.
        saved = 1 - LINKS["ib-ndr"].gbps / nvlink
        out = []
        for dim in _LAYER_DIMS:
            groups = [g for g in spanning if g.dim == dim]
            if not groups and not (dim == "tp" and thin):
                continue
            exposed = frac * sum(v for (d, _), v in ns.items() if d == dim) / total if total else 0.0
            if exposed < self.params.min_fraction:
                continue
            ranks, steps = run.involved("exposed_comm", 0.0)
            details: dict[str, object] = {"dim": dim}
            spans = bool(groups)
            # Spanning hosts: the bytes on NVLink instead of the network would win all but 50/450 of it.
            recoverable = exposed * saved if spans else 0.0
            if spans:
                widest = max(groups, key=lambda g: (g.hosts or 0, g.size or 0))
                summary = (f"{_WORDS[dim]} group {widest.name} ({widest.desc or 'no description'}, {widest.size} "
                           f"ranks) spans {widest.hosts} hosts ({len(groups)} such group(s)): its traffic runs on "
                           f"the network, and the {_WORDS[dim]} collectives leave {exposed:.1%} of the step exposed")
                advice = _KNOB[dim] if dim == "fsdp" else f"fit each {_WORDS[dim]} group in a node: {_KNOB[dim]}"
            else:
                groups = [g for g in mesh.groups if g.dim == dim]
                widest = max(groups, key=lambda g: (g.size or 0, g.name))
                summary, advice = "", ""
            if dim == "tp" and hide is not None:
                gemm_us, floor_us = hide
                details.update(gemm_us_per_collective=gemm_us, collective_floor_us=floor_us)
                if thin:
                    summary = "; ".join(filter(None, (summary, (
                        f"each tensor-parallel collective has {gemm_us:.0f} µs of GEMM work beside it, under the "
                        f"{floor_us:.0f} µs it takes at its size on its link at full bandwidth: no overlap can hide "
                        "it" + ("" if spans else f" ({exposed:.1%} of the step exposed)")))))
                    advice = "; ".join(filter(None, (advice, THIN_TP)))
                    # Too little compute per collective: overlap could hide gemm ÷ floor of it, no more;
                    # the rest is what fewer, larger collectives must win.
                    recoverable = max(recoverable, exposed * (1 - gemm_us / floor_us))
            # The groups' members that were traced (a group lists ranks a partial capture does not hold).
            traced = {r.rank for r in run.ranks}
            members = sorted({r for g in groups for r in g.ranks or ()} & traced)
            names = {g.name for g in groups}
            evidence = list(dict.fromkeys(
                f"coll:{m.instance}" for m in run.matched
                if m.call.pg_name in names and run.exposed_ns.get((m.call.file_id, m.call.act), 0) > 0))[:10]
            out.append(Finding(
                self.code, self.slug, severity(exposed * 100), exposed, exposed * _mean_step_s(run), members or ranks,
                steps, evidence, advice, summary, run.what_if(recoverable),
                {**details, "group": widest.name, "group_desc": widest.desc, "group_size": widest.size,
                 "hosts": widest.hosts, "groups_spanning": len(groups) if spans else 0,
                 "exposed_fraction": exposed, "knob": _KNOB[dim] if spans else THIN_TP,
                 "gpus_per_host": mesh.gpus_per_host},
                bucket="exposed_comm", recoverable_fraction=recoverable,
            ))
        return out


def _mean_step_s(run: RunContext) -> float:
    return sum(lg.window_s for lg in run.ledgers) / len(run.ledgers) if run.ledgers else 0.0


THIN_TP = ("a lower --tensor-model-parallel-size (more GEMM work per collective) or a larger micro-batch, "
           "--sequence-parallel (a reduce-scatter and an all-gather of half the bytes each in place of the all-reduce)")


def _compute_per_collective(run: RunContext, mesh: Mesh, dim: str, nvlink_gbps: float | None) -> tuple[float, float] | None:
    """(GEMM/attention µs per collective of that dimension, the median collective's floor in µs): the
    matmul kernel time of the analyzed rank-steps over the calls on groups of that dimension in them,
    against what each call's size takes on its group's link at full bandwidth plus NCCL's fixed cost
    (links.reach: the α-β time). Under 1, even a perfect overlap cannot hide the collectives."""
    steps = {(fid, st.step): st.matmul_ns for (fid, _), st in run.states.items()}
    link_of = {g.name: g.hosts for g in mesh.groups if g.dim == dim}
    calls = 0
    floors = []
    for m in run.matched:
        c = m.call
        if c.pg_name not in link_of or (c.file_id, c.step) not in steps:
            continue
        calls += 1
        n = c.group_size or m.n_matched
        if c.msg_bytes and n > 1 and normalize_collective(c.collective) not in (None, "sendrecv"):
            hosts = link_of[c.pg_name]
            link, gbps = (LINKS["nvlink4"], nvlink_gbps) if hosts == 1 else (LINKS["ib-ndr"], None)
            r = reach(c.collective, n, c.msg_bytes, link, gbps)
            floors.append((r.latency_s + r.transfer_s) * 1e6)
    if not calls or not floors:
        return None
    return sum(steps.values()) / calls / 1e3, statistics.median(floors)
