"""MFU001 exposed-collectives."""

from __future__ import annotations

import statistics
from collections import defaultdict

import msgspec

from diag.attribution.analysis import Finding, RunContext, StepContext, severity
from diag.attribution.ledger import StepLedger
from diag.attribution.mesh import exposed_by_dim
from diag.knowledge.links import LINKS, Link, Reach, bus_factor, normalize_collective, reach
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    # Under 1% of the step, exposed communication is the unavoidable tail of the last bucket.
    min_fraction: float = 0.01
    top_groups: int = 12
    # Bus bandwidth under this share of what the message size can reach on its link is slow.
    slow_vs_reach: float = 0.5


# What hides exposed communication in training depends on what it is: the largest group's kind
# picks the knobs. A gradient all-reduce is data parallelism (DDP, Megatron without the distributed
# optimizer) or a tensor-parallel layer's; all-gathers and reduce-scatters are sharded data
# parallelism (FSDP, ZeRO, Megatron's distributed optimizer) or sequence parallelism; an all-to-all
# is expert parallelism (MoE token dispatch and combine), sharded embeddings (recommendation models:
# HTA's sample traces are one) or Ulysses sequence parallelism. Send/recv is pipeline parallelism: MFU002.
_DP_ALLREDUCE = "overlap the gradient all-reduce with backward: DDP bucket_cap_mb, Megatron --overlap-grad-reduce"
_TRAINING_ADVICE = {
    "allreduce": f"{_DP_ALLREDUCE}; a tensor-parallel all-reduce: --sequence-parallel with --tp-comm-overlap",
    "allgather": "overlap parameter all-gathers and gradient reduce-scatters with compute: FSDP forward_prefetch=True "
                 "and backward_prefetch=BACKWARD_PRE (FSDP2: explicit forward/backward prefetch), Megatron's "
                 "distributed optimizer with --overlap-param-gather and --overlap-grad-reduce; sequence-parallel "
                 "all-gathers: --tp-comm-overlap",
    "alltoall": "overlap the all-to-all with compute: {moe}; {recommender}; Ulysses sequence parallelism: "
                "fewer ranks per sequence-parallel group",
    "": "overlap gradient communication with backward: DDP bucket_cap_mb, Megatron "
        "--overlap-grad-reduce/--overlap-param-gather, FSDP backward_prefetch/forward_prefetch; "
        "tensor-parallel: --tp-comm-overlap",
}
_TRAINING_ADVICE["reducescatter"] = _TRAINING_ADVICE["allgather"]
# An all-to-all's knobs by what the run is (workload_mix.family_of): MoE dispatch and combine, or
# sharded embeddings; a run of neither kind gets both, and Ulysses.
_ALLTOALL = {
    "moe": "MoE token dispatch and combine: Megatron --overlap-moe-expert-parallel-comm (with "
           "--delay-wgrad-compute), fewer expert-parallel ranks, each group within a node{ep}",
    "recommender": "sharded embeddings (TorchRec, fbgemm): a pipelined train loop (TrainPipelineSparseDist) that "
                   "runs the next batch's input and embedding all-to-alls beside this one's dense compute",
}
_DEEPEP = ", DeepEP or HybridEP (--moe-token-dispatcher-type flex)"
# DeepEP in use: its kernels stay resident and hold SMs; deep_ep.Buffer.set_num_sms sizes that share.
_DEEPEP_IN_USE = "; DeepEP is in use: size the SMs its kernels hold (deep_ep.Buffer.set_num_sms) against the GEMMs beside them"


def alltoall_advice(family: str, deepep: bool) -> str:
    """The all-to-all's knobs for this family, never recommending DeepEP to a run that has it."""
    moe = _ALLTOALL["moe"].format(ep=_DEEPEP_IN_USE if deepep else _DEEPEP)
    if family == "moe" or deepep:
        return f"overlap the all-to-all with compute: {moe}"
    if family == "recommender":
        return f"overlap the all-to-all with compute: {_ALLTOALL['recommender']}"
    return _TRAINING_ADVICE["alltoall"].format(moe=moe, recommender=_ALLTOALL["recommender"])


