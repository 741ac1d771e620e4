"""The report document (report.py, DESIGN.md "Contracts") as typed, frozen records: what a notebook
holds as `diag.open(...).report`, with attribute access and the units in the names.

The fields mirror `build_report` one for one; `to_typed` converts a document and fails on a field
of the wrong type, so a test that converts every generated and shared report keeps the two alike.
Fields a later version adds are ignored here until they are listed (the document is additive).
"""

from __future__ import annotations

from typing import Any

import msgspec


class Device(msgspec.Struct, frozen=True):
    name: str | None                  # the part's name, or the trace's device name when the part is unknown
    part: str | None                  # diag/knowledge/data/parts.toml key
    peak_tflops: float | None         # dense (or effective, with a dtype mix) peak the MFU is against
    dtype: str | None
    dtype_mix: dict[str, float]       # dtype → share of model matmul FLOPs
    peak_source: str                  # where the peak came from, one line
    graph_kernel_fraction: float | None = None


class Spread(msgspec.Struct, frozen=True):
    min: float
    median: float
    max: float
    mean: float | None = None   # additive: the mean window, the time the MFU divides by


class ExcludedStep(msgspec.Struct, frozen=True):
    rank: int
    step: int
    why: str


class WorstRank(msgspec.Struct, frozen=True):
    rank: int
    step_time_s: float
    ledger: dict[str, float]


class Finding(msgspec.Struct, frozen=True):
    code: str
    slug: str
    severity: str
    bucket: str | None                # the ledger bucket it explains (None: MFU007, the denominator)
    lost_fraction: float              # of the step
    recoverable_fraction: float       # what a fix can plausibly win; findings are ordered by it
    lost_s: float
    mfu_points: float
    what_if_mfu: float | None
    what_if_mfu_naive: float | None
    ranks: list[int]
    steps: list[int]
    evidence: list[str]               # ids the TUI jumps to: act:<file_id>:<i>, coll:<instance>, step:<rank>:<step>
    advice: str
    summary: str
    details: dict[str, Any]


class PathSegment(msgspec.Struct, frozen=True):
    rank: int
    kind: str                         # compute | comm | wait | copy | idle | host
    start_us: float                   # aligned clock
    end_us: float
    what: str | None


class CriticalPathStep(msgspec.Struct, frozen=True):
    step: int
    segments: list[PathSegment]
    omitted: dict[str, Any]
    summary: dict[str, Any]           # length_us, by_kind, by_rank


class ModelInfo(msgspec.Struct, frozen=True):
    name: str
    params: float | None
    tokens_per_step: float | None


class MeshGroup(msgspec.Struct, frozen=True):
    name: str
    desc: str | None
    dim: str                          # dp | fsdp | tp | cp | ep | pp | world | other
    size: int | None
    hosts: int | None
    link: str | None                  # intra-node | network
    evidence: str
    traffic: dict[str, int]           # collective → calls on the group, all ranks and steps
    ranks: list[int] | None


class Parallelism(msgspec.Struct, frozen=True):
    dims: dict[str, int]              # dp, tp, pp, cp, ep → degree
    sharding: str | None              # none | zero1 | zero2 | fsdp | hsdp
    groups: list[MeshGroup]
    groups_total: int
    certain: list[str]
    how: str


class FlopsPerStep(msgspec.Struct, frozen=True):
    model: float | None               # what mfu counts (training: 3 × forward); null under the coverage guard
    forward: float
    executed: float                   # every FLOP the shaped ops did (HFU's)


class Report(msgspec.Struct, frozen=True):
    schema: str
    diag_version: str
    world_size: int
    ranks: list[int]                  # the ranks traced (world_size may be more)
    steps: int
    timeline: str                     # gpu | host (a CPU-only trace)
    workload: str                     # training | inference
    steps_excluded: list[ExcludedStep]
    device: Device
    step_time_s: float | None
    step_time_spread_s: Spread | None
    mfu: float | None
    mfu_bf16: float | None
    hfu: float | None
    ledger: dict[str, float]          # bucket → fraction of the step, mean over ranks and steps
    ledger_by_rank: dict[str, dict[str, float]]
    ledger_by_step: dict[str, dict[str, float]]
    ledger_median_over_steps: dict[str, float]
    worst_rank: WorstRank | None
    findings: list[Finding]
    clock_offsets_us: dict[str, float | None]
    clock_offset_spread_us: dict[str, float]
    clock_offset_residual_us: dict[str, float]
    clock_offset_residual_max_us: dict[str, float]
    model: ModelInfo | None
    flops_source: str
    notes: list[str]
    critical_path: list[CriticalPathStep]
    parallelism: Parallelism | None = None   # the mesh (attribution/mesh.py); absent before it was added
    flops_per_step: FlopsPerStep | None = None   # FLOPs from op shapes, mean per rank-step; absent before issue 36


def to_typed(document: dict[str, Any]) -> Report:
    """The document as a Report; a field of the wrong type raises msgspec.ValidationError."""
    return msgspec.convert(document, Report)
