"""The pipeline layout from send/recv calls (diag/timeline/pipeline_layout.py) on patterns the generator does not make:
an interleaved ring and a pipeline whose end stages were not traced. GPipe and 1F1B chains are
checked against the generator's truth in test_cases.py."""

from __future__ import annotations

import msgspec
import pytest

from diag.timeline.collectives import Call
from diag.timeline.pipeline_layout import INTERLEAVED, UNKNOWN, detect_layout


def _p2p(rank: int, peer: int, direction: str, ts_ns: int, group_size: int | None = None) -> Call:
    return Call(rank, rank, 0, 0, 5, "1", "PIPELINE_MODEL_PARALLEL_GROUP", "sendrecv", None, group_size, None,
                1 << 20, "BFloat16", ts_ns, ts_ns + 1000, direction, peer)


def _transfers(src: int, dst: int, n: int, group_size: int | None = None) -> list[Call]:
    """n transfers src → dst in one step, seen on both sides."""
    return [c for i in range(n) for c in (_p2p(src, dst, "send", i * 10_000, group_size),
                                           _p2p(dst, src, "recv", i * 10_000, group_size))]


def test_interleaved_ring_gives_m_and_v() -> None:
    # Megatron interleaved, p = 4, v = 2, m = 8: each microbatch crosses rank k → k+1 once per model
    # chunk (v·m = 16 per step), and 3 → 0 between chunks only ((v−1)·m = 8); gradients the reverse.
    p, v, m = 4, 2, 8
    calls: list[Call] = []
    for k in range(p):
        n = (v - 1) * m if k == p - 1 else v * m
        calls += _transfers(k, (k + 1) % p, n) + _transfers((k + 1) % p, k, n)
    layout = detect_layout(calls)
    assert layout is not None
    assert (layout.stages, layout.microbatches, layout.schedule, layout.virtual_stages) == (p, m, INTERLEAVED, v)
    assert layout.theoretical_bubble == pytest.approx((p - 1) / (m + p - 1) / v)


def test_untraced_end_stages_fall_back_to_the_group_size() -> None:
    # Only the middle stages 1 and 2 of a 4-stage pipeline were traced: their peers 0 and 3 look like
    # chain ends but are not traced, so the chain's length says nothing; the pipeline group's size does.
    calls = _transfers(1, 2, 4, group_size=4) + _transfers(2, 1, 4, group_size=4)
    calls += [_p2p(1, 0, "recv", 0, 4), _p2p(2, 3, "send", 0, 4)]
    layout = detect_layout(calls)
    assert layout is not None and (layout.stages, layout.microbatches, layout.schedule) == (4, 4, UNKNOWN)
    assert "group" in layout.how


def test_send_recv_without_a_peer_gives_no_layout() -> None:
    calls = [msgspec.structs.replace(c, peer=None) for c in _transfers(0, 1, 4)]
    assert detect_layout(calls) is None
