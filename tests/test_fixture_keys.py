"""The generator's events carry the args keys real captures carry, kind by kind.

For each kind of event a rule or the ingest reads (NCCL kernel, record_param_comms, ProfilerStep,
runtime launch, memcpy, user annotation), every key the generator writes must be one that some real
capture in ../shared/traces carries on that kind. A key only our generator writes is how a code path
comes to be tested on a shape no profiler makes: the NCCL kernel's "Dst Rank" hid for months that
real traces name a send's peer on record_param_comms only (issue 36).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from fixtures.generate import generate

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
# The project's own real captures (torch 2.11 on an H200, PROVENANCE.md there): recent enough to
# carry `Rank` on record_param_comms.
OWN = Path(__file__).resolve().parent / "data" / "gpu_captures"

# Keys PyTorch writes on record_param_comms that no capture in ../shared/traces is recent enough to
# hold: torch's profiler saves them with the collective's other fields (torch/csrc/profiler/util.h:
# kRank "Rank", kP2pSrc "Src Rank", kP2pDst "Dst Rank", kSeqNum "Seq"; collection.cpp adds them to
# the CPU op's metadata). Kineto copies none of them to the kernel (DESIGN.md), so none is allowed there.
NEWER_KEYS = {"record_param_comms": {"Src Rank", "Dst Rank", "Seq"}}
# ...all four are kept off the kernel.
CPU_SIDE_ONLY = {"Rank", "Src Rank", "Dst Rank", "Seq"}

KINDS = ("nccl kernel", "record_param_comms", "ProfilerStep", "runtime launch", "memcpy", "user annotation")


def kind(e: dict[str, Any]) -> str | None:
    """The kind of a complete event, by the fields the ingest tells them apart by."""
    if e.get("ph") != "X":
        return None
    cat, name = e.get("cat"), e.get("name") or ""
    if cat in ("kernel", "Kernel") and name.lower().startswith("nccl"):
        return "nccl kernel"
    if name == "record_param_comms":
        return "record_param_comms"
    if name.startswith("ProfilerStep#") and cat == "user_annotation":
        return "ProfilerStep"
    if cat in ("cuda_runtime", "cuda_driver") and "launch" in name.lower():
        return "runtime launch"
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "user_annotation":
        return "user annotation"
    return None


def keys_by_kind(paths: Iterable[Path]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for path in paths:
        data = path.read_bytes()
        try:
            trace = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
        except ValueError:
            continue   # the shared folder holds one non-JSON extract (PROVENANCE.md)
        for e in trace.get("traceEvents", []) if isinstance(trace, dict) else []:
            if (k := kind(e)) is not None:
                out[k] |= set(e.get("args") or {})
    return out


@pytest.fixture(scope="module")
def real() -> dict[str, set[str]]:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} absent: the real captures are not beside the project")
    return keys_by_kind(p for folder in (SHARED, OWN) for p in folder.rglob("*")
                        if p.name.endswith((".json", ".json.gz")))


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """A pipeline (send/recv), one run as torch.distributed.pipelining runs DualPipeV (its PP: action
    annotations, send/recv both ways) and a data-parallel case (all-reduce, copies), one step past warm-up."""
    paths: list[Path] = []
    for case in ("pipeline_1f1b", "pipeline_dualpipe", "exposed_comm"):
        out = tmp_path_factory.mktemp(case)
        generate(case, out, steps=2)
        paths += [p for p in out.iterdir() if p.name not in ("truth.json", "model.toml")]
    return keys_by_kind(paths)


def test_every_kind_is_generated_and_found_in_real_captures(real: dict[str, set[str]],
                                                           generated: dict[str, set[str]]) -> None:
    assert set(KINDS) <= set(generated), sorted(set(KINDS) - set(generated))
    assert set(KINDS) <= set(real), sorted(set(KINDS) - set(real))


@pytest.mark.parametrize("which", KINDS)
def test_generated_keys_are_keys_real_captures_carry(which: str, real: dict[str, set[str]],
                                                     generated: dict[str, set[str]]) -> None:
    extra = generated.get(which, set()) - real.get(which, set()) - NEWER_KEYS.get(which, set())
    assert not extra, (f"the generator writes {sorted(extra)} on {which} events, which no real capture in "
                       f"{SHARED} carries there: write them where the profiler does (fixtures/workload.py)")


def test_peers_and_seq_are_on_the_cpu_op_only(generated: dict[str, set[str]]) -> None:
    """As PyTorch writes them: the point-to-point peer and Seq on record_param_comms, not the kernel."""
    assert generated["record_param_comms"] >= CPU_SIDE_ONLY
    assert not CPU_SIDE_ONLY & generated["nccl kernel"]


def test_the_own_capture_carries_rank_on_the_cpu_op() -> None:
    """torch 2.11 writes `Rank` on record_param_comms (the H200 capture): the key is real, not ours."""
    own = keys_by_kind(OWN.rglob("*.json.gz"))
    assert "Rank" in own["record_param_comms"]
