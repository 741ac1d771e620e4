"""`diag gate`: a regression fails naming what got worse, jitter and noise pass, every budget field
is honoured, the JUnit and GitHub outputs are what CI reads, and bad input exits 2 with one line.

Two tests generate traces (fixtures/) and run the analysis; the rest work on the healthy run's
report JSON, moved by known amounts, which is what the gate reads in CI anyway.
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import run_diag

from diag import cli
from diag.api import analyze_path
from diag.attribution.ledger import BUCKETS
from diag.ingest.options import IngestOptions
from diag.outputs.report import to_json
from fixtures.generate import generate

Report = dict[str, Any]


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


# ------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two-rank runs of the healthy case (seeds 0 and 1) and of exposed_comm as traces, and the healthy
    seed-0 run as a diag DuckDB file and a report JSON. Two ranks keep each analysis near a second."""
    root = tmp_path_factory.mktemp("gate")
    generate("healthy", root / "healthy", world_size=2)
    generate("healthy", root / "healthy_seed1", world_size=2, seed=1)
    generate("exposed_comm", root / "exposed_comm", world_size=2)
    _, report = analyze_path(str(root / "healthy"), str(root / "healthy.duckdb"), ingest_opts=IngestOptions(jobs=1),
                             warn=False)
    (root / "healthy.json").write_text(to_json(report))
    return {"healthy_db": root / "healthy.duckdb", "model": root / "healthy" / "model.toml", "healthy_json": root / "healthy.json",
            "healthy_seed1": root / "healthy_seed1", "exposed_comm": root / "exposed_comm"}


@pytest.fixture()
def healthy(runs: dict[str, Path]) -> Report:
    report: Report = json.loads(runs["healthy_json"].read_text())
    return report


