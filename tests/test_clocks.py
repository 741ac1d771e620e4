"""Clock alignment (diag/timeline/clocks.py): which pairs it trusts, and the residuals it reports.

The generated cases check the offsets against the generator's truth (test_cases.py, within 1 µs,
pipeline-only layouts included); here, what it must refuse to use and what it must say."""

from __future__ import annotations

import json
from pathlib import Path

from diag.api import analyze_path
from diag.engine.run import AnalyzeOptions
from diag.timeline.clocks import INCONSISTENT_NS, clock_notes, clock_offsets
from diag.timeline.collectives import Call, Matched
from fixtures.generate import generate


def _call(rank: int, end_ns: int, collective: str = "allreduce", direction: str | None = None,
          peer: int | None = None, msg_bytes: int | None = 4096) -> Call:
    return Call(rank, rank, 0, 0, 1, "0", None, collective, None, None, None, msg_bytes, "BFloat16",
                end_ns - 10_000, end_ns, direction, peer)


def _instance(key: str, calls: list[Call]) -> list[Matched]:
    return [Matched(c, 0, key, 0, None, len(calls)) for c in calls]


def test_a_pair_that_disagrees_is_outvoted_and_its_residual_reported() -> None:
    # True offsets (add to a rank's times to read rank 0's clock): rank 1 +5 ms, rank 2 −3 ms.
    # Pairs (0,1) and (1,2) agree exactly over five collectives each; pair (0,2) is 200 µs off, with
    # 50 µs of scatter, over seven (a clock drifting on one link, a mismatched instance).
    true = {0: 0, 1: 5_000_000, 2: -3_000_000}
    matched: list[Matched] = []
    for i in range(5):
        t = 1_000_000_000 + i * 1_000_000
        matched += _instance(f"a{i}", [_call(0, t), _call(1, t - true[1])])
        matched += _instance(f"b{i}", [_call(1, t - true[1]), _call(2, t - true[2])])
    scatter = [-50_000, 0, 50_000, -50_000, 0, 50_000, 0]
    for i, s in enumerate(scatter):
        t = 2_000_000_000 + i * 1_000_000
        matched += _instance(f"c{i}", [_call(0, t), _call(2, t - true[2] - 200_000 + s)])
    offsets = clock_offsets(matched, [0, 1, 2])
    assert {r: o.offset_ns for r, o in offsets.items()} == true
    assert offsets[1].residual_ns == 0 and offsets[1].n_estimates == 10
    # Rank 2's 12 residuals: |200 µs − scatter| = 250, 200, 150, 250, 200, 150, 200 and five exact 0;
    # sorted, the 6th and 7th (whose mean is the median) are both 150 µs.
    assert offsets[2].n_estimates == 12
    assert offsets[2].residual_ns == 150_000 and offsets[2].residual_max_ns == 250_000
    assert offsets[2].residual_ns > INCONSISTENT_NS
    notes = clock_notes(offsets)
    assert len(notes) == 1 and "inconsistent on 2 rank(s)" in notes[0] and "150 µs" in notes[0]


def test_send_recv_pairs_need_matching_bytes_and_a_named_peer() -> None:
    # Rank 1 is 4 ms ahead. Two sends 0→1 name the same bytes on both sides; a third, paired by order
    # with a recv of another size, and a send/recv without a peer, would say otherwise.
    true_1 = 4_000_000
    matched: list[Matched] = []
    for i in range(2):
        t = 1_000_000_000 + i * 1_000_000
        matched += _instance(f"p{i}", [_call(0, t, "sendrecv", "send", 1), _call(1, t - true_1, "sendrecv", "recv", 0)])
    t = 1_100_000_000
    matched += _instance("p2", [_call(0, t, "sendrecv", "send", 1, 4096),
                                _call(1, t + 9_000_000, "sendrecv", "recv", 0, 8192)])
    matched += _instance("q", [_call(0, t, "sendrecv", "send"), _call(1, t + 7_000_000, "sendrecv", "recv")])
    offsets = clock_offsets(matched, [0, 1])
    assert offsets[1].offset_ns == true_1 and offsets[1].n_matches == 2 and offsets[1].residual_max_ns == 0


