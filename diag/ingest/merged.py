"""Files that merge several ranks into one timeline for viewing, split back into one per rank.

Merge tools write every rank's events into one `traceEvents` list and tell the ranks apart by
process: each keeps Kineto's `process_name` metadata event per pid (one for the host process, one
per GPU), and the rank is in
- the pid itself, made a string: sglang's profile_merger writes `"[TP01] 3113936"`, or
  `"[TP00-DP01-PP00-EP00] 0"` with several kinds of parallelism (python/sglang/srt/utils/profile_merger.py);
- the process name: `{"name": "process_name", "args": {"name": "Rank 1"}}` over one pid per rank
  (Megatron-LM-AutoTuner tools/merge_profiler_traces.py), or "RANK 2 …";
- `args.rank` on every event, with pids offset by rank × 10^k (TraceLens TraceFusion/trace_fuse.py).

A file is merged when its process names carry two or more ranks. Its events are then sorted
by rank (per event: args.rank, else its pid's rank, else the rank in a string pid's label) and
each rank becomes a file of its own in the store, so its GPU streams and CPU threads stay apart.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

# Found with bytes.find, a fast literal search: 0.02 s over the 35 MB control trace, where a regex
# took 0.06 (every event has a "name" key for it to try).
_PROCESS_NAME = b'"process_name"'
# A process name or string pid naming a rank: "Rank 1", "RANK 2 (node 0)", "rank-3".
_RANK_WORD = re.compile(r"(?:^|[^a-z])rank[\s_-]*(\d+)", re.IGNORECASE)
# sglang's label: "[TP01]", "[TP00-DP01-PP02-EP03]", then the original pid after a space.
_SGLANG_LABEL = re.compile(r"^\[((?:(?:TP|DP|PP|EP)\d+-?)+)\]\s*(.*)$")
_SGLANG_PART = re.compile(r"(TP|DP|PP|EP)(\d+)")
# sglang orders ranks by (DP, EP, PP, TP) (profile_merger._get_rank_sort_key).
_SGLANG_ORDER = ("DP", "EP", "PP", "TP")
# A process metadata event is a few hundred bytes; look no further for its braces.
_EVENT_REACH = 8192


class _Meta(msgspec.Struct):
    name: str | None = None
    ph: str | None = None
    pid: int | str | None = None
    args: dict[str, Any] = msgspec.field(default_factory=dict)


_meta_decoder = msgspec.json.Decoder(_Meta)


class RankMap(msgspec.Struct):
    """Which rank each pid of a merged file belongs to, and the pid it had before the merge."""

    by_pid: dict[int | str, tuple[int, int | str]]
    ranks: list[int]
    how: str                                    # what the ranks were read from, for the file's warnings
    unplaced: int = 0                           # events whose pid names no rank (kept with the first rank)
    _labels: dict[str, tuple[int, int | str] | None] = msgspec.field(default_factory=dict)
    _sglang_ranks: dict[tuple[tuple[str, int], ...], int] = msgspec.field(default_factory=dict)

    def place(self, pid: int | str | None, args_rank: int | None) -> tuple[int, int | str | None]:
        """(rank, original pid) of an event."""
        if pid is not None and pid in self.by_pid:
            rank, inner = self.by_pid[pid]
            return (rank if args_rank is None else args_rank), inner
        if isinstance(pid, str):
            if pid not in self._labels:
                self._labels[pid] = self._from_label(pid)
            hit = self._labels[pid]
            if hit is not None:
                return hit
        if args_rank is not None:
            return args_rank, pid
        self.unplaced += 1
        return self.ranks[0], pid

    def _from_label(self, pid: str) -> tuple[int, int | str] | None:
        m = _SGLANG_LABEL.match(pid)
        if m:
            key = _sglang_key(m.group(1))
            if key in self._sglang_ranks:
                return self._sglang_ranks[key], _int_or_str(m.group(2))
            return None
        r = _RANK_WORD.search(pid)
        return (int(r.group(1)), pid) if r else None


def rank_map(data: Any) -> RankMap | None:
    """The ranks of a merged file from its process metadata, or None when it is one rank's."""
    metas = list(_process_names(data))
    if not metas:
        return None
    labelled: list[tuple[int | str, Any, int | str]] = []   # (pid, rank key, original pid)
    sglang: set[tuple[tuple[str, int], ...]] = set()
    for m in metas:
        assert m.pid is not None
        args_rank = m.args.get("rank")
        name = m.args.get("name")
        label = _SGLANG_LABEL.match(m.pid) if isinstance(m.pid, str) else None
        if label:
            key = _sglang_key(label.group(1))
            sglang.add(key)
            labelled.append((m.pid, key, _int_or_str(label.group(2))))
        elif isinstance(args_rank, int) and not isinstance(args_rank, bool):
            labelled.append((m.pid, args_rank, m.pid))
        elif (r := _RANK_WORD.search(name if isinstance(name, str) else "") or
              _RANK_WORD.search(m.pid if isinstance(m.pid, str) else "")):
            labelled.append((m.pid, int(r.group(1)), m.pid))
    keys = {k for _, k, _ in labelled}
    if len(keys) < 2:
        return None
    sglang_ranks = _number_sglang(sglang)
    how = "the process names"
    if sglang:
        kinds = {kind for key in sglang for kind, _ in key}
        how = ("sglang's [TPnn] pid labels" if kinds == {"TP"} else
               f"sglang's pid labels, numbered in ({', '.join(_SGLANG_ORDER)}) order")
    by_pid = {pid: (sglang_ranks[k] if isinstance(k, tuple) else k, inner) for pid, k, inner in labelled}
    ranks = sorted({r for r, _ in by_pid.values()})
    return RankMap(by_pid, ranks, how, _sglang_ranks=sglang_ranks)


