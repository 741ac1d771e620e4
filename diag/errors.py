"""Exit codes and the one error type that reaches the user as a one-line message."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The CLI contract (DESIGN.md): other tools and CI read these."""

    OK = 0
    GATE_FAILED = 1
    BAD_INPUT = 2
    INTERNAL = 3


class BadInput(Exception):
    """Input diag cannot use. Rendered as one line: `<path>: <reason> (at byte N)`."""

    def __init__(self, path: str, reason: str, offset: int | None = None) -> None:
        self.path = path
        self.reason = reason
        self.offset = offset
        super().__init__(self.one_line())

    def __reduce__(self) -> tuple[type[BadInput], tuple[str, str, int | None]]:
        # Raised in ingest worker processes and re-raised in the parent.
        return (BadInput, (self.path, self.reason, self.offset))

    def one_line(self) -> str:
        where = f" (at byte {self.offset})" if self.offset is not None else ""
        # Keep it to one line whatever the reason contains.
        reason = " ".join(self.reason.split())
        return f"{self.path}: {reason}{where}"
