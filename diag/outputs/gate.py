"""`diag gate`: fail CI when a change makes the training step worse, and say what got worse.

Two runs, each a `diag.report/1` JSON, a trace directory or a diag DuckDB file (analyzed first), are
compared against a budget: how far MFU may drop, how far each ledger bucket may grow, and at which
severity a rule's new finding fails. A change inside the baseline's own step-to-step spread passes
and is reported as noise. docs/gate.md is the user's guide, including why the statistic is what it is.
Computing is here; gate_output.py renders; diag/commands.py wires both to the command line.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from diag.attribution.ledger import BUCKETS
from diag.runtime.durations import number
from diag.runtime.errors import BadInput, in_words
from diag.runtime.paths import read_capped
from rules import RULES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pyproject's `tomli; python_version < '3.11'`
    import tomli as tomllib

REPORT_SCHEMA = "diag.report/1"      # diag.outputs.report.SCHEMA, the contract this module reads
SEVERITIES = ("info", "low", "medium", "high")   # diag.attribution.analysis.severity: <1, ≥1, ≥3, ≥10 MFU points
OFF = "off"

# Defaults, in MFU points (percent of the step at the dense peak). One point of a 40% MFU job is
# 2.5% of its throughput, hence of its GPU bill: worth a failing check.
DEFAULT_MFU_DROP_POINTS = 1.0
DEFAULT_BUCKET_GROWTH_POINTS = 1.0
# A new finding at "medium" (≥3 points, diag.attribution.analysis.severity) names a new cause worth a look.
DEFAULT_FAIL_AT = "medium"
# Tolerance = max(budget, k × the baseline's step-to-step standard deviation); docs/gate.md says why 3.
DEFAULT_NOISE_K = 3.0
# Two steps give a standard deviation of one degree of freedom: too unsteady to widen a budget on.
DEFAULT_NOISE_MIN_STEPS = 3

# Reports are small (1,000 ranks × 12 buckets is ~0.4 MB); a JSON file larger than this is a trace.
_MAX_REPORT_BYTES = 64 << 20
# A budget is a few dozen lines of TOML.
_MAX_BUDGET_BYTES = 1 << 20

Verdict = Literal["pass", "better", "noise", "fail", "skip"]


# ---------------------------------------------------------------------------------------- budget

class Budget(msgspec.Struct, frozen=True):
    mfu_max_drop_points: float = DEFAULT_MFU_DROP_POINTS
    # Per bucket, the largest change for the worse: growth, or for model_compute a drop.
    bucket_max_worse_points: Mapping[str, float] = msgspec.field(
        default_factory=lambda: dict.fromkeys(BUCKETS, DEFAULT_BUCKET_GROWTH_POINTS))
    noise_k: float = DEFAULT_NOISE_K
    noise_min_steps: int = DEFAULT_NOISE_MIN_STEPS
    # Per rule code, the severity at which a new finding fails the gate (None: never).
    rule_fail_at: Mapping[str, str | None] = msgspec.field(
        default_factory=lambda: {r.code: DEFAULT_FAIL_AT for r in RULES})


def load_budget(path: str | None) -> Budget:
    if path is None:
        return Budget()
    data = read_capped(path, _MAX_BUDGET_BYTES, "a budget")   # /dev/zero read until the OOM killer came
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except ValueError as e:   # TOMLDecodeError, UnicodeDecodeError, an integer past Python's digits limit
        raise BadInput(path, f"not a TOML budget: {in_words(e)}") from e
    return _BudgetReader(path).read(doc)


class _BudgetReader:
    """Checks every key, so that a typo fails loudly instead of silently keeping a default."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self, doc: dict[str, Any]) -> Budget:
        self._known(doc, {"mfu", "buckets", "noise", "rules"}, "the top level")
        mfu, buckets, noise, rules = (self._table(doc, t) for t in ("mfu", "buckets", "noise", "rules"))
        self._known(mfu, {"max_drop_points"}, "[mfu]")
        self._known(buckets, {"max_growth_points", *BUCKETS}, "[buckets]")
        self._known(noise, {"k", "min_steps"}, "[noise]")
        by_name = {r.code: r.code for r in RULES} | {r.slug: r.code for r in RULES}
        self._known(rules, {"fail_at", *by_name}, "[rules]")

        every = self._points(buckets, "max_growth_points", DEFAULT_BUCKET_GROWTH_POINTS, "[buckets]")
        fail_at = self._severity(rules, "fail_at", DEFAULT_FAIL_AT)
        per_rule: dict[str, str | None] = {r.code: fail_at for r in RULES}
        for key in rules.keys() - {"fail_at"}:
            per_rule[by_name[key]] = self._severity(rules, key, DEFAULT_FAIL_AT)
        min_steps = noise.get("min_steps", DEFAULT_NOISE_MIN_STEPS)
        if not isinstance(min_steps, int) or isinstance(min_steps, bool) or min_steps < 2:
            raise BadInput(self.path, f"[noise] min_steps = {min_steps!r}: expected an integer ≥ 2")
        return Budget(
            mfu_max_drop_points=self._points(mfu, "max_drop_points", DEFAULT_MFU_DROP_POINTS, "[mfu]"),
            bucket_max_worse_points={b: self._points(buckets, b, every, "[buckets]") for b in BUCKETS},
            noise_k=self._points(noise, "k", DEFAULT_NOISE_K, "[noise]"),
            noise_min_steps=min_steps,
            rule_fail_at=per_rule,
        )

    def _table(self, doc: dict[str, Any], name: str) -> dict[str, Any]:
        t = doc.get(name, {})
        if not isinstance(t, dict):
            raise BadInput(self.path, f"{name} must be a table ([{name}]), not {type(t).__name__}")
        return t

    def _known(self, table: dict[str, Any], allowed: set[str], where: str) -> None:
        unknown = sorted(table.keys() - allowed)
        if unknown:
            raise BadInput(self.path, f"unknown key {unknown[0]!r} in {where}; allowed: {', '.join(sorted(allowed))}")

    def _points(self, table: dict[str, Any], key: str, default: float, where: str) -> float:
        v = table.get(key, default)
        # TOML reads `nan` and `inf` as floats; a NaN budget compares false with every change (passes all).
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise BadInput(self.path, f"{where} {key} = {v!r}: expected a number ≥ 0 (MFU points), finite")
        return float(v)

    def _severity(self, table: dict[str, Any], key: str, default: str) -> str | None:
        v = table.get(key, default)
        if v not in (*SEVERITIES, OFF):
            raise BadInput(self.path, f"[rules] {key} = {v!r}: expected one of {', '.join((*SEVERITIES, OFF))}")
        return None if v == OFF else str(v)


