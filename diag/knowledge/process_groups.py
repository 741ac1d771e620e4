"""What a process group is for, from its description: the table in data/process_groups.toml."""

from __future__ import annotations

import re
import sys
from functools import cache
from importlib import resources

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TABLE = "data/process_groups.toml"
DIMS = ("dp", "fsdp", "tp", "cp", "ep", "pp", "world", "other")


class GroupName(msgspec.Struct, frozen=True):
    """One [[group]] row."""

    pattern: str
    dim: str
    example: str
    source: str

    @property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern, re.IGNORECASE)


@cache
def rows() -> tuple[GroupName, ...]:
    table = tomllib.loads(resources.files("diag.knowledge").joinpath(TABLE).read_text(encoding="utf-8"))
    out = tuple(msgspec.convert(r, GroupName) for r in table["group"])
    bad = [r.dim for r in out if r.dim not in DIMS]
    if bad:
        raise ValueError(f"{TABLE}: dims {bad} are not among {DIMS}")
    return out


@cache
def _compiled() -> tuple[tuple[re.Pattern[str], GroupName], ...]:
    return tuple((r.regex, r) for r in rows())


def named(desc: str | None) -> GroupName | None:
    """The first row whose pattern matches the whole description, or None (judge it by traffic)."""
    if not desc:
        return None
    return next((r for rx, r in _compiled() if rx.fullmatch(desc.strip())), None)
