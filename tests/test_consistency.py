"""One truth per report (issue 39, diag/outputs/consistency.py): each kind of contradiction the pass
looks for is caught in a report made to hold it, and none is found in the reports diag makes (every
shared trace: tests/test_analyze_real.py; every generated case: tests/test_cases.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import shared_traces

from diag.api import analyze_path
from diag.engine.run import Analysis
from diag.ingest.options import IngestOptions
from diag.outputs.consistency import contradictions
from diag.outputs.gate import Budget, Run, check_report, compare
from diag.outputs.gate_output import render_text
from diag.outputs.report import render_text as report_text
from diag.outputs.report import to_json

pytestmark = pytest.mark.xdist_group("consistency")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Analysis, dict[str, Any]]:
    from fixtures.generate import generate

    out = tmp_path_factory.mktemp("consistency") / "demo"
    generate("demo", out)
    return analyze_path(str(out), None, ingest_opts=IngestOptions(jobs=1), warn=False)


def _changed(report: dict[str, Any], **where: Any) -> dict[str, Any]:
    r = copy.deepcopy(report)
    r.update(where)
    return r


def test_the_demo_holds_together(demo: tuple[Analysis, dict[str, Any]]) -> None:
    a, report = demo
    assert contradictions(report, a) == []
    assert not [n for n in report["notes"] if "internal check" in n]


def test_more_ranks_traced_than_the_run_has(demo: tuple[Analysis, dict[str, Any]]) -> None:
    _, report = demo
    assert contradictions(_changed(report, world_size=4)) == ["8 ranks traced in a run of world_size 4"]


def test_a_summary_naming_a_rank_not_traced(demo: tuple[Analysis, dict[str, Any]]) -> None:
    _, report = demo
    r = copy.deepcopy(report)
    r["findings"][0]["summary"] += "; rank 12 is slow"
    [said] = contradictions(r)
    assert said.endswith("summary speaks of rank(s) [12], not traced")


def test_a_summary_and_its_details_disagree(demo: tuple[Analysis, dict[str, Any]]) -> None:
    """MFU005's summary says rank 5 arrived last in 3 collectives; its details must count 3."""
    _, report = demo
    r = copy.deepcopy(report)
    late = next(f for f in r["findings"] if f["code"] == "MFU005")
    assert "rank 5 (last to arrive in 3 collectives" in late["summary"] and late["details"]["last_arrivals"] == {"5": 3}
    late["details"]["last_arrivals"]["5"] = 7
    assert contradictions(r) == ["MFU005 stragglers's summary has rank 5 last in 3 collectives, its details 7"]
    share = copy.deepcopy(report)
    first = share["findings"][0]
    first["summary"] = first["summary"].replace(f"{first['mfu_points']:.1f}% of the step", "3.0% of the step")
    assert contradictions(share) == [f"{first['code']} {first['slug']}'s summary says 3.0% of the step, its figure "
                                     f"is {first['mfu_points']:.1f} points"]


def test_the_header_mfu_and_the_waterfall_disagree(demo: tuple[Analysis, dict[str, Any]]) -> None:
    _, report = demo
    [said] = contradictions(_changed(report, mfu=report["mfu"] + 0.01))
    assert said.startswith("MFU 33.9% in the header, model_compute 32.9 points")


def test_a_clock_note_that_denies_the_matched_collectives(demo: tuple[Analysis, dict[str, Any]]) -> None:
    """The contradiction issue 39 found: "no collective … links them" while collectives were matched."""
    a, report = demo
    r = copy.deepcopy(report)
    r["clock_offsets_us"]["1"] = None
    assert contradictions(r) == ["clock offsets null for rank(s) [1], the notes say rank(s) [] are not aligned"]
    r["notes"].append("clock of rank(s) 1 not aligned: no collective, and no send/recv naming its peer, links "
                      "them to rank 0; their times stay on their own clocks")
    assert contradictions(r) == []      # the document alone agrees with itself
    [said] = contradictions(r, a)       # the analysis matched rank 1 in every all-reduce
    assert said.startswith("the notes say no collective links rank(s) [1] to the others, yet 3 collective instance(s)")


def test_hta_all_to_all_pair_says_one_thing(tmp_path: Path) -> None:
    """HTA's two ranks of a 128-rank job: the clock note counts the all-to-all instances it could not
    align on (and MFU005 reads the same ones), and the gate's header says "2 of 128 ranks traced" as
    analyze's does."""
    trace = shared_traces() / "HolisticTraceAnalysis/tests/data/trace_filter"
    a, report = analyze_path(str(trace), None, ingest_opts=IngestOptions(jobs=1), warn=False)
    assert contradictions(report, a) == []
    [note] = [n for n in report["notes"] if n.startswith("clock of rank(s) 1")]
    assert "the 10 collective instance(s) they share" in note and "no collective" not in note
    assert report_text(report).splitlines()[1].startswith("2 of 128 ranks traced × 2 steps")
    view = check_report(json.loads(to_json(report)), "r.json")
    gate = render_text(compare(Run("base", view), Run("cur", view), Budget(), ()))
    assert "base: 2 of 128 ranks traced × 2 steps" in gate and "128 ranks ×" not in gate