# --------------------------------------------------------------------------------------- reports

class ReportFinding(msgspec.Struct, frozen=True):
    code: str
    severity: str
    lost_fraction: float = 0.0
    recoverable_fraction: float | None = None
    slug: str = ""
    summary: str = ""
    advice: str = ""


class ReportDevice(msgspec.Struct, frozen=True):
    name: str | None = None
    part: str | None = None
    peak_tflops: float | None = None
    dtype: str | None = None
    dtype_mix: dict[str, float] | None = None


class ReportView(msgspec.Struct, frozen=True):
    """The part of a `diag.report/1` document the gate reads; other fields are ignored."""

    world_size: int
    steps: int
    mfu: float | None
    ledger: dict[str, float]
    findings: list[ReportFinding]
    ledger_by_step: dict[str, dict[str, float]] = {}
    ledger_by_rank: dict[str, dict[str, float]] = {}
    hfu: float | None = None
    mfu_bf16: float | None = None
    device: ReportDevice = ReportDevice()
    model: dict[str, Any] | None = None
    step_time_s: float | None = None
    ranks: list[int] | None = None     # the ranks traced (reports before it: all of world_size)


class Run(msgspec.Struct, frozen=True):
    path: str          # as the user gave it: every message names it
    report: ReportView


def read_report_json(p: Path) -> Any:
    """The file's JSON, or None when it is a trace to analyze: compressed, too large for a report, or
    damaged but a trace (ingest then says where, or salvages it with --salvage)."""
    if p.name.endswith(".gz") or p.stat().st_size > _MAX_REPORT_BYTES:
        return None
    try:
        data = read_capped(str(p), _MAX_REPORT_BYTES, f"a {REPORT_SCHEMA} JSON")
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(str(p), f"not UTF-8 text, so not a {REPORT_SCHEMA} JSON", e.start) from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if b'"traceEvents"' in data:
            return None
        raise BadInput(str(p), f"not JSON ({e.msg}); {_HOW}", len(text[: e.pos].encode("utf-8"))) from e
    except (ValueError, RecursionError) as e:   # an integer past Python's digits limit, nesting
        raise BadInput(str(p), f"not a {REPORT_SCHEMA} JSON: {in_words(e)}; {_HOW}") from e


