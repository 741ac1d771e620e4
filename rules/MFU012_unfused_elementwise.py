"""MFU012 unfused-elementwise."""

from __future__ import annotations

from collections import defaultdict

import msgspec
import numpy as np

from diag.attribution.analysis import Finding, RankContext, RunContext, severity
from rules.base import Rule


class Params(msgspec.Struct, frozen=True):
    min_fraction: float = 0.01
    # Two or more memory-bound kernels back to back between GEMMs can be one pass.
    min_chain: int = 2
    # Short: a kernel under this is dominated by its launch and tail, not by streaming.
    short_kernel_us: float = 100.0
    top_chains: int = 8


class ChainRow(msgspec.Struct):
    """One recurring chain (its kernel names in order) on one rank."""

    count: int = 0
    time_s: float = 0.0
    bytes: float = 0.0            # moved by the chain's kernels, where every one's is known
    fused_bytes: float = 0.0      # one fused pass: the largest kernel's bytes (read inputs, write outputs once)
    gain_s: float = 0.0
    evidence: list[str] = msgspec.field(default_factory=list)


class UnfusedDigest(msgspec.Struct, frozen=True):
    chains: dict[tuple[str, ...], ChainRow]
    gain_by_step: dict[tuple[int, int], float]     # (file, step index) → s a fused pass would save


def chain_gain(dur_s: list[float], nbytes: list[float | None]) -> tuple[float, float, float]:
    """(bytes moved, bytes of one fused pass, seconds a fused pass saves) for one chain.

    With every kernel's bytes known the chain is memory-bound: a fused pass takes the chain's time
    × fused ÷ moved. Without, the fused pass is assumed to take as long as the chain's longest kernel."""
    total = sum(dur_s)
    if all(b for b in nbytes):
        moved = float(sum(b or 0.0 for b in nbytes))
        fused = float(max(b or 0.0 for b in nbytes))
        return moved, fused, total * (1 - fused / moved)
    return 0.0, 0.0, total - max(dur_s)


class UnfusedElementwise(Rule[Params]):
    """Non-matmul time, and the chains of short memory-bound kernels one fused pass would replace.

    What it finds: the `non_matmul` bucket — norms, elementwise, reductions, optimizer kernels —
    and in it the chains of two or more short (< 100 µs) non-matmul kernels launched back to back
    on a stream between GEMMs: each reads what the previous one wrote. Per chain, the bytes its
    kernels move (from op shapes) against one fused pass (the largest kernel's bytes); the time
    that difference takes is what fusion can win. MFU008 reports the kernels that are slow on
    their own; this rule the traffic between them.

    Why it costs MFU: every kernel of the chain streams its tensors through HBM and pays a launch;
    one fused kernel reads the inputs and writes the result once.

    What to do: `torch.compile` the model (Inductor fuses elementwise chains), fused norms
    (Apex/Transformer Engine `FusedLayerNorm`/`RMSNorm`, fused add+norm), fused optimizers
    (`torch.optim.AdamW(fused=True)`; not in inference, nor where the trace shows a fused optimizer), fused bias+activation GEMM epilogues.
    """

    code = "MFU012"
    slug = "unfused-elementwise"
    bucket = "non_matmul"
    Params = Params

    def digest(self, ctx: RankContext) -> UnfusedDigest | None:
        tl = ctx.tl
        if tl.host_timeline:
            return None
        short_ns = self.params.short_kernel_us * 1000
        compute = np.flatnonzero(tl.kernel & (tl.kclass != "comm") & (tl.step_of >= 0))
        chains: dict[tuple[str, ...], ChainRow] = defaultdict(ChainRow)
        gain_by_step: dict[tuple[int, int], float] = defaultdict(float)
        names, stream, moved = tl.name, tl.stream, tl.bytes_moved
        open_: dict[object, list[int]] = defaultdict(list)   # stream → the chain being built
        # Python lists, not NumPy scalars, for the walk over every compute kernel.
        kclass, ts, end, step_of = tl.kclass.tolist(), tl.ts_ns.tolist(), tl.end_ns.tolist(), tl.step_of.tolist()

        def close(run: list[int]) -> None:
            if len(run) >= self.params.min_chain:
                dur = [float(end[i] - ts[i]) * 1e-9 for i in run]
                nbytes, fused, gain = chain_gain(dur, [moved[i] for i in run])
                row = chains[tuple(names[i] or "?" for i in run)]
                row.count += 1
                row.time_s += sum(dur)
                row.bytes += nbytes
                row.fused_bytes += fused
                row.gain_s += gain
                gain_by_step[(tl.file_id, step_of[run[0]])] += gain
                if len(row.evidence) < 3:
                    row.evidence.append(f"act:{tl.file_id}:{run[0]}")
            run.clear()

        for i in compute.tolist():
            run = open_[stream[i]]
            short = kclass[i] == "other" and end[i] - ts[i] < short_ns
            if short and (not run or step_of[run[-1]] == step_of[i]):
                run.append(i)
            else:
                close(run)
                if short:
                    run.append(i)
        for run in open_.values():
            close(run)
        return UnfusedDigest(dict(chains), dict(gain_by_step))

    def findings(self, run: RunContext) -> list[Finding]:
        frac = run.mean_fraction("non_matmul")
        if frac < self.params.min_fraction:
            return []
        chains: dict[tuple[str, ...], ChainRow] = defaultdict(ChainRow)
        windows = {k: st.window_ns * 1e-9 for k, st in run.states.items()}
        gain = 0.0
        for r in run.ranks:
            d: UnfusedDigest | None = r.rules.get(self.code)
            if d is None:
                continue
            gain += sum(g / windows[k] for k, g in d.gain_by_step.items() if windows.get(k))
            for key, c in d.chains.items():
                t = chains[key]
                t.count += c.count
                t.time_s += c.time_s
                t.bytes += c.bytes
                t.fused_bytes += c.fused_bytes
                t.gain_s += c.gain_s
                t.evidence += c.evidence[: 3 - len(t.evidence)]
        recoverable = min(gain / max(len(run.ledgers), 1), frac)
        worst = sorted(chains, key=lambda k: -chains[k].gain_s)[: self.params.top_chains]
        rows = [{"kernels": [n[:80] for n in k], "count": chains[k].count, "time_ms": chains[k].time_s * 1e3,
                 "bytes": chains[k].bytes, "fused_bytes": chains[k].fused_bytes, "gain_ms": chains[k].gain_s * 1e3}
                for k in worst]
        chain_s = sum(c.time_s for c in chains.values())
        summary = f"non-matmul kernels take {frac:.1%} of the step"
        if worst:
            summary += (f"; {sum(c.count for c in chains.values())} chains of short memory-bound kernels "
                        f"({chain_s * 1e3 / max(len(run.ledgers), 1):.2f} ms per rank-step), {recoverable:.1%} "
                        f"recoverable by fusing them; largest: {len(worst[0])} kernels ×{chains[worst[0]].count}")
        fused = ", ".join(x for x in (run.compile_knob, run.norm_fusion, run.optimizer_knob,
                                      "fused bias+activation epilogues") if x)
        advice = f"fuse memory-bound chains: {fused}"
        return [Finding(
            self.code, self.slug, severity(recoverable * 100), frac, run.mean_seconds("non_matmul"),
            *run.involved("non_matmul", 0.0), [e for k in worst for e in chains[k].evidence], advice, summary,
            run.what_if(recoverable), {"chains": rows, "min_chain": self.params.min_chain,
                                       "short_kernel_us": self.params.short_kernel_us},
            bucket="non_matmul", recoverable_fraction=recoverable,
        )]
