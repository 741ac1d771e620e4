"""Exit codes and the one error type that reaches the user as a one-line message."""

from __future__ import annotations

import re
import sys
from enum import IntEnum

from diag.runtime.sanitize import printable


class ExitCode(IntEnum):
    """The CLI contract (DESIGN.md): other tools and CI read these."""

    OK = 0
    GATE_FAILED = 1
    BAD_INPUT = 2
    INTERNAL = 3
    # stdout's reader went away (`diag analyze ... | head -1`): quietly, as a POSIX tool that SIGPIPE
    # ends (128 + 13); never 0, which would pass a gate whose verdict nobody read.
    BROKEN_PIPE = 141


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
        reason = printable(" ".join(self.reason.split()))   # a name in it: no terminal escape either
        return f"{printable(self.path)}: {reason}{where}"

    def message(self) -> str:
        """What the CLI prints on stderr: prefixed by `diag: ` unless it names a diag command."""
        line = self.one_line()
        return line if self.path.startswith("diag ") else f"diag: {line}"


class Stopped(BaseException):
    """A signal ended an ingest: which files the store holds, each whole (a file is one
    transaction), and which it does not. A BaseException, as KeyboardInterrupt and SystemExit are:
    no handler of one file's errors may take it for that file's."""

    def __init__(self, code: int, stored: list[str], not_stored: list[str]) -> None:
        self.code = code   # 130 (SIGINT) or 143 (SIGTERM): 128 + the signal
        self.stored = stored
        self.not_stored = not_stored
        super().__init__(self.message())

    def message(self) -> str:
        why = "interrupted" if self.code == 130 else "terminated"
        return (f"diag: {why} during ingest: {len(self.stored)} file(s) stored whole{_some(self.stored)}; "
                f"{len(self.not_stored)} not stored{_some(self.not_stored)}")


def _some(paths: list[str], n: int = 5) -> str:
    if not paths:
        return ""
    more = f", and {len(paths) - n} more" if len(paths) > n else ""
    return " (" + ", ".join(printable(p) for p in paths[:n]) + more + ")"


class MissingExtra(BadInput):
    """A command whose optional dependency is not installed: says which extra brings it."""

    def __init__(self, command: str, package: str, extra: str) -> None:
        super().__init__(f"diag {command}", f"needs {package}: pip install -e '.[{extra}]'")

    def one_line(self) -> str:
        return f"{self.path} {self.reason}"   # diag example needs torch: …


def require(package: str, command: str, extra: str) -> None:
    """Before any work: the command's optional dependency is importable, else MissingExtra."""
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise MissingExtra(command, package, extra)


# A library's class prefix on its message: DuckDB's "Conversion Error: ", "Invalid Input Error: ".
_CLASS_PREFIX = re.compile(r"^(?:[A-Z][a-z]+ )*(?:Error|Exception): ")


def in_words(e: BaseException) -> str:
    """An unexpected exception's message as a user reads it: one line, without Python's class names
    or its advice to the programmer (`sys.set_int_max_str_digits()`, `unhashable type: 'list'`)."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[0].lower() + e.strerror[1:]
    if isinstance(e, UnicodeError):
        return "text that is not valid UTF-8"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, MemoryError):
        return "out of memory"
    text = str(e).split("\n")[0].strip()
    if isinstance(e, ValueError) and "integer string conversion" in text:
        return f"an integer of more than {sys.get_int_max_str_digits()} digits"
    if text.startswith("unhashable type"):
        return "a list or object where a name or number belongs"
    return _CLASS_PREFIX.sub("", text) or "an unexpected fault"