_HOW = f"write a baseline with `diag analyze DIR --format json --out base.json` ({REPORT_SCHEMA})"


def check_report(doc: Any, path: str) -> ReportView:
    if not isinstance(doc, dict):
        raise BadInput(path, f"a JSON {type(doc).__name__}, not a {REPORT_SCHEMA} document; {_HOW}")
    schema = doc.get("schema")
    if schema != REPORT_SCHEMA:
        found = "no 'schema' field" if schema is None else f"schema {schema!r}"
        raise BadInput(path, f"{found}, but diag gate reads {REPORT_SCHEMA!r}; {_HOW}")
    try:
        view = msgspec.convert(doc, ReportView)
    except msgspec.ValidationError as e:
        raise BadInput(path, f"not a valid {REPORT_SCHEMA} document: {e}") from e
    missing = [b for b in BUCKETS if b not in view.ledger]
    if missing:
        raise BadInput(path, f"ledger lacks bucket(s) {', '.join(missing)}: not a complete {REPORT_SCHEMA} ledger")
    bad = next(_non_finite(doc), None) or next(_out_of_range(view), None)
    if bad is not None:
        raise BadInput(path, f"{bad}: not a valid {REPORT_SCHEMA} document; {_HOW}")
    return view


# A ledger's fractions sum to 1 ± 0.01 (DESIGN.md "Contracts"), so each lies in [0, 1] within that rounding.
_FRACTION_SLACK = 0.01
# MFU past 100% means a wrong peak or overstated model FLOPs (the report says so in a note); past
# 150% no run did it: a report that says so is damaged, and would move the MFU check at will.
MAX_MFU = 1.5


def _non_finite(doc: Any) -> Iterator[str]:
    """Where the document holds NaN or ±Infinity, anywhere (JSON parsers take them; NaN compares
    false with every budget, so one in hfu or ledger_by_rank passed as well as one in mfu)."""
    todo: list[tuple[str, Any]] = [("", doc)]
    while todo:
        where, x = todo.pop()
        if isinstance(x, float) and not math.isfinite(x):
            yield f"{where.lstrip('.') or 'the document'} = {x!r} (expected a finite number)"
        elif isinstance(x, dict):
            todo.extend((f"{where}.{k}", v) for k, v in x.items())
        elif isinstance(x, list):
            todo.extend((f"{where}[{i}]", v) for i, v in enumerate(x))


def _out_of_range(v: ReportView) -> Iterator[str]:
    """Each number the gate computes with that is NaN, infinite or outside its range. JSON parsers
    take NaN and Infinity, and NaN compares false with every budget: a NaN MFU would pass any gate."""
    def fraction(where: str, x: float) -> Iterator[str]:
        if not (math.isfinite(x) and -_FRACTION_SLACK <= x <= 1 + _FRACTION_SLACK):
            yield f"{where} = {x!r} (expected a fraction in [0, 1])"

    def positive(where: str, x: object, optional: bool = True) -> Iterator[str]:
        if x is None and optional:
            return
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x <= 0:
            yield f"{where} = {x!r} (expected a finite number > 0)"

    if v.world_size < 1 or v.steps < 0:
        yield f"world_size = {v.world_size}, steps = {v.steps} (expected ≥ 1 and ≥ 0)"
    for name, x in (("mfu", v.mfu), ("hfu", v.hfu), ("mfu_bf16", v.mfu_bf16)):
        if x is not None and not (math.isfinite(x) and 0 <= x <= MAX_MFU):
            yield f"{name} = {x!r} (expected a finite number from 0 to {MAX_MFU:g})"
    for bucket, x in v.ledger.items():
        yield from fraction(f"ledger.{bucket}", x)
    for step, row in v.ledger_by_step.items():
        for bucket, x in row.items():
            yield from fraction(f"ledger_by_step.{step}.{bucket}", x)
    for rank, row in v.ledger_by_rank.items():
        for bucket, x in row.items():
            yield from fraction(f"ledger_by_rank.{rank}.{bucket}", x)
    for f in v.findings:
        if f.severity not in SEVERITIES:
            yield f"findings[{f.code}].severity = {f.severity!r} (expected one of {', '.join(SEVERITIES)})"
        yield from fraction(f"findings[{f.code}].lost_fraction", f.lost_fraction)
        if f.recoverable_fraction is not None:
            yield from fraction(f"findings[{f.code}].recoverable_fraction", f.recoverable_fraction)
    yield from positive("device.peak_tflops", v.device.peak_tflops)
    if v.model is not None:
        yield from positive("model.params", v.model.get("params"))
    # 0 is what a trace whose steps take no time says (every event at one instant): not damage.
    if v.step_time_s is not None and not (math.isfinite(v.step_time_s) and v.step_time_s >= 0):
        yield f"step_time_s = {v.step_time_s!r} (expected a finite number ≥ 0)"