# Where the mesh names the dimension that loses the most, its own knobs come first (attribution/mesh.py);
# data-parallel, expert-parallel (alltoall_advice, which knows the run's family and DeepEP) and unnamed
# traffic keep the advice by kind.
_DIM_ADVICE = {
    "tp": "tensor-parallel: --sequence-parallel with --tp-comm-overlap to run its collectives beside the GEMMs, or "
          "a lower --tensor-model-parallel-size where the model fits",
    "fsdp": "FSDP: prefetch the next unit's all-gather (forward_prefetch=True, backward_prefetch=BACKWARD_PRE; "
            "FSDP2: set_modules_to_forward_prefetch / set_modules_to_backward_prefetch), reshard_after_forward=False "
            "for the last units; HSDP (a 2-D mesh, the shard dimension inside a node) keeps the all-gathers on NVLink",
    "cp": "context-parallel: overlap its KV exchange with the attention (ring attention's p2p; --cp-comm-type "
          "a2a+p2p for a hierarchical layout across nodes)",
}
# A group of these dimensions spanning hosts runs its traffic on the network: the first knob is the layout.
_INSIDE_A_NODE = {
    "tp": "keep each tensor-parallel group inside a node (--tensor-model-parallel-size at most the GPUs per node, "
          "TP fastest in the rank order)",
    "cp": "keep each context-parallel group inside a node (CP after TP in the rank order)",
    "ep": "keep each expert-parallel group inside a node (--expert-model-parallel-size at most the GPUs per node)",
    "fsdp": "shard within a node and replicate across nodes (HSDP: a 2-D DeviceMesh, or "
            "ShardingStrategy.HYBRID_SHARD)",
}
_DIM_WORDS = {"tp": "tensor-parallel", "fsdp": "FSDP", "dp": "data-parallel", "ep": "expert-parallel",
              "cp": "context-parallel", "pp": "pipeline", "world": "world-group", "other": "other"}
_PLURAL = {"allreduce": "all-reduces", "allgather": "all-gathers", "reducescatter": "reduce-scatters",
           "alltoall": "all-to-alls", "broadcast": "broadcasts", "reduce": "reduces"}

# How each kind sends fewer, larger messages when the largest group is latency-bound.
_LARGER_MESSAGES = {"allreduce": "a larger bucket_cap_mb", "allgather": "larger FSDP units",
                    "reducescatter": "larger FSDP units", "alltoall": "more tokens or samples per all-to-all"}


