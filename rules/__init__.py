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

RULES: tuple[type[Rule[Any]], ...] = (
    ExposedCollectives,
    PipelineBubble,
    ThinGemms,
    Recompute,
    Stragglers,
    DataloaderStall,
    SparsePeak,
    KernelInefficiency,
)

__all__ = ["RULES", "Rule"]