def mismatches(base: ReportView, cur: ReportView) -> list[str]:
    """What makes two runs not comparable: a different world size, model or denominator.

    The model is its parameter count, or its absence (FLOPs inferred from the trace): its name is
    only a label, and tokens per step is the batch a change may legitimately tune.
    """
    out = []
    if base.world_size != cur.world_size:
        out.append(f"world size {cur.world_size} vs the baseline's {base.world_size}")
    if _params(base.model) != _params(cur.model):
        out.append(f"model {_model_name(cur.model)} vs the baseline's {_model_name(base.model)}")
    bd, cd = base.device, cur.device
    # With a dtype mix the peak is the mix's effective one (DESIGN.md): moving GEMMs from bf16 to
    # fp8 moves it, and that change is what the MFU check is for. The part is what must match then.
    mix_moved = bd.dtype_mix is not None and cd.dtype_mix is not None and bd.dtype_mix != cd.dtype_mix
    if bd.part != cd.part or (bd.peak_tflops != cd.peak_tflops and not (mix_moved and bd.part is not None)):
        out.append(f"device {_device_name(cd)} vs the baseline's {_device_name(bd)}")
    return out


def _params(m: dict[str, Any] | None) -> Any:
    return None if m is None else m.get("params")


def _model_name(m: dict[str, Any] | None) -> str:
    if m is None:
        return "inferred from the trace"
    return f"{m.get('name')} ({m.get('params') or 0:.3g} params)"


def _device_name(d: ReportDevice) -> str:
    peak = "unknown peak" if d.peak_tflops is None else f"{d.dtype} {number(d.peak_tflops)} TFLOP/s"
    return f"{d.name or d.part or 'unknown GPU'} ({peak})"


# --------------------------------------------------------------------------------------- compare

class MetricCheck(msgspec.Struct, frozen=True):
    """MFU or one ledger bucket, in points (percent of step time at the dense peak)."""

    name: str                       # "mfu" or a bucket
    baseline_points: float | None
    current_points: float | None
    worse_points: float | None      # positive = worse: a drop for mfu/model_compute, growth otherwise
    budget_points: float
    noise_points: float | None      # k × the baseline's step-to-step standard deviation; None: too few steps
    verdict: Verdict

    @property
    def delta_points(self) -> float | None:
        if self.baseline_points is None or self.current_points is None:
            return None
        return self.current_points - self.baseline_points

    @property
    def allowed_points(self) -> float:
        return max(self.budget_points, self.noise_points or 0.0)


class RuleCheck(msgspec.Struct, frozen=True):
    code: str
    slug: str
    baseline_severity: str | None   # None: no finding
    current_severity: str | None
    current_points: float | None
    growth_points: float | None     # current − baseline finding cost, when the rule newly crossed fail_at
    fail_at: str | None             # None: this rule never fails the gate
    noise_points: float | None      # of the bucket the rule claims
    verdict: Verdict
    summary: str                    # the current finding's one line
    advice: str


class GateResult(msgspec.Struct, frozen=True):
    baseline: Run
    current: Run
    budget: Budget
    metrics: tuple[MetricCheck, ...]
    rules: tuple[RuleCheck, ...]
    mismatches: tuple[str, ...]     # allowed by --allow-mismatch; still shown
    notes: tuple[str, ...]

    @property
    def checks(self) -> tuple[MetricCheck | RuleCheck, ...]:
        every: tuple[MetricCheck | RuleCheck, ...] = (*self.metrics, *self.rules)
        return every

    @property
    def failures(self) -> tuple[MetricCheck | RuleCheck, ...]:
        return tuple(c for c in self.checks if c.verdict == "fail")

    @property
    def noise(self) -> tuple[MetricCheck | RuleCheck, ...]:
        return tuple(c for c in self.checks if c.verdict == "noise")

    @property
    def failed(self) -> bool:
        return bool(self.failures)