def test_a_send_may_end_before_its_receive_not_after() -> None:
    # Rank 1 is 3 ms behind. Of seven sends 0→1, five end with their receive (the receiver waited),
    # two end 40 µs and 90 µs early (eager: NCCL took the data into its buffer): no inconsistency.
    # One send 1→0 ending 30 µs after its receive is one: a residual of 30 µs. The median of the eight
    # estimates is still the five that agree.
    true_1 = -3_000_000
    matched: list[Matched] = []
    for i, early in enumerate([0, 0, 40_000, 0, 90_000, 0, 0]):
        t = 1_000_000_000 + i * 1_000_000
        matched += _instance(f"f{i}", [_call(0, t - early, "sendrecv", "send", 1),
                                       _call(1, t - true_1, "sendrecv", "recv", 0)])
    t = 1_100_000_000
    matched += _instance("b", [_call(1, t - true_1 + 30_000, "sendrecv", "send", 0),
                               _call(0, t, "sendrecv", "recv", 1)])
    offsets = clock_offsets(matched, [0, 1])
    assert offsets[1].offset_ns == true_1
    assert offsets[1].n_estimates == 8 and offsets[1].residual_ns == 0 and offsets[1].residual_max_ns == 30_000


def test_pipeline_sends_without_peers_leave_clocks_unaligned_not_wrong(tmp_path: Path) -> None:
    """A pipeline whose send/recv ops name no peer (no "Dst Rank"/"Src Rank"/"Rank", as when a
    batch is coalesced): pairing them by each rank's own Seq put the clocks 8.4 ms off before; now
    the ranks are reported unaligned, with a note, and MFU002 says what it could not detect."""
    generate("pipeline_1f1b", tmp_path, steps=1)
    for f in tmp_path.glob("rank-*.json"):
        trace = json.loads(f.read_text())
        for e in trace["traceEvents"]:
            args = e.get("args") or {}
            if args.get("Collective name") in ("send", "recv"):
                for k in ("Dst Rank", "Src Rank", "Rank"):
                    args.pop(k, None)
        f.write_text(json.dumps(trace))
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    assert report["clock_offsets_us"] == {"0": 0.0, "1": None, "2": None, "3": None}
    assert any(n.startswith("clock of rank(s) 1, 2, 3 not aligned") for n in report["notes"])
    bubble = next(f for f in report["findings"] if f["code"] == "MFU002")
    assert "stages and microbatches not detected" in bubble["summary"] and "stages" not in bubble["details"]


def test_unaligned_ranks_that_share_untrusted_instances_are_not_said_to_share_none() -> None:
    """Issue 39: HTA's two-rank all-to-all capture said "no collective … links them" while MFU005
    named rank 1 late in 7 collectives. Instances matched on both ranks but not trusted for the clock
    (send/recv without a peer) are counted in the note instead."""
    matched: list[Matched] = []
    for i in range(3):
        t = 1_000_000_000 + i * 1_000_000
        matched += _instance(f"q{i}", [_call(0, t, "sendrecv", "send"), _call(1, t + 7_000_000, "sendrecv", "recv")])
    offsets = clock_offsets(matched, [0, 1])
    assert not offsets[1].linked
    notes = clock_notes(offsets, matched)
    assert len(notes) == 1 and notes[0].startswith("clock of rank(s) 1 not aligned to rank 0: the 3 collective")
    assert "no collective" not in notes[0]
    assert clock_notes(offsets)[0].startswith("clock of rank(s) 1 not aligned: no collective")


def test_peers_on_the_cpu_op_only_align_every_stage(tmp_path: Path) -> None:
    """As current PyTorch writes a pipeline: the send/recv kernels carry the collective's name, sizes
    and process group, the peer and Seq only their record_param_comms (the generator's default since
    issue 36). Every stage's clock is aligned, to the generator's offsets, and MFU002 finds p and m."""
    truth = generate("pipeline_1f1b", tmp_path, steps=2)
    for f in tmp_path.glob("rank-*.json"):
        for e in json.loads(f.read_text())["traceEvents"]:
            if e.get("cat") == "kernel" and "Collective name" in e["args"]:
                assert not {"Rank", "Src Rank", "Dst Rank", "Seq"} & set(e["args"])
    _, report = analyze_path(str(tmp_path), None, AnalyzeOptions(model=str(tmp_path / "model.toml")), warn=False)
    want = {str(r.rank): r.clock_offset_ns / 1000 for r in truth.ranks}
    got = report["clock_offsets_us"]
    assert set(got) == set(want) and all(abs(got[k] - want[k]) < 1.0 for k in want), (got, want)
    bubble = next(f for f in report["findings"] if f["code"] == "MFU002")
    assert (bubble["details"]["stages"], bubble["details"]["microbatches"]) == (4, 4)
