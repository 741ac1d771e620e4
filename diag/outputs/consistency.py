"""One truth per report: the report checked against itself before it is printed.

Each part of a report is made by its own code (the header, the ledger, each rule, the clock notes),
and two of them can tell one run two ways: "clock of rank 1 not aligned: no collective links them"
above a stragglers finding that names rank 1 late in 7 collectives. `contradictions` lists every
such disagreement it can find in the document, and, given the analysis, between the document and
what the analysis matched; api.analyze_opened notes each one in the report (a bug in diag, said
where the reader sees it), and tests/test_analyze_real.py holds every shared trace to none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from diag.attribution.ledger import BUCKETS
from diag.engine.run import Analysis
from diag.runtime.durations import percent

# DESIGN.md: a ledger's fractions sum to 1 ± 0.01.
_LEDGER_SLACK = 0.01
# The text report prints the MFU in the header (percent(mfu), one decimal) and again as the ledger's
# model_compute at the bottom of the waterfall (one decimal of a point): they must read alike.
_POINTS_SLACK = 0.05
_NO_LINK = re.compile(r"^clock of rank\(s\) ([\d, …]+) not aligned: no collective")
_RANK = re.compile(r"\brank (\d+)\b")
# "exposed communication 17.4% of the step": the finding's own share, as its summary first says it.
_SHARE = re.compile(r"(\d+(?:\.\d+)?)% of the step")
_LATE = re.compile(r"\brank (\d+) \(last to arrive in (\d+) collectives")


def contradictions(report: dict[str, Any], analysis: Analysis | None = None) -> list[str]:
    """Each way the report disagrees with itself, in words; empty when it holds together."""
    found = [*_ranks(report), *_steps(report), *_ledger(report), *_findings(report), *_clocks(report)]
    if analysis is not None:
        found += _clock_notes_vs_matched(report, analysis)
    return found


def _ranks(r: dict[str, Any]) -> Iterator[str]:
    """The ranks traced, wherever the report lists ranks, and no more of them than the run has."""
    ranks = set(r["ranks"])
    if len(ranks) > r["world_size"]:
        yield f"{len(ranks)} ranks traced in a run of world_size {r['world_size']}"
    for field in ("ledger_by_rank", "clock_offsets_us"):
        keys = {int(k) for k in r[field]}
        if keys != ranks:
            yield f"{field} lists ranks {sorted(keys)[:8]}, the report's ranks are {sorted(ranks)[:8]}"
    if r["worst_rank"] is not None and r["worst_rank"]["rank"] not in ranks:
        yield f"worst rank {r['worst_rank']['rank']} is not a rank traced"
    for p in r["critical_path"]:
        outside = {int(k) for k in p["summary"]["by_rank"]} - ranks
        if outside:
            yield f"the critical path of step {p['step']} runs through rank(s) {sorted(outside)} not traced"


def _steps(r: dict[str, Any]) -> Iterator[str]:
    if len(r["ledger_by_step"]) != r["steps"]:
        yield f"{r['steps']} steps analyzed, ledger_by_step has {len(r['ledger_by_step'])}"
    spread = r["step_time_spread_s"]
    if spread is not None and not (spread["min"] <= spread["median"] <= spread["max"]
                                   and spread["median"] == r["step_time_s"]):
        yield f"step time {r['step_time_s']} outside its spread {spread}"


def _ledger(r: dict[str, Any]) -> Iterator[str]:
    if not r["ledger_by_rank"]:
        return
    total = sum(r["ledger"][b] for b in BUCKETS)
    if not math.isclose(total, 1.0, abs_tol=_LEDGER_SLACK):
        yield f"the ledger sums to {total:.4f} of the step, not 1"
    if r["mfu"] is not None and abs(r["mfu"] - r["ledger"]["model_compute"]) * 100 >= _POINTS_SLACK:
        yield (f"MFU {percent(r['mfu'])} in the header, model_compute {r['ledger']['model_compute'] * 100:.1f} "
               "points at the bottom of the waterfall")


def _findings(r: dict[str, Any]) -> Iterator[str]:
    ranks = set(r["ranks"])
    order = [f["recoverable_fraction"] for f in r["findings"]]
    if order != sorted(order, reverse=True):
        yield "findings are not ordered by what a fix can win"
    for f in r["findings"]:
        name = f"{f['code']} {f['slug']}"
        if not math.isclose(f["mfu_points"], f["lost_fraction"] * 100, rel_tol=1e-9, abs_tol=1e-9):
            yield f"{name}: {f['mfu_points']} points but {f['lost_fraction']} of the step lost"
        if f["recoverable_fraction"] > f["lost_fraction"] + 1e-9:
            yield f"{name}: a fix wins {f['recoverable_fraction']:.4f} of the step, more than the {f['lost_fraction']:.4f} lost"
        if not set(f["ranks"]) <= ranks:
            yield f"{name} names ranks {sorted(set(f['ranks']) - ranks)[:8]} not traced"
        said = {int(m) for m in _RANK.findall(f["summary"])} - ranks
        if said:
            yield f"{name}'s summary speaks of rank(s) {sorted(said)[:8]}, not traced"
        share = _SHARE.search(f["summary"])
        if share and f["lost_fraction"] and abs(float(share.group(1)) - f["mfu_points"]) >= _POINTS_SLACK + 1e-9:
            yield f"{name}'s summary says {share.group(0)}, its figure is {f['mfu_points']:.1f} points"
        yield from _late_ranks(name, f)


def _late_ranks(name: str, f: dict[str, Any]) -> Iterator[str]:
    """MFU005 names each late rank with the collectives it arrived last in: its details count the same."""
    counts = f["details"].get("last_arrivals") if f["code"] == "MFU005" else None
    if not isinstance(counts, dict):
        return
    for rank, n in _LATE.findall(f["summary"]):
        if counts.get(rank) != int(n):
            yield f"{name}'s summary has rank {rank} last in {n} collectives, its details {counts.get(rank)}"


def _unlinked(r: dict[str, Any]) -> set[int]:
    return {int(k) for k, v in r["clock_offsets_us"].items() if v is None}


def _clocks(r: dict[str, Any]) -> Iterator[str]:
    """A rank whose offset is null is the one a note says is not aligned, and the other way round."""
    unlinked = _unlinked(r)
    noted: set[int] = set()
    for n in r["notes"]:
        if m := re.match(r"^clock of rank\(s\) ([\d, …]+) not aligned", n):
            noted |= {int(x) for x in re.findall(r"\d+", m.group(1))}
    shown = set(sorted(unlinked)[:8])   # the note names the first eight
    if noted != shown:
        yield f"clock offsets null for rank(s) {sorted(shown)}, the notes say rank(s) {sorted(noted)} are not aligned"


def _clock_notes_vs_matched(r: dict[str, Any], a: Analysis) -> Iterator[str]:
    """"no collective … links them" only where no instance matched on two ranks includes them."""
    for n in r["notes"]:
        if m := _NO_LINK.match(n):
            alone = {int(x) for x in re.findall(r"\d+", m.group(1))}
            shared = {x.instance for x in a.run.matched if x.n_matched >= 2 and x.call.rank in alone}
            if shared:
                yield (f"the notes say no collective links rank(s) {sorted(alone)} to the others, yet "
                       f"{len(shared)} collective instance(s) matched them")