def compare(base: Run, cur: Run, budget: Budget = Budget(), allowed_mismatches: tuple[str, ...] = ()) -> GateResult:
    b, c = base.report, cur.report
    steps = len(b.ledger_by_step)
    notes = []
    if steps < budget.noise_min_steps:
        notes.append(f"the baseline has {steps} step(s) in ledger_by_step, fewer than {budget.noise_min_steps}: "
                     "no step-to-step spread to allow for; the budget alone decides")
    noise = {key: _noise_points(b, key, budget) for key in BUCKETS}
    metrics = [_metric("mfu", _points(b.mfu), _points(c.mfu), budget.mfu_max_drop_points,
                       noise["model_compute"], lower_is_worse=True)]
    if metrics[0].verdict == "skip":
        notes.append("MFU unknown in " + " and ".join(r.path for r in (base, cur) if r.report.mfu is None)
                     + " (no peak for the device): the MFU check is skipped; model_compute still gates")
    metrics += [_metric(k, b.ledger[k] * 100, c.ledger[k] * 100, budget.bucket_max_worse_points[k], noise[k],
                        lower_is_worse=k == "model_compute") for k in BUCKETS]
    rules = tuple(_rule(r.code, r.slug, b, c, budget.rule_fail_at.get(r.code, DEFAULT_FAIL_AT),
                        noise.get(r.bucket) if r.bucket else None) for r in RULES)
    return GateResult(base, cur, budget, tuple(metrics), rules, allowed_mismatches, tuple(notes))


def _points(fraction: float | None) -> float | None:
    return None if fraction is None else fraction * 100


def _noise_points(r: ReportView, bucket: str, budget: Budget) -> float | None:
    """k × the sample standard deviation over the baseline's steps (each the mean over ranks), in points.

    For MFU this uses model_compute: a step's model FLOPs at the dense peak over its window is
    that step's MFU (engine._utilization), the same number the bucket holds.
    """
    per_step = [row[bucket] * 100 for row in r.ledger_by_step.values() if bucket in row]
    if len(per_step) < budget.noise_min_steps:
        return None
    return budget.noise_k * statistics.stdev(per_step)


def _metric(name: str, base: float | None, cur: float | None, budget: float, noise: float | None,
            lower_is_worse: bool) -> MetricCheck:
    if base is None or cur is None:
        return MetricCheck(name, base, cur, None, budget, noise, "skip")
    worse = base - cur if lower_is_worse else cur - base
    return MetricCheck(name, base, cur, worse, budget, noise, _verdict(worse, budget, noise))


def _verdict(worse: float, budget: float, noise: float | None) -> Verdict:
    allowed = max(budget, noise or 0.0)
    if worse > allowed:
        return "fail"
    if worse > budget:
        return "noise"
    if worse < -allowed:
        return "better"
    return "pass"


def _rule(code: str, slug: str, b: ReportView, c: ReportView, fail_at: str | None,
          noise: float | None) -> RuleCheck:
    bf, cf = _strongest(b, code), _strongest(c, code)
    b_sev, c_sev = (None if f is None else f.severity for f in (bf, cf))
    crossed = fail_at is not None and _at_least(c_sev, fail_at) and not _at_least(b_sev, fail_at)
    growth = None
    verdict: Verdict = "pass"
    if crossed:
        assert cf is not None
        growth = (cf.lost_fraction - (bf.lost_fraction if bf else 0.0)) * 100
        verdict = "noise" if noise is not None and growth <= noise else "fail"
    return RuleCheck(code, slug, b_sev, c_sev,
                     None if cf is None else cf.lost_fraction * 100, growth, fail_at, noise, verdict,
                     cf.summary if cf else "", cf.advice if cf else "")


def _strongest(r: ReportView, code: str) -> ReportFinding | None:
    found = [f for f in r.findings if f.code == code]
    return max(found, key=lambda f: (_rank(f.severity), f.lost_fraction)) if found else None


def _rank(severity: str | None) -> int:
    # No finding (None) is below every severity; check_report refuses any other word.
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


def _at_least(severity: str | None, threshold: str) -> bool:
    return severity is not None and _rank(severity) >= _rank(threshold)
