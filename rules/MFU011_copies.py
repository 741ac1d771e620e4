"""MFU011 copies."""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np

from diag.attribution.analysis import Finding, RankContext, RunContext, severity
from diag.timeline.states import covered_ns, union
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01
    top_copies: int = 8


EVIDENCE = 3


class CopyRow(msgspec.Struct):
    count: int = 0
    bytes: float = 0.0
    time_s: float = 0.0
    alone_s: float = 0.0          # with no kernel running beside it
    evidence: list[str] = msgspec.field(default_factory=list)


def advice_for(name: str) -> str | None:
    """What fixes one kind of copy, from the name Kineto gives it."""
    if "Pageable" in name and "HtoD" in name:
        return "pinned host memory: DataLoader(pin_memory=True) and .to(device, non_blocking=True)"
    if "DtoH" in name:
        return ("device-to-host copies inside the step (.item(), .cpu(), .tolist()): keep the values on the GPU, "
                "copy them every N steps or with non_blocking=True into pinned memory")
    if "HtoD" in name:
        return "overlap host-to-device copies with compute: non_blocking=True on a side stream, prefetch the next batch"
    if "DtoD" in name or "Memset" in name:
        return "device copies/memsets alone on the GPU: avoid .contiguous()/.clone() and zero_grad(set_to_none=False)"
    return None


class Copies(Rule[Params]):
    """Copies and memsets alone on the GPU.

    What it finds: the `memcpy` bucket — time only copies or memsets run — by copy kind as Kineto
    names it (`Memcpy HtoD (Pageable -> Device)`, `Memcpy DtoH (Device -> Pageable)`, ...), with the
    bytes, the achieved GB/s and the part of each copy no kernel ran beside.

    Why it costs MFU: a copy the compute does not overlap stops the tensor cores; a pageable host
    copy is staged through a bounce buffer at a fraction of PCIe bandwidth and blocks the host too.

    What to do: `pin_memory=True` in the DataLoader and `.to(device, non_blocking=True)`; no
    device-to-host copies in the step (`.item()`, `.cpu()`); prefetch inputs on a side stream.
    """

    code = "MFU011"
    slug = "copies"
    bucket = "memcpy"
    Params = Params

    def digest(self, ctx: RankContext) -> dict[str, CopyRow] | None:
        tl = ctx.tl
        copy = ~tl.kernel & (tl.step_of >= 0)
        if tl.host_timeline or not copy.any():
            return None
        ks, ke = union(tl.ts_ns[tl.kernel], tl.end_ns[tl.kernel])
        idx = np.flatnonzero(copy)
        s, e = tl.ts_ns[idx], tl.end_ns[idx]
        alone = (e - s) - covered_ns(s, e, ks, ke)
        names = tl.name
        nbytes = tl.acts.column("bytes").to_pylist()
        rows: dict[str, CopyRow] = defaultdict(CopyRow)
        for j, i in enumerate(idx.tolist()):
            r = rows[names[i] or "?"]
            r.count += 1
            r.time_s += float(e[j] - s[j]) * 1e-9
            r.alone_s += float(alone[j]) * 1e-9
            r.bytes += float(nbytes[i] or 0)
            if alone[j] > 0 and len(r.evidence) < EVIDENCE:
                r.evidence.append(f"act:{tl.file_id}:{i}")
        return dict(rows)

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("memcpy")
        if frac < self.params.min_fraction:
            return []
        rows: dict[str, CopyRow] = defaultdict(CopyRow)
        for r in run.ranks:
            for name, c in (r.rules.get(self.code) or {}).items():
                t = rows[name]
                t.count += c.count
                t.bytes += c.bytes
                t.time_s += c.time_s
                t.alone_s += c.alone_s
                t.evidence += c.evidence[: EVIDENCE - len(t.evidence)]
        worst = sorted(rows, key=lambda n: -rows[n].alone_s)[: self.params.top_copies]
        alone = sum(rows[n].alone_s for n in rows) or 1.0
        table = [{"copy": n, "count": rows[n].count, "bytes": rows[n].bytes, "time_ms": rows[n].time_s * 1e3,
                  "alone_ms": rows[n].alone_s * 1e3, "share": rows[n].alone_s / alone,
                  "gbps": rows[n].bytes / rows[n].time_s / 1e9 if rows[n].time_s and rows[n].bytes else None}
                 for n in worst]
        summary = f"copies alone on the GPU {frac:.1%} of the step"
        if worst:
            w = table[0]
            summary += f"; largest: {w['copy']} ({w['share']:.0%} of it, {w['count']} copies"
            summary += f", {w['gbps']:.1f} GB/s)" if w["gbps"] else ")"
        # Advice for the copies that make a tenth or more of the copy-alone time.
        advice = "; ".join(dict.fromkeys(a for n in worst if rows[n].alone_s >= alone / 10 and (a := advice_for(n)))) or \
            "overlap copies with compute (non_blocking=True, a side stream)"
        return [Finding(
            self.code, self.slug, severity(frac * 100), frac, run.mean_seconds("memcpy"),
            *run.involved("memcpy", 0.0), [e for n in worst for e in rows[n].evidence], advice, summary,
            run.what_if(frac), {"copies": table},
            bucket="memcpy", recoverable_fraction=frac,   # pinned, non-blocking copies overlap the compute
        )]
