"""The parallel layout of the run, inferred: each process group's dimension, size, hosts and link.

A training engineer thinks in the mesh (DP × TP × PP × CP × EP, FSDP or ZeRO on top); the trace
holds every process group a rank belongs to (`distributedInfo.pg_config`), the group of each
collective (`Process Group Name/Description/Ranks`), and what each group carried. A group's
dimension comes from its description where a framework named it (data/process_groups.toml:
Megatron's TENSOR_MODEL_PARALLEL_GROUP, DeviceMesh's mesh_tp, ...), else from its traffic:
send/recv only is a pipeline, all-to-all is expert parallelism, parameter all-gathers before the
step's first gradient collective are FSDP, all-reduces within a run of consecutive ranks that fits
a host are tensor parallelism (Megatron places TP fastest), other all-reduces data parallelism.

Hosts are the host names the trace files carry where every rank of a group has one
(tensorboard_trace_handler names its files `{hostname}_{pid}.{time_ns}.pt.trace.json`), else rank ÷
GPUs per host (deviceProperties lists a host's GPUs), as MFU001 counts them; `how` says which. A
group on one host talks over NVLink/xGMI (`intra-node`), one spanning hosts over the `network`.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

import msgspec

from diag.knowledge.links import normalize_collective
from diag.knowledge.process_groups import TABLE, named
from diag.timeline.collectives import Matched

# Dimensions in the report's order; `dims` gives the degree of the first five.
DEGREES = ("dp", "tp", "pp", "cp", "ep")
DIM_ORDER = {d: i for i, d in enumerate(("tp", "cp", "ep", "pp", "fsdp", "dp", "world", "other"))}
DEFAULT_GPUS_PER_HOST = 8   # an HGX/DGX node; MFU001 assumes the same where deviceProperties is missing
MAX_GROUPS = 64             # rows of the report's table; a 1,000-GPU job has hundreds of groups
_GRADIENT = ("reducescatter", "allreduce")


class MeshGroup(msgspec.Struct, frozen=True):
    name: str
    desc: str | None
    dim: str                        # dp | fsdp | tp | cp | ep | pp | world | other
    size: int | None
    ranks: tuple[int, ...] | None   # global ranks, where a source lists them
    hosts: int | None               # hosts its ranks span (None: unknown)
    link: str | None                # "intra-node" | "network" (None: unknown)
    evidence: str
    traffic: dict[str, int]         # collective kind → calls seen on it, all ranks and steps
    hosts_named: bool = False       # hosts counted by the host names in the files' names (`how` says so)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "desc": self.desc, "dim": self.dim, "size": self.size, "hosts": self.hosts,
                "link": self.link, "evidence": self.evidence, "traffic": self.traffic,
                "ranks": None if self.ranks is None else list(self.ranks)}


class Mesh(msgspec.Struct, frozen=True):
    dims: dict[str, int]            # dp, tp, pp, cp, ep → degree
    sharding: str | None            # none | zero1 | zero2 | fsdp | hsdp; None: no data-parallel traffic seen
    groups: tuple[MeshGroup, ...]
    how: str
    certain: tuple[str, ...]        # the degrees the trace settles; the others are inferred from traffic
    gpus_per_host: int | None
    dim_by_name: dict[str, str]     # group name → dimension, for the rules' per-call lookups

    def dim_of(self, pg_name: str | None) -> str:
        """The dimension of the group of that name ("other" where the trace does not say)."""
        return self.dim_by_name.get(pg_name or "", "other")

    def spanning(self, dims: Sequence[str]) -> list[MeshGroup]:
        """Groups of these dimensions whose ranks span more than one host."""
        return [g for g in self.groups if g.dim in dims and g.hosts is not None and g.hosts > 1]

    def as_report(self) -> dict[str, Any]:
        shown = self.groups[:MAX_GROUPS]
        return {"dims": self.dims, "sharding": self.sharding, "groups": [g.as_dict() for g in shown],
                "groups_total": len(self.groups), "certain": list(self.certain), "how": self.how}


class _Acc(msgspec.Struct):
    """What the sources say of one group, gathered before it is judged."""

    desc: str | None = None
    size: int | None = None
    ranks: tuple[int, ...] | None = None
    listed: bool = False            # in some rank's pg_config
    traffic: Counter[str] = msgspec.field(default_factory=Counter)
    # (rank, window, step) → [first all-gather, first gradient collective] start, ns
    firsts: dict[tuple[int, int, int | None], list[int | None]] = msgspec.field(default_factory=dict)

    def gathers_first(self) -> bool:
        """All-gathers before the step's first gradient collective on most rank-steps: parameters
        gathered for the forward (FSDP, ZeRO-3), not after the optimizer (ZeRO-1/2)."""
        seen = [(ag, grad) for ag, grad in self.firsts.values() if ag is not None]
        first = sum(grad is None or ag < grad for ag, grad in seen)
        return bool(seen) and first * 2 > len(seen)


def infer(pg_configs: Iterable[Any], matched: Sequence[Matched], world: int, gpus_per_host: Iterable[int | None],
          host_timeline: bool, nccl_groups: Iterable[tuple[str, str | None, int | None]] = (),
          config_ranks: int | None = None, host_of: Mapping[int, str] | None = None) -> Mesh:
    """`pg_configs`: traced ranks' distributedInfo.pg_config (list or mapping, as written, or JSON text
    of one; the engine passes the entries of all ranks made distinct as one list, and `config_ranks`,
    how many ranks listed them); `nccl_groups`: (name, desc, size) of the groups Flight Recorder names;
    `host_of`: global rank → the host name its trace file carries, where one does."""
    groups: dict[str, _Acc] = defaultdict(_Acc)
    configs = 0
    for cfg in pg_configs:
        configs += _read_config(cfg, groups)
    for name, desc, size in nccl_groups:
        _note(groups[name], desc, size, None)
    # One pass over every call (a 128-rank run has about a million) into flat dicts, each group's
    # fields noted once per distinct spelling: 1M calls take ~1.1 s here (1.3 s object by object), and
    # parsing every call's rank list took 0.12 s for 4,096 calls of a 64-rank group.
    fields: set[tuple[str, str | None, str | None, int | None]] = set()
    counts: Counter[tuple[str, str]] = Counter()              # (group, collective as named) → calls
    firsts: dict[tuple[str, int, int, int, int | None], int] = {}   # (group, slot, rank, window, step) → start
    for m in matched:
        c = m.call
        name = c.pg_name
        if name in ("", "unknown"):
            continue
        fields.add((name, c.pg_desc, c.group_ranks, c.group_size))
        counts[(name, c.collective)] += 1
        slot = _slot(c.collective)
        if slot >= 0:
            key = (name, slot, c.rank, c.window, c.step)
            t = firsts.get(key)
            if t is None or c.ts_ns < t:
                firsts[key] = c.ts_ns
    for name, desc, text, size in sorted(fields, key=str):
        _note(groups[name], desc, size, _ranks_text(text))
    for (name, coll), n in counts.items():
        groups[name].traffic[_kind(coll)] += n
    for (name, slot, rank, window, step), t in firsts.items():
        groups[name].firsts.setdefault((rank, window, step), [None, None])[slot] = t
    configs = configs if config_ranks is None else config_ranks
    per_host = sorted({g for g in gpus_per_host if g})
    gpn = per_host[-1] if per_host else None if host_timeline else DEFAULT_GPUS_PER_HOST
    judged = {name: _judge(acc, world, gpn) for name, acc in groups.items()}
    _world_as_data_parallel(judged, groups, world)
    host_of = host_of or {}
    out = tuple(sorted((_group(name, acc, *judged[name], gpn, host_of) for name, acc in groups.items()),
                       key=lambda g: (DIM_ORDER[g.dim], g.size or 0, _name_key(g.name))))
    dims, certain = _degrees(out, world, configs > 0)
    how = (f"groups from {'distributedInfo.pg_config of ' + str(configs) + ' rank(s) and ' if configs else ''}"
           f"{len(matched)} collective calls' process-group fields; dimension by the group's description "
           f"(diag/knowledge/{TABLE}), else by its traffic; ")
    by_rank = (f"rank ÷ {gpn} GPUs per host" + (" (deviceProperties)" if per_host else
                                                 " (assumed: no deviceProperties)")) if gpn else None
    by_name = sum(1 for g in groups.values() if _named_hosts(g, host_of) is not None)
    if by_name:
        how += (f"hosts by the host names in the trace files' names ({{hostname}}_{{pid}}) for {by_name} of "
                f"{len(groups)} group(s)" + ("" if by_name == len(groups) else
                                             f", the others {by_rank or 'unknown (no GPUs in the trace)'}"))
    else:
        how += f"hosts as {by_rank}" if by_rank else "hosts unknown (no GPUs in the trace)"
    return Mesh(dims, _sharding(out, groups), out, how, certain, gpn, {g.name: g.dim for g in out})


def _read_config(cfg: Any, groups: dict[str, _Acc]) -> int:
    """One rank's pg_config: Kineto writes a list of {pg_name, pg_desc, pg_size, ranks}; Flight
    Recorder (and older Kineto) a mapping name → {desc, ranks: "[0, 1]"}. Returns 1 if it listed any."""
    if isinstance(cfg, str):
        try:
            cfg = json.loads(cfg)
        except ValueError:
            return 0
    rows: list[tuple[str, Any]] = []
    if isinstance(cfg, list):
        rows = [(str(r.get("pg_name")), r) for r in cfg if isinstance(r, dict) and r.get("pg_name") is not None]
    elif isinstance(cfg, Mapping):
        rows = [(str(k), r) for k, r in cfg.items() if isinstance(r, Mapping)]
    for name, r in rows:
        ranks = r.get("ranks")
        parsed = _ranks_text(ranks) if isinstance(ranks, str) else tuple(ranks) \
            if isinstance(ranks, list) and ranks and all(type(x) is int for x in ranks) else None
        size = r.get("pg_size") if type(r.get("pg_size")) is int else None
        acc = groups[name]
        acc.listed = True
        _note(acc, r.get("pg_desc", r.get("desc")), size, parsed)
    return 1 if rows else 0


def _note(acc: _Acc, desc: Any, size: int | None, ranks: tuple[int, ...] | None) -> None:
    if isinstance(desc, str) and desc and acc.desc in (None, "", "undefined"):
        acc.desc = desc
    if ranks and acc.ranks is None:
        acc.ranks = ranks
    if acc.size is None:
        acc.size = len(ranks) if ranks else size if isinstance(size, int) and size > 0 else None


@cache
def _slot(collective: str) -> int:
    """0 for an all-gather, 1 for a gradient collective (reduce-scatter, all-reduce), else −1."""
    kind = _kind(collective)
    return 0 if kind == "allgather" else 1 if kind in _GRADIENT else -1


@cache
def _kind(collective: str) -> str:
    """links.normalize_collective, once per spelling: the mesh and MFU001 ask it of every call."""
    return normalize_collective(collective) or collective


def _ranks_text(text: str | None) -> tuple[int, ...] | None:
    """"0,1,2" (collectives.Call) or "[0, 1, 2]" (pg_config, Flight Recorder)."""
    if not text:
        return None
    try:
        out = tuple(int(x) for x in text.strip("[] ").split(",") if x.strip())
    except ValueError:
        return None
    return out or None


def _judge(acc: _Acc, world: int, gpn: int | None) -> tuple[str, str]:
    """(dimension, evidence) of one group."""
    row = named(acc.desc)
    kinds = acc.traffic
    total = sum(kinds.values())
    seen = ", ".join(f"{n} {k}" for k, n in kinds.most_common(3))
    if row is not None:
        why = f"description {acc.desc!r} ({row.source})" + (f"; traffic {seen}" if total else "")
        if row.dim == "dp" and acc.gathers_first():
            return "fsdp", why + "; its all-gathers come before the step's gradient collectives: sharded"
        return row.dim, why
    if acc.size is not None and acc.size == world and world > 1:
        return "world", f"all {world} ranks" + (f"; traffic {seen}" if total else "")
    if not total:
        return "other", f"description {acc.desc!r} names no dimension and no collective ran on it" if acc.desc \
            else "no description and no collective on it"
    top = kinds.most_common(1)[0][0]
    if set(kinds) == {"sendrecv"}:
        return "pp", f"send/recv only ({total} calls): a pipeline's stage-to-stage transfers"
    if top == "alltoall":
        return "ep", f"mostly all-to-all ({seen}): MoE token dispatch and combine"
    if top in ("allgather", "reducescatter"):
        return "fsdp" if acc.gathers_first() else "dp", f"all-gather/reduce-scatter ({seen})" + (
            ", parameters gathered before the gradients: sharded data parallel" if acc.gathers_first() else
            ", gathered after the gradients: a sharded optimizer")
    r = acc.ranks
    local = r is not None and gpn is not None and len(r) <= gpn and list(r) == list(range(r[0], r[0] + len(r)))
    if top == "allreduce" and local:
        return "tp", f"all-reduces ({seen}) within consecutive ranks of one host: tensor parallel (Megatron's order)"
    if top == "allreduce":
        return "dp", f"all-reduces ({seen}) across non-consecutive ranks or hosts: data parallel"
    return "other", f"traffic {seen}"


def _world_as_data_parallel(judged: dict[str, tuple[str, str]], groups: dict[str, _Acc], world: int) -> None:
    """DDP and FSDP run on the default group when data parallelism is all there is: the world
    group is then the data-parallel one, if nothing else is and it carried the traffic."""
    if any(dim in ("dp", "fsdp", "tp", "pp", "cp") for dim, _ in judged.values()):
        return
    for name, (dim, why) in judged.items():
        acc = groups[name]
        if dim == "world" and any(k in acc.traffic for k in ("allreduce", "allgather", "reducescatter")):
            sharded = acc.gathers_first()
            judged[name] = ("fsdp" if sharded else "dp",
                            why + f"; no other dimension, so the world is the {'FSDP' if sharded else 'data-parallel'} group")


def _named_hosts(acc: _Acc, host_of: Mapping[int, str]) -> int | None:
    """Hosts a group spans by the names its ranks' trace files carry; None unless every rank has one."""
    if not acc.ranks or not all(r in host_of for r in acc.ranks):
        return None
    return len({host_of[r] for r in acc.ranks})


