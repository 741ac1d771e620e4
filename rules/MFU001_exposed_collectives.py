"""MFU001 exposed-collectives."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from diag.analysis import Finding, RunContext, StepContext, severity
from diag.ledger import StepLedger
from diag.links import LINKS, bus_factor, normalize_collective
from rules.base import Rule


@dataclass(frozen=True)
class Params:
    # Under 1% of the step, exposed communication is the unavoidable tail of the last bucket.
    min_fraction: float = 0.01
    # Collectives are grouped by size in powers of two of this base (1 MiB, 2 MiB, ...).
    size_base_bytes: int = 1 << 20
    top_groups: int = 12


class ExposedCollectives(Rule[Params]):
    """Communication the compute does not hide.

    What it finds: time the GPU runs only communication kernels — no compute beside them —
    after the wait for late ranks (MFU005) and pipeline send/recv (MFU002) are taken out: the
    transfer part of exposed collectives. Grouped by process group, collective and size, with the
    bus bandwidth each achieved against the link it should run on (NVLink inside a node, the
    network across nodes).

    Why it costs MFU: while a collective runs alone the tensor cores are idle; overlapping it
    with the backward pass (or the next layer's forward) hides it entirely.

    What to do: overlap gradient reduction with backward (DDP `bucket_cap_mb`, Megatron
    `--overlap-grad-reduce`/`--overlap-param-gather`, FSDP `backward_prefetch=BACKWARD_PRE`,
    `forward_prefetch=True`), tensor-parallel overlap (`--tp-comm-overlap`); when bus bandwidth
    is far below the link, check NCCL's topology and algorithm (NCCL_DEBUG=INFO, NCCL_ALGO).
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
        slow = [g for g in top if g.busbw_vs_link is not None and g.busbw_vs_link < 0.5]
        summary = f"exposed communication {frac:.1%} of the step"
        if top:
            g = top[0]
            summary += (f"; largest: {g.collective} on group {g.pg} (~{g.size_mib:.3g} MiB messages), "
                        f"{g.exposed_ms:.2f} ms exposed in {g.count} calls over all ranks and steps")
            if g.busbw_gbps is not None and g.link_gbps:
                summary += f", bus bandwidth {g.busbw_gbps:.0f} GB/s against {g.link} {g.link_gbps:.0f} GB/s"
        advice = ("overlap gradient communication with backward: DDP bucket_cap_mb, Megatron "
                  "--overlap-grad-reduce/--overlap-param-gather, FSDP backward_prefetch/forward_prefetch; "
                  "tensor-parallel: --tp-comm-overlap")
        if slow:
            advice += (f"; {len(slow)} group(s) reach under half their link's bandwidth: check NCCL topology "
                       "and algorithm (NCCL_DEBUG=INFO, NCCL_ALGO, NCCL_IB_* settings)")
        evidence = [f"coll:{inst}" for g in top for inst in g.instances[:3]]
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("exposed_comm"), ranks, steps,
            evidence, advice, summary, run.what_if(frac),
            {"groups": [g.as_dict() for g in top]},
        )]

    def _groups(self, run: RunContext) -> list[_Group]:
        acc: dict[tuple[str, str, int], _Group] = {}
        nvlink = run.peak.nvlink_gbps or LINKS["nvlink4"].gbps
        per_node = {r.rank: r.gpus_per_node for r in run.ranks}
        for mt in run.matched:
            c = mt.call
            if c.collective == "sendrecv":
                continue
            size = c.msg_bytes or 0
            bucket = 0 if size <= 0 else max(size.bit_length() - self.params.size_base_bytes.bit_length(), 0)
            key = (c.pg_name, c.collective, bucket)
            g = acc.get(key)
            if g is None:
                g = acc[key] = _Group(c.pg_name, c.pg_desc, c.collective,
                                      (self.params.size_base_bytes << bucket) / 2**20)
                if c.group_ranks:
                    gpn = per_node.get(c.rank) or 8
                    one_node = len({int(r) // gpn for r in c.group_ranks.split(",")}) == 1
                    g.link, g.link_gbps = ("NVLink", nvlink) if one_node else ("network (IB NDR)", LINKS["ib-ndr"].gbps)
            exposed = run.exposed_ns.get((c.file_id, c.act), 0)
            g.count += 1
            g.time_ms += (c.end_ns - c.ts_ns) / 1e6
            g.exposed_ms += exposed / 1e6
            if exposed > 0:
                g.instances.append(mt.instance)
            transfer = (c.end_ns - c.ts_ns) - mt.wait_ns
            n = c.group_size or mt.n_matched
            if c.msg_bytes and transfer > 0 and n > 1 and normalize_collective(c.collective):
                g.busbw.append(c.msg_bytes / transfer * bus_factor(c.collective, n))  # bytes/ns = GB/s
        return sorted(acc.values(), key=lambda g: -g.exposed_ms)


@dataclass
class _Group:
    pg: str
    pg_desc: str | None
    collective: str
    size_mib: float
    count: int = 0
    time_ms: float = 0.0
    exposed_ms: float = 0.0
    link: str | None = None
    link_gbps: float | None = None
    busbw: list[float] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)

    @property
    def busbw_gbps(self) -> float | None:
        return statistics.median(self.busbw) if self.busbw else None

    @property
    def busbw_vs_link(self) -> float | None:
        bw = self.busbw_gbps
        return bw / self.link_gbps if bw is not None and self.link_gbps else None

    def as_dict(self) -> dict[str, object]:
        return {
            "pg": self.pg, "pg_desc": self.pg_desc, "collective": self.collective, "size_mib": self.size_mib,
            "count": self.count, "time_ms": self.time_ms, "exposed_ms": self.exposed_ms, "link": self.link,
            "link_gbps": self.link_gbps, "busbw_gbps": self.busbw_gbps, "busbw_vs_link": self.busbw_vs_link,
        }
