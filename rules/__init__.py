"""The rules, one file and one class each. The registry is this explicit tuple, in code order."""

from typing import Any

from rules.base import Rule
from rules.MFU001_exposed_collectives import ExposedCollectives
from rules.MFU002_pipeline_bubble import PipelineBubble
from rules.MFU003_thin_gemms import ThinGemms
from rules.MFU004_recompute import Recompute
from rules.MFU005_stragglers import Stragglers
from rules.MFU006_dataloader_stall import DataloaderStall
from rules.MFU007_sparse_peak import SparsePeak
from rules.MFU008_kernel_inefficiency import KernelInefficiency
from rules.MFU009_slow_gemms import SlowGemms
from rules.MFU010_host_bound import HostBound
from rules.MFU011_copies import Copies
from rules.MFU012_unfused_elementwise import UnfusedElementwise
from rules.MFU013_idle import Idle
from rules.MFU014_parallel_layout import ParallelLayout

RULES: tuple[type[Rule[Any]], ...] = (
    ExposedCollectives,
    PipelineBubble,
    ThinGemms,
    Recompute,
    Stragglers,
    DataloaderStall,
    SparsePeak,
    KernelInefficiency,
    SlowGemms,
    HostBound,
    Copies,
    UnfusedElementwise,
    Idle,
    ParallelLayout,
)

__all__ = ["RULES", "Rule"]
