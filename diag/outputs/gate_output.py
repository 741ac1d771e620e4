"""What `diag gate` prints: the human table, JSON, Markdown, JUnit XML and GitHub Actions annotations.

Every renderer says the same things from the same sentences (`describe`), so a failure reads alike
in a terminal, a JUnit viewer, a PR annotation and the job summary. The sentences carry names from
the reports (paths, kernels and ops in findings' summaries, device and model names): each renderer
writes them through its sink's escaping (diag/runtime/sanitize.py).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

from diag.outputs.gate import GateResult, MetricCheck, RuleCheck, Run
from diag.runtime.durations import ranks_traced
from diag.runtime.errors import BadInput, ExitCode
from diag.runtime.sanitize import html_text, markdown, terminal, workflow_data, workflow_property, xml

GATE_SCHEMA = "diag.gate/1"
_WORD = {"pass": "ok", "better": "better", "noise": "noise", "fail": "FAIL", "skip": "skip"}
_MARK = {"pass": "✅ ok", "better": "✅ better", "noise": "⚠️ noise", "fail": "❌ fail", "skip": "➖ skip"}
_LOWER_IS_WORSE = ("mfu", "model_compute")


def label(c: MetricCheck | RuleCheck) -> str:
    if isinstance(c, RuleCheck):
        return f"{c.code} {c.slug}"
    return "MFU" if c.name == "mfu" else c.name


def describe(c: MetricCheck | RuleCheck, k: float) -> str:
    """One line with the numbers: what changed, against what allowance, and the verdict."""
    if isinstance(c, RuleCheck):
        return _describe_rule(c, k)
    if c.worse_points is None:
        return f"{label(c)}: unknown in one of the runs; not compared"
    of = "" if c.name == "mfu" else " of the step"
    if abs(c.worse_points) < 0.005:
        return f"{label(c)} unchanged at {c.current_points:.2f}%{of}; allowed {c.allowed_points:.2f}"
    verb = ("fell" if c.worse_points > 0 else "rose") if c.name in _LOWER_IS_WORSE else \
        ("grew" if c.worse_points > 0 else "shrank")
    change = (f"{label(c)} {verb} {abs(c.worse_points):.2f} points "
              f"({c.baseline_points:.2f}% → {c.current_points:.2f}%{of})")
    spread = f"{k:g} × the baseline's step-to-step standard deviation"
    if c.verdict == "fail":
        noisier = c.noise_points is not None and c.noise_points > c.budget_points
        why = f"{spread}; the budget is {c.budget_points:.2f}" if noisier else "the budget"
        return f"{change}, more than the {c.allowed_points:.2f} allowed ({why})"
    if c.verdict == "noise":
        return (f"{change}: beyond the budget {c.budget_points:.2f} but inside {spread} "
                f"({c.noise_points:.2f} points), so within noise: passes")
    return f"{change}; allowed {c.allowed_points:.2f}"


def _describe_rule(c: RuleCheck, k: float) -> str:
    name = label(c)
    if c.current_severity is None:
        return f"{name}: no finding" + ("" if c.baseline_severity is None else
                                        f" (the baseline had one at {c.baseline_severity})")
    had = "none" if c.baseline_severity is None else f"one at {c.baseline_severity}"
    new = f"{name} at {c.current_severity} ({c.current_points or 0:.2f} points; the baseline had {had})"
    if c.verdict == "fail":
        return f"{new}, failing at {c.fail_at}: {c.summary}; do: {c.advice}"
    if c.verdict == "noise":
        return (f"{new} crossed {c.fail_at}, but its growth {c.growth_points or 0:.2f} points is inside "
                f"{k:g} × the baseline's step-to-step standard deviation of its bucket ({c.noise_points or 0:.2f}): "
                "within noise, passes")
    gate = "never fails the gate" if c.fail_at is None else f"fails only when new at {c.fail_at}"
    return f"{new}; {gate}"


def headline(r: GateResult) -> str:
    if r.failed:
        n = len(r.failures)
        return f"diag gate: FAIL — {n} regression{'s' * (n != 1)}: {', '.join(label(c) for c in worst_first(r))}"
    extra = f" ({len(r.noise)} change(s) within the baseline's noise)" if r.noise else ""
    return f"diag gate: PASS — nothing worse than the budget{extra}"


def worst_first(r: GateResult) -> list[MetricCheck | RuleCheck]:
    """The failures, largest first: the headline names the biggest cause before its effects."""
    return sorted(r.failures, key=lambda c: (c.growth_points if isinstance(c, RuleCheck) else c.worse_points) or 0.0,
                  reverse=True)


# ----------------------------------------------------------------------------------------- text

def render(r: GateResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(to_dict(r), indent=2) + "\n"
    if fmt == "markdown":
        return render_markdown(r)
    if fmt == "html":
        return render_html(r)
    return render_text(r)


def _run_line(role: str, run: Run) -> str:
    rep = run.report
    mfu = "unknown" if rep.mfu is None else f"{rep.mfu * 100:.2f}%"
    step = "" if rep.step_time_s is None else f", step {rep.step_time_s * 1e3:.2f} ms"
    ranks = ranks_traced(rep.world_size if rep.ranks is None else len(rep.ranks), rep.world_size)
    return f"{role} {run.path}: {ranks} × {rep.steps} steps, MFU {mfu}{step}"


def _num(x: float | None, fmt: str) -> str:
    if x is None:
        return "—"
    text = format(x, fmt)
    # A change that rounds to zero is no change, whichever side of zero it came from: never "-0.00".
    return format(0.0, fmt) if not text.lstrip("+-").strip("0.") else text


def _metric_cells(c: MetricCheck) -> list[str]:
    return [label(c), _num(c.baseline_points, ".2f") + "%", _num(c.current_points, ".2f") + "%",
            _num(c.delta_points, "+.2f"), f"{c.budget_points:.2f}", _num(c.noise_points, ".2f")]


def _rule_cells(c: RuleCheck) -> list[str]:
    cur = "—" if c.current_severity is None else f"{c.current_severity} ({c.current_points or 0:.2f} pts)"
    return [label(c), c.baseline_severity or "—", cur, c.fail_at or "off"]


def render_text(r: GateResult) -> str:
    k = r.budget.noise_k
    out = [headline(r), _run_line("baseline", r.baseline), _run_line("current ", r.current), ""]
    out.append(f"{'MFU points':<22}{'baseline':>9}{'current':>9}{'Δ':>8}{'budget':>8}{'noise':>8}  verdict")
    for c in r.metrics:
        name, base, cur, delta, budget, noise = _metric_cells(c)
        out.append(f"{name:<22}{base:>9}{cur:>9}{delta:>8}{budget:>8}{noise:>8}  {_WORD[c.verdict]}")
    out += ["", f"{'rule (a new finding fails)':<32}{'baseline':<10}{'current':<20}{'fails at':<10}verdict"]
    for rc in r.rules:
        name, base, cur, at = _rule_cells(rc)
        out.append(f"{name:<32}{base:<10}{cur:<20}{at:<10}{_WORD[rc.verdict]}")
    out.append(f"(noise = {k:g} × the baseline's step-to-step standard deviation; a change beyond the budget "
               "but inside it passes)")
    if r.failures:
        out += ["", "what got worse:"] + [f"  - {describe(c, k)}" for c in worst_first(r)]
    if r.noise:
        out += ["", "within noise:"] + [f"  - {describe(c, k)}" for c in r.noise]
    out += [""] * bool(r.mismatches or r.notes)
    out += [f"mismatch allowed: {m}" for m in r.mismatches] + [f"note: {n}" for n in r.notes]
    return "\n".join(map(terminal, out)) + "\n"   # line by line: our own text has nothing to escape


# ----------------------------------------------------------------------------------------- JSON

def to_dict(r: GateResult) -> dict[str, Any]:
    k = r.budget.noise_k
    b = r.budget
    return {
        "schema": GATE_SCHEMA,
        "verdict": "fail" if r.failed else "pass",
        "exit_code": int(ExitCode.GATE_FAILED if r.failed else ExitCode.OK),
        "headline": headline(r),
        "baseline": _run_dict(r.baseline),
        "current": _run_dict(r.current),
        "budget": {"mfu_max_drop_points": b.mfu_max_drop_points,
                   "bucket_max_worse_points": dict(b.bucket_max_worse_points),
                   "noise_k": b.noise_k, "noise_min_steps": b.noise_min_steps,
                   "rule_fail_at": dict(b.rule_fail_at)},
        "checks": [{"name": c.name, "kind": "mfu" if c.name == "mfu" else "bucket",
                    "baseline_points": c.baseline_points, "current_points": c.current_points,
                    "delta_points": c.delta_points, "worse_points": c.worse_points,
                    "budget_points": c.budget_points, "noise_points": c.noise_points,
                    "allowed_points": c.allowed_points, "verdict": c.verdict, "message": describe(c, k)}
                   for c in r.metrics],
        "rules": [{"code": c.code, "slug": c.slug, "baseline_severity": c.baseline_severity,
                   "current_severity": c.current_severity, "current_points": c.current_points,
                   "growth_points": c.growth_points, "fail_at": c.fail_at, "noise_points": c.noise_points,
                   "verdict": c.verdict, "message": describe(c, k)} for c in r.rules],
        "failures": [describe(c, k) for c in worst_first(r)],
        "mismatches": list(r.mismatches),
        "notes": list(r.notes),
    }


def _run_dict(run: Run) -> dict[str, Any]:
    rep = run.report
    return {"path": run.path, "world_size": rep.world_size, "steps": rep.steps, "mfu": rep.mfu,
            "step_time_s": rep.step_time_s}


# ------------------------------------------------------------------------------------- Markdown

def render_markdown(r: GateResult) -> str:
    k = r.budget.noise_k
    title = "❌ failed" if r.failed else "✅ passed"
    out = [f"## diag gate {title}", "", markdown(headline(r)), "",
           f"- {markdown(_run_line('baseline', r.baseline))}", f"- {markdown(_run_line('current', r.current))}", "",
           "| MFU points | baseline | current | Δ | budget | noise | verdict |",
           "|---|---:|---:|---:|---:|---:|---|"]
    out += ["| " + " | ".join(["`" + cells[0] + "`", *cells[1:], _MARK[c.verdict]]) + " |"
            for c in r.metrics for cells in [_metric_cells(c)]]
    out += ["", "| rule | baseline | current | fails at | verdict |", "|---|---|---|---|---|"]
    out += ["| " + " | ".join([*map(markdown, _rule_cells(c)), _MARK[c.verdict]]) + " |" for c in r.rules]
    out += ["", f"Noise is {k:g} × the baseline's step-to-step standard deviation: a change beyond the budget "
                "but inside it passes.", ""]
    if r.failures:
        out += ["### What got worse", ""] + [f"- {markdown(describe(c, k))}" for c in worst_first(r)] + [""]
    if r.noise:
        out += ["### Within noise", ""] + [f"- {markdown(describe(c, k))}" for c in r.noise] + [""]
    out += [f"- mismatch allowed: {markdown(m)}" for m in r.mismatches] + [f"- note: {markdown(n)}" for n in r.notes]
    return "\n".join(out).rstrip("\n") + "\n\n"


# ----------------------------------------------------------------------------------------- HTML

def render_html(r: GateResult) -> str:
    """The baseline-vs-current tables as one self-contained page (diag/outputs/html_report.py)."""
    from diag.outputs.html_report import page, table

    k = r.budget.noise_k
    verdict = '<p class="fail">FAILED</p>' if r.failed else '<p class="pass">PASSED</p>'
    body = [verdict, f"<p>{html_text(headline(r))}</p>",
            f"<ul><li>{html_text(_run_line('baseline', r.baseline))}</li><li>{html_text(_run_line('current', r.current))}</li></ul>",
            "<h2>MFU points</h2>",
            table(["bucket", "baseline", "current", "Δ", "budget", "noise", "verdict"],
                  [[*_metric_cells(c), _WORD[c.verdict]] for c in r.metrics], frozenset({1, 2, 3, 4, 5})),
            "<h2>Rules (a new finding fails)</h2>",
            table(["rule", "baseline", "current", "fails at", "verdict"],
                  [[*_rule_cells(c), _WORD[c.verdict]] for c in r.rules]),
            f"<p class=\"muted\">Noise is {k:g} × the baseline's step-to-step standard deviation: a change beyond "
            "the budget but inside it passes.</p>"]
    if r.failures:
        body += ["<h2>What got worse</h2><ul>", *(f"<li>{html_text(describe(c, k))}</li>" for c in worst_first(r)), "</ul>"]
    if r.noise:
        body += ["<h2>Within noise</h2><ul>", *(f"<li>{html_text(describe(c, k))}</li>" for c in r.noise), "</ul>"]
    notes = [f"mismatch allowed: {m}" for m in r.mismatches] + [f"note: {n}" for n in r.notes]
    if notes:
        body += ["<ul>", *(f"<li>{html_text(n)}</li>" for n in notes), "</ul>"]
    return page("diag gate", body)


# ---------------------------------------------------------------------------------------- JUnit

def render_junit(r: GateResult) -> str:
    """One test case per check (MFU, each bucket, each rule); a failure carries the numbers."""
    k = r.budget.noise_k
    suite = _suite(xml(f"diag gate: {r.current.path} against {r.baseline.path}"))
    for c in r.checks:
        kind = "rules" if isinstance(c, RuleCheck) else "mfu" if c.name == "mfu" else "ledger"
        case = ET.SubElement(suite, "testcase", name=xml(label(c)), classname=f"diag.gate.{kind}", time="0")
        text = xml(describe(c, k))
        if c.verdict == "fail":
            ET.SubElement(case, "failure", message=text, type="regression").text = \
                "".join(xml(line) + "\n" for line in _numbers(c, k).splitlines())
        elif c.verdict == "skip":
            ET.SubElement(case, "skipped", message=text)
        else:
            ET.SubElement(case, "system-out").text = text
    return _document(suite)


def render_junit_error(e: BadInput) -> str:
    """The input could not be read: one errored test case, so CI shows why instead of 'no tests'."""
    suite = _suite("diag gate")
    case = ET.SubElement(suite, "testcase", name="inputs", classname="diag.gate.inputs", time="0")
    ET.SubElement(case, "error", message=xml(e.one_line()), type="bad-input").text = xml(e.one_line())
    return _document(suite)


def _numbers(c: MetricCheck | RuleCheck, k: float) -> str:
    if isinstance(c, RuleCheck):
        return (f"baseline finding: {c.baseline_severity or 'none'}\ncurrent finding: {c.current_severity} "
                f"({c.current_points or 0:.4f} points)\nfails at: {c.fail_at}\n"
                f"growth: {c.growth_points or 0:.4f} points\nnoise ({k:g} sd): {_num(c.noise_points, '.4f')}\n")
    return (f"baseline: {_num(c.baseline_points, '.4f')} %\ncurrent: {_num(c.current_points, '.4f')} %\n"
            f"delta: {_num(c.delta_points, '+.4f')} points\nbudget: {c.budget_points:.4f} points\n"
            f"noise ({k:g} sd): {_num(c.noise_points, '.4f')} points\nallowed: {c.allowed_points:.4f} points\n")


def _suite(name: str) -> ET.Element:
    return ET.Element("testsuite", name=name)


def _document(suite: ET.Element) -> str:
    cases = suite.findall("testcase")
    counts = {"tests": len(cases),
              "failures": sum(c.find("failure") is not None for c in cases),
              "errors": sum(c.find("error") is not None for c in cases),
              "skipped": sum(c.find("skipped") is not None for c in cases)}
    suite.attrib.update({key: str(v) for key, v in counts.items()} | {"time": "0"})
    root = ET.Element("testsuites", {"name": "diag gate", "time": "0"}
                      | {key: str(counts[key]) for key in ("tests", "failures", "errors")})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# ------------------------------------------------------------------------------- GitHub Actions

def github_annotations(r: GateResult) -> list[str]:
    """`::error::` per regression, `::warning::` per change passed only as noise and per allowed mismatch.

    The runner reads workflow commands from stderr as well as stdout, so they stay off stdout (data).
    """
    k = r.budget.noise_k
    out = [annotation("error", f"diag gate: {label(c)} regressed", describe(c, k)) for c in worst_first(r)]
    out += [annotation("warning", f"diag gate: {label(c)} within noise", describe(c, k)) for c in r.noise]
    out += [annotation("warning", "diag gate: runs differ", m) for m in r.mismatches]
    return out


def annotation(kind: str, title: str, message: str) -> str:
    return f"::{kind} title={workflow_property(title)}::{workflow_data(message)}"
