"""What every rule is: a code, a slug, typed parameters, a claim on the ledger, findings."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar, cast

import msgspec

from diag.attribution.analysis import Finding, RankContext, RunContext, StepContext
from diag.attribution.ledger import StepLedger


class NoParams(msgspec.Struct, frozen=True):
    pass


P = TypeVar("P")


class Rule(Generic[P]):
    code: ClassVar[str]
    slug: ClassVar[str]
    bucket: ClassVar[str | None]          # the ledger bucket it claims (None: not a time bucket)
    claim_order: ClassVar[int] = 100      # lower claims first; residual-style claims go last
    Params: ClassVar[type] = NoParams

    def __init__(self, params: P | None = None) -> None:
        self.params: P = params if params is not None else cast(P, self.Params())

    def digest(self, ctx: RankContext) -> Any:
        """What claim() and findings() need from one rank's timeline, kept small: the map step
        drops the timeline after this (default: nothing). Found again as StepContext.digest."""
        return None

    def claim(self, ctx: StepContext, ledger: StepLedger) -> None:
        """Claim this rule's part of one rank-step (default: nothing)."""

    def findings(self, run: RunContext) -> list[Finding]:
        raise NotImplementedError
