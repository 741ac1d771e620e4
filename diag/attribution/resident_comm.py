"""Communication kernels resident beside compute: DeepEP, NVSHMEM, symmetric-memory all-reduce and
long-lived NCCL kernels run on SMs of their own while the GEMMs run, and those GEMMs get the rest
of the part. Per rank and step: how long a communication kernel ran while a GEMM or attention kernel
ran, and how many SMs such kernels held (grid blocks, at most the part's SMs: a communication
kernel runs one block per SM, NCCL one per channel, DeepEP as many as Buffer.set_num_sms gives it).
MFU009 shows it as evidence beside the GEMMs it slows.
"""

from __future__ import annotations

from collections import Counter

import msgspec
import numpy as np

from diag.timeline.columns import numpy_of
from diag.timeline.rank import RankTimeline
from diag.timeline.states import covered_ns, union


class Resident(msgspec.Struct):
    overlap_ns: list[int]              # per step: time some communication kernel ran beside a GEMM
    window_ns: list[int]               # per step: the step window
    blocks_ns: dict[int, int]          # grid blocks of such kernels → their time beside GEMMs
    names_ns: dict[str, int]           # their names → that time
    sms: int | None                    # the part's SMs (deviceProperties numSms)


def resident(tl: RankTimeline) -> Resident | None:
    """None on a host timeline or without both communication and GEMM kernels."""
    if tl.host_timeline:
        return None
    comm = np.flatnonzero(tl.kernel & (tl.kclass == "comm"))
    mm = tl.kernel & np.isin(tl.kclass, ["gemm", "attention"])
    if not len(comm) or not mm.any():
        return None
    gs, ge = union(tl.ts_ns[mm], tl.end_ns[mm])
    cs, ce = tl.ts_ns[comm], tl.end_ns[comm]
    beside = covered_ns(cs, ce, gs, ge)          # each communication kernel's time beside a GEMM
    us, ue = union(cs, ce)
    out = Resident([], [], {}, {}, (tl.device_props or {}).get("numSms"))
    for a, b in zip(tl.steps.start_ns.tolist(), tl.steps.end_ns.tolist(), strict=True):
        # The communication union clipped to the window, against the GEMMs' union.
        s, e = np.clip(us, a, b), np.clip(ue, a, b)
        out.overlap_ns.append(int(covered_ns(s, e, gs, ge).sum()))
        out.window_ns.append(int(b - a))
    blocks = numpy_of(tl.acts.column("grid_blocks").fill_null(0), np.int64)[comm]
    by_blocks: Counter[int] = Counter()
    by_name: Counter[str] = Counter()
    for i, k, ns in zip(comm.tolist(), blocks.tolist(), beside.tolist(), strict=True):
        if ns > 0:
            by_blocks[k] += ns
            by_name[tl.name[i] or "?"] += ns
    out.blocks_ns, out.names_ns = dict(by_blocks), dict(by_name)
    return out


def summarize(digests: list[tuple[int, Resident]], counted: set[tuple[int, int]],
              top: int = 3) -> dict[str, object] | None:
    """Over the counted (file, step)s: the share of step time communication kernels ran beside GEMMs,
    the SMs they held (the grid with the most such time, at most the part's SMs) and their names."""
    overlap = window = 0
    blocks: Counter[int] = Counter()
    names: Counter[str] = Counter()
    sms = None
    for fid, r in digests:
        for i, (o, w) in enumerate(zip(r.overlap_ns, r.window_ns, strict=True)):
            if (fid, i) in counted:
                overlap += o
                window += w
        blocks.update(r.blocks_ns)
        names.update(r.names_ns)
        sms = sms or r.sms
    if not window or not overlap:
        return None
    grid = max(blocks, key=lambda k: (blocks[k], k)) if blocks else 0
    held = min(grid, sms) if grid and sms else grid or None
    return {"share_of_step_beside_gemms": overlap / window, "sms_held": held, "sms": sms,
            "kernels": [n[:100] for n, _ in names.most_common(top)]}
