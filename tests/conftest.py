"""pytest hooks for the whole suite: the summary says how many tests needed ../shared/traces when that
folder is absent (issue 39: 66 tests had skipped silently), and where to get it."""

from __future__ import annotations

from typing import Any

from helpers import NO_TRACES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    needed = sum(1 for report in terminalreporter.stats.get("skipped", []) if _reason(report) == NO_TRACES)
    if needed:
        terminalreporter.write_line(
            f"{needed} test(s) skipped for want of the real traces in ../shared/traces beside the repository: "
            "docs/traces.md says where to get them")


def _reason(report: Any) -> str:
    longrepr = getattr(report, "longrepr", None)
    # A skip's longrepr is (file, line, "Skipped: <reason>").
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return ""