@pytest.fixture()
def gate(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """`diag gate ARGS` through cli.main in this process (fast), as outside GitHub Actions."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(*args: str | Path) -> Result:
        capsys.readouterr()
        code = cli.main(["gate", *map(str, args)])
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def gate_process(*args: str | Path) -> Result:
    """`diag gate ARGS` as a real subprocess: the exit-code contract CI relies on."""
    r = run_diag("gate", *map(str, args), env={"GITHUB_ACTIONS": "", "GITHUB_STEP_SUMMARY": ""})
    return Result(r.returncode, r.stdout, r.stderr)


# ----------------------------------------------------------------------- moving a report's numbers

def _ledgers(r: Report) -> Iterator[dict[str, float]]:
    """Every place the report holds a ledger: they must all move together."""
    yield r["ledger"]
    yield from r["ledger_by_rank"].values()
    yield from r["ledger_by_step"].values()
    yield r["ledger_median_over_steps"]
    if r.get("worst_rank"):
        yield r["worst_rank"]["ledger"]


def moved(r: Report, points: float, src: str, dst: str) -> Report:
    """A copy with POINTS of the step moved from bucket SRC to DST (MFU follows model_compute)."""
    out = copy.deepcopy(r)
    for led in _ledgers(out):
        led[src] -= points / 100
        led[dst] += points / 100
    out["mfu"] += (points / 100) * ((dst == "model_compute") - (src == "model_compute"))
    return out


def jittered(r: Report, seed: int, points: float) -> Report:
    """A copy where each step's buckets wobble by up to ±POINTS (gemm_inefficiency absorbs the sum)."""
    rng = random.Random(seed)
    out = copy.deepcopy(r)
    for row in out["ledger_by_step"].values():
        for b in BUCKETS:
            if b != "gemm_inefficiency" and row[b] > 0:
                d = rng.uniform(-points, points) / 100
                row[b] += d
                row["gemm_inefficiency"] -= d
    steps = list(out["ledger_by_step"].values())
    out["ledger"] = {b: statistics.fmean(s[b] for s in steps) for b in BUCKETS}
    out["mfu"] = out["ledger"]["model_compute"]
    return out


def with_steps(r: Report, bucket: str, per_step_points: list[float], src: str = "gemm_inefficiency") -> Report:
    """A copy whose steps hold BUCKET at these values (points), SRC giving or taking the difference."""
    out = copy.deepcopy(r)
    rows = list(out["ledger_by_step"].values())
    assert len(rows) == len(per_step_points)
    for row, p in zip(rows, per_step_points, strict=True):
        row[src] -= p / 100 - row[bucket]
        row[bucket] = p / 100
    for b in (bucket, src):
        out["ledger"][b] = statistics.fmean(row[b] for row in rows)
    return out


def finding(code: str, slug: str, severity: str, points: float) -> dict[str, Any]:
    return {"code": code, "slug": slug, "severity": severity, "lost_fraction": points / 100,
            "lost_s": 0.0, "mfu_points": points, "what_if_mfu": None, "ranks": [0], "steps": [1],
            "evidence": [], "advice": "raise num_workers", "summary": "the GPU waits for the loader", "details": {}}


def write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def budget(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def as_json(res: Result) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(res.out)
    return doc


def check(doc: dict[str, Any], name: str) -> dict[str, Any]:
    row: dict[str, Any] = next(c for c in doc["checks"] + doc["rules"] if name in (c.get("name"), c.get("code")))
    return row


# ----------------------------------------------------------------------------------- traces

def test_exposed_comm_regression_fails_naming_the_bucket(runs: dict[str, Path], gate: Callable[..., Result]) -> None:
    # Baseline as the report JSON, current as a trace directory analyzed on the spot.
    res = gate("--baseline", runs["healthy_json"], runs["exposed_comm"], "--jobs", "1")
    assert res.code == 1, res.err
    head = res.out.splitlines()[0]
    assert head.startswith("diag gate: FAIL") and "exposed_comm" in head
    worse = res.out.split("what got worse:")[1]
    assert "exposed_comm grew" in worse and "MFU fell" in worse and "MFU001 exposed-collectives at high" in worse


def test_another_seed_passes(runs: dict[str, Path], gate: Callable[..., Result]) -> None:
    # The same healthy run with another seed: real jitter. Baseline as a diag DuckDB file this time,
    # which keeps no model.toml: --model gives it, else the two MFU numerators differ (exit 2).
    res = gate("--baseline", runs["healthy_db"], runs["healthy_seed1"], "--model", runs["model"], "--jobs", "1",
               "--format", "json")
    assert res.code == 0, res.out + res.err
    doc = as_json(res)
    assert doc["verdict"] == "pass" and doc["failures"] == []
    changed = [c for c in doc["checks"] if c["delta_points"] != 0]
    assert changed and all(abs(c["delta_points"]) < 0.5 for c in changed)     # it did move, a little


# ------------------------------------------------------------------------------- report JSON

def test_jitter_passes(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    for seed in range(3):
        cur = write(tmp_path / f"jitter{seed}.json", jittered(healthy, seed, points=0.3))
        res = gate("--baseline", base, cur)
        assert res.code == 0, res.out
        assert res.out.startswith("diag gate: PASS")


def test_grown_bucket_fails_with_the_numbers(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    cur = write(tmp_path / "cur.json", moved(healthy, 2.5, "model_compute", "exposed_comm"))
    res = gate("--baseline", base, cur, "--format", "json")
    doc = as_json(res)
    assert res.code == 1 and doc["verdict"] == "fail" and doc["exit_code"] == 1
    row = check(doc, "exposed_comm")
    assert row["verdict"] == "fail" and row["delta_points"] == pytest.approx(2.5)
    assert check(doc, "mfu")["verdict"] == "fail"
    assert {c["name"] for c in doc["checks"] if c["verdict"] == "fail"} == {"mfu", "model_compute", "exposed_comm"}
    assert any("exposed_comm grew 2.50 points" in f for f in doc["failures"])


def test_mfu_budget_is_honoured(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    cur = write(tmp_path / "cur.json", moved(healthy, 2.0, "model_compute", "gemm_inefficiency"))
    loose_buckets = "[buckets]\nmax_growth_points = 5.0\n"
    assert gate("--baseline", base, cur, "--budget", budget(tmp_path / "a.toml", loose_buckets)).code == 1
    ok = gate("--baseline", base, cur, "--budget",
              budget(tmp_path / "b.toml", loose_buckets + "[mfu]\nmax_drop_points = 2.5\n"))
    assert ok.code == 0, ok.out


def test_bucket_budgets_are_honoured(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    cur = write(tmp_path / "cur.json", moved(healthy, 2.0, "gemm_inefficiency", "memcpy"))

    def verdict(text: str) -> str:
        doc = as_json(gate("--baseline", base, cur, "--format", "json", "--budget", budget(tmp_path / "b.toml", text)))
        return str(check(doc, "memcpy")["verdict"])

    assert verdict("") == "fail"                                               # default: 1 point
    assert verdict("[buckets]\nmax_growth_points = 3.0\n") == "pass"
    assert verdict("[buckets]\nmemcpy = 2.5\n") == "pass"
    assert verdict("[buckets]\nmax_growth_points = 3.0\nmemcpy = 1.5\n") == "fail"   # the bucket's own wins


def test_rule_severity_budget_is_honoured(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    new = copy.deepcopy(healthy)
    new["findings"].append(finding("MFU006", "dataloader-stall", "low", 0.8))
    cur = write(tmp_path / "cur.json", new)
    bucket_ok = "[buckets]\nmax_growth_points = 5.0\n"

    def run(rules: str) -> Result:
        return gate("--baseline", base, cur, "--budget", budget(tmp_path / "b.toml", bucket_ok + rules))

    assert run("").code == 0                                  # default: a new finding fails at medium
    res = run('[rules]\nfail_at = "low"\n')
    assert res.code == 1 and "MFU006 dataloader-stall" in res.out.splitlines()[0]
    assert "raise num_workers" in res.out                     # the rule's advice travels with the failure
    assert run('[rules]\nfail_at = "low"\nMFU006 = "off"\n').code == 0
    assert run('[rules]\n"dataloader-stall" = "info"\n').code == 1    # by slug too
    # A finding the baseline already had at that severity is not new.
    write(base, new)
    assert run('[rules]\nfail_at = "low"\n').code == 0


def test_change_inside_the_baselines_spread_passes_as_noise(healthy: Report, gate: Callable[..., Result],
                                                             tmp_path: Path) -> None:
    # Baseline steps at 4, 6 and 5 points of exposed comm: mean 5, standard deviation 1, noise 3 × 1 = 3.
    base = write(tmp_path / "base.json", with_steps(healthy, "exposed_comm", [4.0, 6.0, 5.0]))
    noisy = with_steps(healthy, "exposed_comm", [7.5, 7.5, 7.5])        # +2.5: beyond 1, inside 3
    cur = write(tmp_path / "cur.json", noisy)
    res = gate("--baseline", base, cur)
    assert res.code == 0, res.out
    assert "noise" in res.out.splitlines()[0]
    said = res.out.split("within noise:")[1]
    assert "exposed_comm grew 2.50 points" in said and "inside 3 × the baseline's step-to-step" in said
    doc = as_json(gate("--baseline", base, cur, "--format", "json"))
    row = check(doc, "exposed_comm")
    assert row["verdict"] == "noise" and row["noise_points"] == pytest.approx(3 * statistics.stdev([4, 6, 5]))
    # The same change beyond the spread fails; so does this one under a smaller k, or too few steps.
    assert gate("--baseline", base, write(tmp_path / "far.json",
                                          with_steps(healthy, "exposed_comm", [8.5, 8.5, 8.5]))).code == 1
    assert gate("--baseline", base, cur, "--budget", budget(tmp_path / "k.toml", "[noise]\nk = 2.0\n")).code == 1
    few = gate("--baseline", base, cur, "--budget", budget(tmp_path / "m.toml", "[noise]\nmin_steps = 4\n"))
    assert few.code == 1 and "the budget alone decides" in few.out


def test_noise_follows_the_baseline_not_the_current_run(healthy: Report, gate: Callable[..., Result],
                                                        tmp_path: Path) -> None:
    # A current run that became erratic must not widen its own tolerance.
    base = write(tmp_path / "base.json", with_steps(healthy, "exposed_comm", [5.0, 5.0, 5.0]))
    erratic = write(tmp_path / "cur.json", with_steps(healthy, "exposed_comm", [3.0, 12.0, 7.5]))
    assert gate("--baseline", base, erratic).code == 1


def test_junit_has_a_case_per_check_and_validates(healthy: Report, gate: Callable[..., Result],
                                                  tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    cur = write(tmp_path / "cur.json", moved(healthy, 2.5, "model_compute", "exposed_comm"))
    junit = tmp_path / "gate.xml"
    assert gate("--baseline", base, cur, "--junit", junit).code == 1
    root = assert_valid_junit(junit.read_text())
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {"MFU", *BUCKETS} | {f"{r.code} {r.slug}" for r in _rules()}
    assert root.get("failures") == "3"
    failure = cases["exposed_comm"].find("failure")
    assert failure is not None and failure.text is not None
    assert "exposed_comm grew 2.50 points" in failure.get("message", "")
    assert "delta: +2.5000 points" in failure.text and "budget: 1.0000 points" in failure.text
    assert cases["exposed_comm"].get("classname") == "diag.gate.ledger"


@pytest.mark.parametrize("break_it", [
    lambda root: root.find("testsuite/testcase").attrib.pop("classname"),
    lambda root: root.find("testsuite").set("failures", "0"),
    lambda root: root.find("testsuite/testcase/failure").attrib.pop("type"),
    lambda root: root.find("testsuite").set("time", "soon"),
    lambda root: ET.SubElement(root.find("testsuite/testcase"), "error", message="x", type="y"),
])
def test_junit_check_catches_what_ci_rejects(healthy: Report, gate: Callable[..., Result], tmp_path: Path,
                                             break_it: Callable[[Any], Any]) -> None:
    # The check above is only worth something if it fails on documents CI would misread.
    cur = write(tmp_path / "cur.json", moved(healthy, 2.5, "model_compute", "exposed_comm"))
    gate("--baseline", write(tmp_path / "base.json", healthy), cur, "--junit", tmp_path / "gate.xml")
    root = ET.fromstring((tmp_path / "gate.xml").read_text())
    break_it(root)
    with pytest.raises(AssertionError):
        assert_valid_junit(ET.tostring(root, encoding="unicode"))


def test_junit_reports_bad_input_as_an_error(gate: Callable[..., Result], tmp_path: Path) -> None:
    junit = tmp_path / "gate.xml"
    cur = write(tmp_path / "cur.json", {"schema": "diag.report/1"})
    assert gate("--baseline", tmp_path / "missing.json", cur, "--junit", junit).code == 2
    root = assert_valid_junit(junit.read_text())
    assert root.get("errors") == "1" and "missing.json" in junit.read_text()


def test_github_actions_annotations_and_step_summary(healthy: Report, gate: Callable[..., Result],
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    base = write(tmp_path / "base.json", with_steps(healthy, "memcpy", [1.0, 3.0, 2.0]))
    worse = moved(with_steps(healthy, "memcpy", [3.5, 3.5, 3.5]), 2.5, "model_compute", "exposed_comm")
    res = gate("--baseline", base, write(tmp_path / "cur.json", worse))
    assert res.code == 1
    errors = [line for line in res.err.splitlines() if line.startswith("::error ")]
    warnings = [line for line in res.err.splitlines() if line.startswith("::warning ")]
    assert any(line.startswith("::error title=diag gate%3A exposed_comm regressed::exposed_comm grew") for line in errors)
    assert len(errors) == 3 and len(warnings) == 1 and "memcpy" in warnings[0]
    assert all("%25" in line and "%)" not in line for line in errors)     # "%" escaped as the runner needs
    assert not res.out.startswith("::")                                    # stdout stays the table
    text = summary.read_text()
    assert text.startswith("earlier step\n## diag gate ❌ failed")
    assert "| `exposed_comm` |" in text and "❌ fail" in text and "⚠️ noise" in text
    # Bad input: the annotation, then the one line every run prints.
    bad = gate("--baseline", tmp_path / "nope.json", base)
    assert bad.code == 2 and bad.err.splitlines() == [
        f"::error title=diag gate%3A bad input::{tmp_path / 'nope.json'}: no such file or directory",
        f"diag: {tmp_path / 'nope.json'}: no such file or directory"]


def test_other_world_size_is_refused_unless_allowed(healthy: Report, gate: Callable[..., Result],
                                                    tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    other = copy.deepcopy(healthy)
    other["world_size"] = 16
    cur = write(tmp_path / "cur.json", other)
    res = gate("--baseline", base, cur)
    assert res.code == 2 and res.err.count("\n") == 1
    assert str(cur) in res.err and "world size 16 vs the baseline's 2" in res.err and "--allow-mismatch" in res.err
    allowed = gate("--baseline", base, cur, "--allow-mismatch")
    assert allowed.code == 0 and "mismatch allowed: world size 16" in allowed.out


def test_other_model_is_refused(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    inferred = {**copy.deepcopy(healthy), "model": None}       # FLOPs inferred from the trace: another numerator
    res = gate("--baseline", base, write(tmp_path / "inferred.json", inferred))
    assert res.code == 2 and "model inferred from the trace vs the baseline's model (5.03e+07 params)" in res.err
    bigger = copy.deepcopy(healthy)
    bigger["model"]["params"] *= 2
    assert gate("--baseline", base, write(tmp_path / "bigger.json", bigger)).code == 2
    renamed = copy.deepcopy(healthy)
    renamed["model"]["name"] = "gpt-small"                      # a label, not a different model
    assert gate("--baseline", base, write(tmp_path / "renamed.json", renamed)).code == 0


def test_a_moved_dtype_mix_is_the_same_device(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    # H100 SXM dense bf16 989.4, fp8 1978.9 TFLOP/s: 2:1 fp8:bf16 FLOPs → 1 / (0.667/1978.9 + 0.333/989.4)
    # = 1484.1; 3:1 → 1583.1. More GEMMs in fp8 moves the effective peak; the gate compares the MFUs.
    def on_h100(mix: dict[str, float], peak: float) -> Report:
        r = copy.deepcopy(healthy)
        r["device"] = {**r["device"], "part": "h100-sxm", "dtype": "fp8", "dtype_mix": mix, "peak_tflops": peak}
        return r

    base = write(tmp_path / "base.json", on_h100({"fp8": 2 / 3, "bf16": 1 / 3}, 1484.1))
    assert gate("--baseline", base, write(tmp_path / "more_fp8.json", on_h100({"fp8": 0.75, "bf16": 0.25}, 1583.1))).code == 0
    # The same mix at another peak is another denominator (a --peak-tflops, or another part's table).
    other = gate("--baseline", base, write(tmp_path / "other.json", on_h100({"fp8": 2 / 3, "bf16": 1 / 3}, 1300.0)))
    assert other.code == 2 and "device" in other.err
    moved_part = on_h100({"fp8": 0.75, "bf16": 0.25}, 1583.1)
    moved_part["device"]["part"] = "h200"
    assert gate("--baseline", base, write(tmp_path / "h200.json", moved_part)).code == 2


def test_damaged_trace_file_is_read_as_a_trace(runs: dict[str, Path], healthy: Report, gate: Callable[..., Result],
                                               tmp_path: Path) -> None:
    # A killed run's trace: ingest names the damage and its offset, and offers --salvage.
    text = (runs["exposed_comm"] / "rank-0.json").read_bytes()
    cut = tmp_path / "rank-0.json"
    cut.write_bytes(text[: len(text) // 2])
    res = gate("--baseline", write(tmp_path / "base.json", healthy), cut, "--jobs", "1")
    assert res.code == 2 and res.err.count("\n") == 1
    assert res.err.startswith(f"diag: {cut}: truncated JSON") and f"(at byte {len(text) // 2})" in res.err


@pytest.mark.parametrize("text, says", [
    ('[bucket]\nmemcpy = 1\n', "unknown key 'bucket' in the top level"),
    ('[buckets]\nmemcopy = 1\n', "unknown key 'memcopy' in [buckets]"),
    ('[rules]\nMFU099 = "low"\n', "unknown key 'MFU099' in [rules]"),
    ('[rules]\nfail_at = "severe"\n', "expected one of info, low, medium, high, off"),
    ('[mfu]\nmax_drop_points = "1"\n', "expected a number"),
    ('[noise]\nmin_steps = 1\n', "min_steps = 1"),
    ("[mfu\n", "not a TOML budget"),
])
def test_bad_budget_exits_2_naming_it(healthy: Report, gate: Callable[..., Result], tmp_path: Path,
                                      text: str, says: str) -> None:
    base = write(tmp_path / "base.json", healthy)
    b = budget(tmp_path / "budget.toml", text)
    res = gate("--baseline", base, base, "--budget", b)
    assert res.code == 2 and res.err.count("\n") == 1 and str(b) in res.err and says in res.err, res.err


def test_json_output_is_complete(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    doc = as_json(gate("--baseline", base, base, "--format", "json"))
    assert doc["schema"] == "diag.gate/1" and doc["verdict"] == "pass" and doc["exit_code"] == 0
    assert [c["name"] for c in doc["checks"]] == ["mfu", *BUCKETS]
    assert [r["code"] for r in doc["rules"]] == [r.code for r in _rules()]
    assert doc["baseline"]["world_size"] == 2 and doc["baseline"]["steps"] == 3
    assert doc["budget"]["mfu_max_drop_points"] == 1.0 and doc["budget"]["noise_k"] == 3.0


def test_unknown_mfu_is_skipped_not_failed(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    # No peak for the device: MFU is null in both reports; model_compute still gates.
    unknown = write(tmp_path / "base.json", {**healthy, "mfu": None})
    junit = tmp_path / "gate.xml"
    res = gate("--baseline", unknown, unknown, "--format", "json", "--junit", junit)
    doc = as_json(res)
    assert res.code == 0 and check(doc, "mfu")["verdict"] == "skip"
    assert any("the MFU check is skipped; model_compute still gates" in n for n in doc["notes"])
    suite = assert_valid_junit(junit.read_text()).find("testsuite")
    assert suite is not None and suite.get("skipped") == "1"


# ------------------------------------------------------------------------------- exit codes

def bad_inputs(tmp_path: Path, healthy: Report) -> dict[str, tuple[Path, str]]:
    """Each kind of bad baseline and what its one line must say."""
    not_json = tmp_path / "garbled.json"
    not_json.write_text('{"schema": "diag.report/1", "world_size": 8,, }')
    other_schema = write(tmp_path / "v2.json", {**healthy, "schema": "diag.report/2"})
    no_ledger = copy.deepcopy(healthy)
    del no_ledger["ledger"]["memcpy"]
    return {
        "missing": (tmp_path / "nope.json", "no such file or directory"),
        "not JSON": (not_json, "not JSON (Expecting property name enclosed in double quotes)"),
        "schema": (other_schema, "schema 'diag.report/2', but diag gate reads 'diag.report/1'"),
        "a list": (write(tmp_path / "list.json", [1, 2]), "a JSON list, not a diag.report/1 document"),
        "wrong type": (write(tmp_path / "t.json", {**healthy, "steps": "three"}), "Expected `int`, got `str`"),
        "incomplete ledger": (write(tmp_path / "l.json", no_ledger), "ledger lacks bucket(s) memcpy"),
    }


def test_bad_baselines_exit_2_with_one_line(healthy: Report, gate: Callable[..., Result], tmp_path: Path) -> None:
    cur = write(tmp_path / "cur.json", healthy)
    cases = bad_inputs(tmp_path, healthy)
    for kind, (path, says) in cases.items():
        # One as a real `diag gate` process (the CI contract), the rest in process (the same cli.main).
        run = gate_process if kind == "schema" else gate
        res = run("--baseline", path, cur)
        assert res.code == 2, (kind, res)
        assert res.err.count("\n") == 1 and "Traceback" not in res.err, (kind, res.err)
        assert res.err.startswith(f"diag: {path}: ") and says in res.err, (kind, res.err)
        assert res.out == "", kind
    # The byte offset of the damage, where JSON says where.
    garbled = cases["not JSON"][0]
    assert f"(at byte {garbled.read_text().index(',,') + 1})" in gate("--baseline", garbled, cur).err


def test_regression_exit_code_from_a_real_process(healthy: Report, tmp_path: Path) -> None:
    base = write(tmp_path / "base.json", healthy)
    cur = write(tmp_path / "cur.json", moved(healthy, 2.5, "model_compute", "exposed_comm"))
    res = gate_process("--baseline", base, cur)
    assert res.code == 1 and "exposed_comm" in res.out.splitlines()[0] and res.err == ""


# ------------------------------------------------------------------------------------ helpers

def _rules() -> tuple[Any, ...]:
    from rules import RULES

    return RULES


def _decimal(value: str | None) -> bool:
    try:
        float(value or "")
    except ValueError:
        return False
    return True


def assert_valid_junit(text: str) -> ET.Element:
    """The JUnit structure Jenkins (junit-4.xsd of jenkinsci/xunit-plugin), GitLab and GitHub's report
    actions read: testsuites > testsuite > testcase > failure | error | skipped, with name and classname
    on each case, tests/failures/errors counts that add up, numeric times, message and type on failures."""
    root = ET.fromstring(text)
    assert root.tag == "testsuites"
    totals = dict.fromkeys(("tests", "failures", "errors"), 0)
    for suite in root:
        assert suite.tag == "testsuite" and suite.get("name")
        assert {c.tag for c in suite} <= {"properties", "testcase", "system-out", "system-err"}
        cases = suite.findall("testcase")
        counted = {"tests": len(cases), "failures": 0, "errors": 0, "skipped": 0}
        for case in cases:
            assert case.get("name") and case.get("classname") and _decimal(case.get("time"))
            outcome = [c for c in case if c.tag in ("failure", "error", "skipped")]
            assert len(outcome) <= 1 and {c.tag for c in case} <= {"failure", "error", "skipped", "system-out",
                                                                    "system-err"}
            for c in outcome:
                counted[{"failure": "failures", "error": "errors", "skipped": "skipped"}[c.tag]] += 1
                if c.tag != "skipped":
                    assert c.get("message") and c.get("type"), ET.tostring(c)
        for key, n in counted.items():
            assert suite.get(key) == str(n), (key, suite.attrib)
        assert _decimal(suite.get("time"))
        for key in totals:
            totals[key] += counted[key]
    for key, n in totals.items():
        assert root.get(key) == str(n), (key, root.attrib)
    return root


def _poisoned(healthy: Report, where: str) -> Report:
    """A copy of the report with one number the gate must refuse (issue 15, item 5)."""
    out = copy.deepcopy(healthy)
    step = next(iter(out["ledger_by_step"]))
    if where == "nan mfu":
        out["mfu"] = float("nan")
    elif where == "inf bucket":
        out["ledger"]["exposed_comm"] = float("inf")
    elif where == "nan step":
        out["ledger_by_step"][step]["model_compute"] = float("nan")
    elif where == "string params":
        out["model"] = {"name": "llama3-8b", "params": "8e9"}
    elif where == "negative mfu":
        out["mfu"] = -0.2
    return out


@pytest.mark.parametrize("where, says", [
    ("nan mfu", "mfu = nan"),
    ("inf bucket", "ledger.exposed_comm = inf"),
    ("nan step", ".model_compute = nan"),
    ("string params", "model.params = '8e9'"),
    ("negative mfu", "mfu = -0.2"),
])
@pytest.mark.parametrize("side", ["baseline", "current"])
def test_non_finite_or_out_of_range_numbers_exit_2(healthy: Report, gate: Callable[..., Result], tmp_path: Path,
                                                   where: str, says: str, side: str) -> None:
    good = write(tmp_path / "good.json", healthy)
    bad = write(tmp_path / "bad.json", _poisoned(healthy, where))
    res = gate("--baseline", bad, good) if side == "baseline" else gate("--baseline", good, bad)
    assert res.code == 2 and res.err.count("\n") == 1 and res.err.startswith(f"diag: {bad}: "), res
    assert says in res.err, res.err


@pytest.mark.parametrize("text", ["[mfu]\nmax_drop_points = nan\n", "[buckets]\nexposed_comm = inf\n",
                                  "[noise]\nk = nan\n"])
def test_nan_budget_exits_2(healthy: Report, gate: Callable[..., Result], tmp_path: Path, text: str) -> None:
    base = write(tmp_path / "base.json", healthy)
    cur = write(tmp_path / "cur.json", moved(healthy, 5, "model_compute", "exposed_comm"))
    res = gate("--baseline", base, cur, "--budget", budget(tmp_path / "b.toml", text))
    assert res.code == 2 and "finite" in res.err and res.err.count("\n") == 1, res
def test_html_is_one_page_with_the_baseline_vs_current_table(healthy: Report, gate: Callable[..., Result],
                                                              tmp_path: Path) -> None:
    from test_html_report import check_page

    base = write(tmp_path / "base.json", healthy)
    cur = write(tmp_path / "cur.json", moved(healthy, 2.5, "model_compute", "exposed_comm"))
    res = gate("--baseline", base, cur, "--format", "html")
    assert res.code == 1
    assert check_page(res.out) == []   # tables only: no charts
    doc = as_json(gate("--baseline", base, cur, "--format", "json"))
    row = check(doc, "exposed_comm")
    cells = f"<td class=\"n\">{row['baseline_points']:.2f}%</td><td class=\"n\">{row['current_points']:.2f}%</td>"
    assert cells in res.out and "FAILED" in res.out and "exposed_comm grew 2.50 points" in res.out
