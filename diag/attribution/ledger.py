"""The attribution ledger: one rank-step's window split into the twelve buckets of DESIGN.md.

The GPU-state sweep (states.py) gives the pools a claim can draw on: matmul and non-matmul
compute, communication-only, copy-only and idle time. Claims take from named pools in order and
are granted only up to what is left, so the buckets can never exceed the step; whatever no one
claims falls to the residual bucket of its pool. docs/ledger.md is the arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from diag.timeline.states import StepStates

BUCKETS = (
    "model_compute", "recompute", "thin_gemm", "gemm_inefficiency", "non_matmul", "exposed_comm",
    "straggler", "pipeline_bubble", "dataloader", "host_bound", "idle_other", "memcpy",
)
# What no claim took becomes this bucket.
RESIDUAL = {
    "matmul": "gemm_inefficiency",
    "non_matmul": "non_matmul",
    "comm": "exposed_comm",
    "copy": "memcpy",
    "idle": "idle_other",
}


class StepLedger(msgspec.Struct):
    rank: int
    step: int
    window_s: float
    pools: dict[str, float]
    buckets: dict[str, float] = msgspec.field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    refused_s: dict[str, float] = msgspec.field(default_factory=dict)   # what claims asked for beyond the pools
    closed: bool = False
    shares: dict[str, float] | None = None   # fractions(), kept at close

    @classmethod
    def open(cls, rank: int, st: StepStates) -> StepLedger:
        ns = 1e-9
        return cls(rank, st.step, st.window_ns * ns, {
            "matmul": st.matmul_ns * ns, "non_matmul": st.non_matmul_ns * ns, "comm": st.comm_ns * ns,
            "copy": st.copy_ns * ns, "idle": st.idle_ns * ns,
        })

    def claim(self, bucket: str, seconds: float, pools: tuple[str, ...]) -> float:
        """Move up to `seconds` from `pools` (in order) into `bucket`; returns what was granted."""
        if bucket not in self.buckets:
            raise KeyError(f"unknown bucket {bucket!r}")
        if self.closed:
            raise RuntimeError("claim on a closed ledger")
        want = max(seconds, 0.0)
        granted = 0.0
        for pool in pools:
            take = min(want - granted, self.pools[pool])
            self.pools[pool] -= take
            granted += take
            if granted >= want:
                break
        self.buckets[bucket] += granted
        if want - granted > 1e-12:
            self.refused_s[bucket] = self.refused_s.get(bucket, 0.0) + (want - granted)
        return granted

    def close(self) -> None:
        for pool, bucket in RESIDUAL.items():
            self.buckets[bucket] += self.pools[pool]
            self.pools[pool] = 0.0
        self.closed = True
        self.shares = self._fractions()

    def fractions(self) -> dict[str, float]:
        """Each bucket's share of the step window. A closed ledger's are worked out once, at
        close: the rules and the report ask for them per bucket and ledger (10,000 ranks: 210,000
        calls, 1.7 s of the analysis's serial end)."""
        return self.shares if self.shares is not None else self._fractions()

    def _fractions(self) -> dict[str, float]:
        w = self.window_s
        return {b: (s / w if w > 0 else 0.0) for b, s in self.buckets.items()}


def weighted_share(ledgers: Sequence[StepLedger], bucket: str) -> float:
    """`bucket`'s share of the summed windows of `ledgers` (0 for none): each rank-step counts by
    its length, so a share is seconds over seconds and the mean of model_compute is the MFU."""
    total = sum(lg.window_s for lg in ledgers)
    return sum(lg.buckets[bucket] for lg in ledgers) / total if total > 0 else 0.0