def _process_names(data: Any) -> Any:
    """Every `process_name` metadata event with a pid, found by its name and decoded alone."""
    at = data.find(_PROCESS_NAME)
    while at >= 0:
        after = at + len(_PROCESS_NAME)
        start = data.rfind(b"{", max(0, at - _EVENT_REACH), at)
        while start >= 0:
            end = _object_end(data, start, after + _EVENT_REACH)
            if end is not None and end > after:
                try:
                    meta = _meta_decoder.decode(data[start:end])
                except msgspec.DecodeError:
                    meta = None
                if meta is not None and meta.name == "process_name" and meta.pid is not None:
                    yield meta
                break
            # That brace opened something inside the event (its args): look further back.
            start = data.rfind(b"{", max(0, at - _EVENT_REACH), start)
        at = data.find(_PROCESS_NAME, after)


def _object_end(data: Any, start: int, limit: int) -> int | None:
    """The end (exclusive) of the JSON object opening at `start`, or None past `limit`."""
    depth = 0
    in_string = escaped = False
    for i, c in enumerate(bytes(data[start : min(limit, len(data))])):
        if escaped:
            escaped = False
        elif in_string:
            escaped = c == 0x5C            # a backslash escapes the next byte
            in_string = c != 0x22
        elif c == 0x22:
            in_string = True
        elif c == 0x7B:
            depth += 1
        elif c == 0x7D:
            depth -= 1
            if depth == 0:
                return start + i + 1
    return None


def _sglang_key(label: str) -> tuple[tuple[str, int], ...]:
    parts = {kind: int(n) for kind, n in _SGLANG_PART.findall(label)}
    return tuple((kind, parts[kind]) for kind in _SGLANG_ORDER if kind in parts)


def _number_sglang(keys: set[tuple[tuple[str, int], ...]]) -> dict[tuple[tuple[str, int], ...], int]:
    """One kind of parallelism: its index is the rank. Several: ranks 0..n-1 in sglang's order."""
    if not keys:
        return {}
    if all(len(k) == 1 for k in keys) and len({k[0][0] for k in keys}) == 1:
        return {k: k[0][1] for k in keys}
    return {k: i for i, k in enumerate(sorted(keys))}


def _int_or_str(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text
