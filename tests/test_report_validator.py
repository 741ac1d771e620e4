"""One report check for the gate and analyze (issue 40, item 9): whatever analyze writes, the gate
reads; an impossible report (a severity no rule gives, MFU past 150%, NaN or Infinity anywhere) is
refused by the gate with exit 2 and one line naming the field."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from diag import cli
from diag.api import analyze_path
from diag.ingest.options import IngestOptions
from diag.outputs.report import to_json
from fixtures.generate import generate

Report = dict[str, Any]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Report:
    out = tmp_path_factory.mktemp("validator") / "run"
    generate("healthy", out, world_size=2)
    _, report = analyze_path(str(out), ingest_opts=IngestOptions(jobs=1), warn=False)
    doc: Report = json.loads(to_json(report))
    return doc


def gate(capsys: pytest.CaptureFixture[str], base: Path, cur: Path) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = cli.main(["gate", "--baseline", str(base), str(cur)])
    return code, capsys.readouterr().err.splitlines()


def finding(r: Report) -> dict[str, Any]:
    if not r["findings"]:
        r["findings"].append({"code": "MFU001", "slug": "exposed-collectives", "severity": "low", "bucket": "exposed_comm",
                              "lost_fraction": 0.01, "recoverable_fraction": 0.01, "lost_s": 0.0, "mfu_points": 1.0,
                              "what_if_mfu": None, "what_if_mfu_naive": None, "ranks": [0], "steps": [1],
                              "evidence": [], "advice": "", "summary": "", "details": {}})
    f: dict[str, Any] = r["findings"][0]
    return f


BROKEN: dict[str, tuple[Callable[[Report], None], str]] = {
    "severity catastrophic": (lambda r: finding(r).__setitem__("severity", "catastrophic"), "severity"),
    "severity HIGH": (lambda r: finding(r).__setitem__("severity", "HIGH"), "severity"),
    "mfu 1.6": (lambda r: r.__setitem__("mfu", 1.6), "mfu"),
    "mfu 1e300": (lambda r: r.__setitem__("mfu", 1e300), "mfu"),
    "hfu NaN": (lambda r: r.__setitem__("hfu", float("nan")), "hfu"),
    "ledger_by_rank NaN": (lambda r: r["ledger_by_rank"]["0"].__setitem__("idle_other", float("nan")),
                           "ledger_by_rank"),
    "recoverable_fraction NaN": (lambda r: finding(r).__setitem__("recoverable_fraction", float("nan")),
                                 "recoverable_fraction"),
    "Infinity in details": (lambda r: finding(r).__setitem__("details", {"x": [1.0, float("inf")]}), "details"),
}


@pytest.mark.parametrize("what", BROKEN)
def test_the_gate_refuses_impossible_reports(healthy: Report, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             what: str) -> None:
    change, field = BROKEN[what]
    bad = copy.deepcopy(healthy)
    change(bad)
    base, cur = tmp_path / "base.json", tmp_path / "cur.json"
    base.write_text(json.dumps(healthy))
    cur.write_text(json.dumps(bad))   # NaN and Infinity as JSON parsers take them
    for b, c in ((base, cur), (cur, base)):
        code, err = gate(capsys, b, c)
        assert code == 2 and len(err) == 1 and field in err[0] and str(cur) in err[0], err


def test_what_analyze_writes_the_gate_reads(healthy: Report, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A trace whose steps take no time gave step_time_s 0.0, and a number as the device's name a float
    # device.name: reports analyze wrote with exit 0 and the gate then refused.
    zero = copy.deepcopy(healthy)
    zero["step_time_s"] = 0.0
    base = tmp_path / "base.json"
    base.write_text(json.dumps(healthy))
    (tmp_path / "zero.json").write_text(json.dumps(zero))
    assert gate(capsys, base, tmp_path / "zero.json")[0] in (0, 1)

    run = tmp_path / "run"
    generate("healthy", run, world_size=2)
    for p in run.glob("rank-*.json"):
        doc = json.loads(p.read_text())
        for d in doc["deviceProperties"]:
            d["name"] = 1.5
        p.write_text(json.dumps(doc))
    out = tmp_path / "named.json"
    capsys.readouterr()
    assert cli.main(["analyze", str(run), "--format", "json", "--out", str(out), "--jobs", "1"]) == 0
    assert json.loads(out.read_text())["device"]["name"] is None
    assert gate(capsys, out, out)[0] == 0