class ExposedCollectives(Rule[Params]):
    """Communication the compute does not hide.

    What it finds: time the GPU runs only communication kernels — no compute beside them —
    after the wait for late ranks (MFU005) and pipeline send/recv (MFU002) are taken out: the
    transfer part of exposed collectives. Grouped by process group, collective and size, with the
    bus bandwidth each achieved against what a message of that size can reach on the link it
    should run on (NVLink, or AMD's xGMI, inside a node; the network across nodes): NCCL's fixed cost per call plus
    the bytes at the link's bandwidth (diag/knowledge/links.py `reach`). A small message is latency-bound and
    gets no bandwidth verdict.

    Why it costs MFU: while a collective runs alone the tensor cores are idle; overlapping it
    with the backward pass (or the next layer's forward) hides it entirely.

    What to do, by the largest group's kind (_TRAINING_ADVICE): overlap gradient reduction with
    backward (DDP `bucket_cap_mb`, Megatron `--overlap-grad-reduce`/`--overlap-param-gather`, FSDP
    `backward_prefetch=BACKWARD_PRE`, `forward_prefetch=True`), tensor-parallel overlap
    (`--tp-comm-overlap`), expert-parallel overlap of the MoE all-to-all
    (`--overlap-moe-expert-parallel-comm`, DeepEP); when bus bandwidth
    is far below what the size can reach, check NCCL's topology and algorithm (NCCL_DEBUG=INFO,
    NCCL_ALGO); when latency-bound, send fewer, larger messages (a larger bucket_cap_mb).
    Inference (no backward pass): larger batches per forward, fewer tensor-parallel ranks, an
    all-reduce fused with the next norm (custom or symmetric-memory all-reduce, NVLS).
    """

    code = "MFU001"
    slug = "exposed-collectives"
    bucket = "exposed_comm"
    claim_order = 90
    Params = Params

    def claim(self, ctx: StepContext, ledger: StepLedger) -> None:
        ledger.claim("exposed_comm", ledger.pools["comm"], ("comm",))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("exposed_comm")
        if frac < self.params.min_fraction:
            return []
        groups = self._groups(run)
        ranks, steps = run.involved("exposed_comm", self.params.min_fraction)
        top = groups[: self.params.top_groups]
        slow = [g for g in top if g.slow(self.params.slow_vs_reach)]
        rank_steps = max(len(run.ledgers), 1)
        step_ms = sum(lg.window_s for lg in run.ledgers) / rank_steps * 1e3
        summary = (f"exposed communication {frac:.1%} of the step ({run.mean_seconds('exposed_comm') * 1e3:.2f} ms "
                   f"of {step_ms:.2f} ms, mean over ranks and steps)")
        if top:
            g = top[0]
            summary += (f"; largest: {g.collective} on group {g.pg} ({g.size_text}), "
                        f"{g.exposed_ms / rank_steps:.2f} ms of transfer exposed per step in {g.count} calls "
                        "over all ranks and steps")
            summary += g.bandwidth_text()
        by_dim, words, spans = _by_dim(run, frac)
        if words:
            summary = f"{words}; {summary}"
        kind = normalize_collective(top[0].collective) if top else None
        lead = next(iter(by_dim), None)
        advice = _DIM_ADVICE.get(lead or "") or (
            alltoall_advice(run.family.family, run.uses("deepep")) if kind == "alltoall"
            # The mesh says the all-reduces are data-parallel: no tensor-parallel knob beside them.
            else _DP_ALLREDUCE if lead == "dp" and kind == "allreduce"
            else _TRAINING_ADVICE.get(kind or "", _TRAINING_ADVICE[""]))
        if spans and lead in _INSIDE_A_NODE:
            advice = f"{_INSIDE_A_NODE[lead]}; {advice}"
        if run.inference:   # no gradients: what is exposed is tensor/expert-parallel traffic of the forward
            advice = ("hide the forward's collectives behind compute: larger batches per forward, fewer "
                      "tensor-parallel ranks (--tensor-parallel-size) where the model fits, all-reduce fused "
                      "with the next norm (custom or symmetric-memory all-reduce"
                      + (", NCCL NVLS" if run.vendor.key == "nvidia" else "") + "), --tp-comm-overlap")
        if slow:
            # RCCL reads the same NCCL_* variables (its environment-variable docs).
            advice += (f"; {len(slow)} group(s) reach under {self.params.slow_vs_reach:.0%} of the bus bandwidth "
                       f"their message size allows on their link: check {run.vendor.collectives} topology and "
                       "algorithm (NCCL_DEBUG=INFO, NCCL_ALGO, NCCL_IB_* settings)")
        if any(g.latency_bound for g in top[:1]):
            fewer = "larger batches per forward" if run.inference else _LARGER_MESSAGES.get(kind or "")
            ways = ", ".join([*([fewer] if fewer else []), "coalesced collectives"])
            advice += (f"; the largest group is latency-bound: fewer, larger messages ({ways}) amortize "
                       f"{run.vendor.collectives}'s fixed cost per call")
        evidence = [f"coll:{inst}" for g in top for inst in g.instances[:3]]
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("exposed_comm"), ranks, steps,
            evidence, advice, summary, run.what_if(frac),
            {"groups": [g.as_dict(rank_steps) for g in top], "by_dim": by_dim},
            bucket="exposed_comm", recoverable_fraction=frac,   # all of it: overlap hides it entirely
        )]

    def _groups(self, run: RunContext) -> list[_Group]:
        acc: dict[tuple[str, str, int | None], _Group] = {}
        nvlink = run.peak.nvlink_gbps or LINKS["nvlink4"].gbps
        vendor = run.vendor
        per_node = {r.rank: r.gpus_per_node for r in run.ranks}
        # Hosts the mesh counted by the host names the files carry beat rank ÷ GPUs per host.
        named = {g.name: g.hosts for g in run.mesh.groups if g.hosts_named} if run.mesh is not None else {}
        for mt in run.matched:
            c = mt.call
            if c.collective == "sendrecv":
                continue
            # Powers of two of the message size; None when the trace does not say it.
            size_class = c.msg_bytes.bit_length() if c.msg_bytes else None
            key = (c.pg_name, c.collective, size_class)
            g = acc.get(key)
            if g is None:
                g = acc[key] = _Group(c.pg_name, c.pg_desc, c.collective, fabric=vendor.link, library=vendor.collectives)
                if c.pg_name in named or c.group_ranks:
                    gpn = per_node.get(c.rank) or 8
                    one_node = (named[c.pg_name] == 1 if c.pg_name in named
                                else len({int(r) // gpn for r in (c.group_ranks or "").split(",")}) == 1)
                    g.link, g.link_gbps = (LINKS["nvlink4"], nvlink) if one_node else (LINKS["ib-ndr"], None)
            exposed = run.exposed_ns.get((c.file_id, c.act), 0)
            g.count += 1
            g.time_ms += (c.end_ns - c.ts_ns) / 1e6
            g.exposed_ms += exposed / 1e6
            if c.msg_bytes:
                g.sizes.append(c.msg_bytes)
            if exposed > 0:
                g.instances.append(mt.instance)
            transfer = (c.end_ns - c.ts_ns) - mt.wait_ns
            n = c.group_size or mt.n_matched
            if c.msg_bytes and transfer > 0 and n > 1 and normalize_collective(c.collective):
                g.busbw.append(c.msg_bytes / transfer * bus_factor(c.collective, n))  # bytes/ns = GB/s
                if g.link is not None:
                    g.reach.append(reach(c.collective, n, c.msg_bytes, g.link, g.link_gbps))
        return sorted(acc.values(), key=lambda g: -g.exposed_ms)


def _by_dim(run: RunContext, frac: float) -> tuple[dict[str, float], str, bool]:
    """The exposed fraction split over the mesh's dimensions in proportion to each one's exposed
    transfer time (largest first), and the summary's opening words for the largest where the mesh
    names it ("tensor-parallel all-reduces: 14.2 pts exposed, the tensor-parallel group spans 2 hosts"),
    and whether that dimension's groups span hosts."""
    ns = exposed_by_dim(run.mesh, run.matched, run.exposed_ns)
    total = sum(ns.values())
    if not total:
        return {}, "", False
    dims: dict[str, int] = defaultdict(int)
    for (d, _), v in ns.items():
        dims[d] += v
    by_dim = {d: frac * v / total for d, v in sorted(dims.items(), key=lambda x: (-x[1], x[0]))}
    lead = next(iter(by_dim))
    if run.mesh is None or lead in ("world", "other"):
        return by_dim, "", False
    kind = max((k for d, k in ns if d == lead), key=lambda k: ns[(lead, k)])
    words = f"{_DIM_WORDS[lead]} {_PLURAL.get(kind, kind)}: {by_dim[lead] * 100:.1f} pts exposed"
    spanning = run.mesh.spanning([lead]) if lead in ("tp", "cp", "ep", "fsdp") else []
    if spanning:
        words += f", the {_DIM_WORDS[lead]} group spans {max(g.hosts or 0 for g in spanning)} hosts"
    return by_dim, words, bool(spanning)


class _Group(msgspec.Struct):
    pg: str
    pg_desc: str | None
    collective: str
    count: int = 0
    time_ms: float = 0.0
    exposed_ms: float = 0.0       # over all ranks and steps: the transfer only, waits for late ranks taken out
    link: Link | None = None
    link_gbps: float | None = None  # the part's own NVLink figure, where known
    fabric: str = "NVLink"          # what the vendor calls the link inside a node (parts.toml [vendor.*])
    library: str = "NCCL"
    sizes: list[int] = msgspec.field(default_factory=list)
    busbw: list[float] = msgspec.field(default_factory=list)
    reach: list[Reach] = msgspec.field(default_factory=list)
    instances: list[str] = msgspec.field(default_factory=list)

    @property
    def msg_bytes(self) -> float | None:
        return statistics.median(self.sizes) if self.sizes else None

    @property
    def size_text(self) -> str:
        b = self.msg_bytes
        if b is None:
            return "size unknown"
        return f"{b / 2**20:.3g} MiB messages" if b >= 2**20 else f"{b / 2**10:.3g} KiB messages"

    @property
    def busbw_gbps(self) -> float | None:
        return statistics.median(self.busbw) if self.busbw else None

    @property
    def link_name(self) -> str | None:
        return None if self.link is None else self.fabric if self.link.key == "nvlink4" else "network (IB NDR)"

    @property
    def link_bw_gbps(self) -> float | None:
        return None if self.link is None else self.link_gbps or self.link.gbps

    @property
    def reach_gbps(self) -> float | None:
        """The median of what each call's size could reach on the link (links.reach)."""
        return statistics.median(r.busbw_gbps for r in self.reach) if self.reach else None

    @property
    def latency_bound(self) -> bool:
        return bool(self.reach) and statistics.median(r.latency_s / r.transfer_s for r in self.reach) >= 1

    @property
    def busbw_vs_reach(self) -> float | None:
        bw, can = self.busbw_gbps, self.reach_gbps
        return bw / can if bw is not None and can else None

    def slow(self, below: float) -> bool:
        ratio = self.busbw_vs_reach
        return ratio is not None and ratio < below and not self.latency_bound

    def bandwidth_text(self) -> str:
        bw, can = self.busbw_gbps, self.reach_gbps
        if bw is None or can is None:
            return ""
        if self.latency_bound:
            return (f", latency-bound: bus bandwidth {bw:.3g} GB/s where such messages can reach {can:.3g} GB/s "
                    f"on {self.link_name} ({self.library}'s fixed cost per call outweighs the bytes)")
        return (f", bus bandwidth {bw:.0f} GB/s: {bw / can:.0%} of the {can:.0f} GB/s this message size can "
                f"reach on {self.link_name} ({self.link_bw_gbps:.0f} GB/s)")

    def as_dict(self, rank_steps: int) -> dict[str, object]:
        b = self.msg_bytes
        return {
            "pg": self.pg, "pg_desc": self.pg_desc, "collective": self.collective,
            "msg_bytes": b, "size_mib": None if b is None else b / 2**20,
            "count": self.count, "time_ms": self.time_ms, "exposed_ms": self.exposed_ms,
            "exposed_ms_per_step": self.exposed_ms / rank_steps, "link": self.link_name,
            "link_gbps": self.link_bw_gbps, "busbw_gbps": self.busbw_gbps,
            "busbw_vs_link": None if self.busbw_gbps is None or not self.link_bw_gbps
            else self.busbw_gbps / self.link_bw_gbps,
            "reachable_busbw_gbps": self.reach_gbps, "busbw_vs_reachable": self.busbw_vs_reach,
            "latency_bound": self.latency_bound if self.reach else None,
        }