def _group(name: str, acc: _Acc, dim: str, evidence: str, gpn: int | None, host_of: Mapping[int, str]) -> MeshGroup:
    hosts = named = _named_hosts(acc, host_of)
    if hosts is None:
        hosts = None if acc.ranks is None or gpn is None else len({r // gpn for r in acc.ranks})
    link = None if hosts is None else "intra-node" if hosts == 1 else "network"
    return MeshGroup(name, acc.desc, dim, acc.size, acc.ranks, hosts, link, evidence, dict(acc.traffic),
                     named is not None)


def _degrees(groups: Sequence[MeshGroup], world: int, listed: bool) -> tuple[dict[str, int], tuple[str, ...]]:
    """Each dimension's degree, and which the trace settles: a dimension named by a group's
    description is certain; where some rank's pg_config lists its groups, a dimension with no
    group there is certainly 1 (a rank belongs to one group of each dimension); the data-parallel
    degree is the world ÷ tp·pp·cp, certain when those are."""
    degree = {}
    certain = []
    for d in ("tp", "pp", "cp", "ep"):
        of = [g for g in groups if g.dim == d and g.size]
        degree[d] = max((g.size or 1 for g in of), default=1)
        if any(named(g.desc) for g in of) or (listed and not of):
            certain.append(d)
    degree["dp"] = max(world // (degree["tp"] * degree["pp"] * degree["cp"]), 1)
    if {"tp", "pp", "cp"} <= set(certain):
        certain.insert(0, "dp")
    return {d: degree[d] for d in DEGREES}, tuple(certain)


def _sharding(groups: Sequence[MeshGroup], accs: Mapping[str, _Acc]) -> str | None:
    """HSDP: a sharded and a replicated data-parallel group; FSDP: parameters gathered before the
    gradients; ZeRO-2: gathered after a gradient reduce-scatter; ZeRO-1: after an all-reduce."""
    fsdp = [g for g in groups if g.dim == "fsdp"]
    dp = [g for g in groups if g.dim == "dp" and (g.size or 0) > 1]
    if fsdp and dp:
        return "hsdp"
    if fsdp:
        return "fsdp"
    traffic: Counter[str] = Counter()
    for g in dp:
        traffic.update(accs[g.name].traffic)
    if not traffic:
        return None
    if "allgather" in traffic:
        return "zero2" if "reducescatter" in traffic else "zero1"
    return "none"


def _name_key(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


def exposed_by_dim(mesh: Mesh | None, matched: Iterable[Matched],
                   exposed_ns: Mapping[tuple[int, int], int]) -> dict[tuple[str, str], int]:
    """Exposed transfer time (ns, all ranks and steps) by (dimension of the call's group, collective
    kind); point-to-point is left out: its exposed time is the pipeline's (MFU002)."""
    out: Counter[tuple[str, str]] = Counter()
    for m in matched:
        c = m.call
        if c.collective == "sendrecv":
            continue
        ns = exposed_ns.get((c.file_id, c.act), 0)
        if ns > 0:
            out[(mesh.dim_of(c.pg_name) if mesh else "other", _kind(c.collective))] += ns
    return dict(out)
