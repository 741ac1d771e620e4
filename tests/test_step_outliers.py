"""Warm-up and teardown steps (diag/timeline/step_outliers.py) on hand-made step windows, the durations the
report prints, and --all-steps through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from helpers import run_diag

from diag.runtime.durations import duration, percent
from diag.timeline.rank import Steps
from diag.timeline.step_outliers import excluded_steps
from fixtures.generate import generate

MS = 1_000_000


def _steps(windows_ms: list[float], tail_ms: float = 0.0, profiler: bool = True) -> Steps:
    """Back-to-back windows from t=0; the last one ends `tail_ms` after its last op."""
    ends = np.cumsum([round(w * MS) for w in windows_ms]).astype(np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    busy = ends.copy()
    busy[-1] -= round(tail_ms * MS)
    n = len(windows_ms)
    return Steps(list(range(n)), starts.tolist(), ends.tolist(), starts, ends, [1] * n, profiler, busy)


def test_warmup_and_teardown_are_excluded() -> None:
    # First: 21 > 2 × 6.3 and > 1.5 × 6.4; last: a 5 ms tail ≥ 0.5 × median(21, 6.3, 6.3, 6.4) = 3.2 ms (6.35 halved).
    got = excluded_steps(_steps([21, 6.3, 6.3, 6.4, 11.3], tail_ms=5))
    assert sorted(got) == [0, 4]
    assert got[0].startswith("warm-up") and got[4].startswith("teardown")


def test_varying_steps_are_kept() -> None:
    # 18.3 > 2 × median(6.6, 15.3, 6.6, 6.6) = 13.2, but not > 1.5 × 15.3 = 22.95: a spread, not warm-up.
    assert excluded_steps(_steps([18.3, 6.6, 15.3, 6.6, 6.6])) == {}
    # A tail under half the median step stays: 3 ms < 0.5 × 6.6 ms.
    assert excluded_steps(_steps([6.6, 6.6, 6.6, 9.6], tail_ms=3)) == {}
    # Steady steps are never dropped.
    assert excluded_steps(_steps([6.6, 6.5, 6.7, 6.6, 6.6])) == {}


def test_a_last_step_in_which_nothing_ran_is_left_out_whatever_its_length() -> None:
    # HTA's MI250 capture: a 9.29 ms step, then an 86 µs stub with no kernel and no op (the
    # profiler stopping): kept, it read as a step 100% idle, half of the run's mean.
    got = excluded_steps(_steps([9.29, 0.086], tail_ms=0.086))
    assert list(got) == [1] and got[1].startswith("teardown: nothing ran in the last step")
    # A short last step with any work in it stays: its 0.05 ms tail is under half the median.
    assert excluded_steps(_steps([9.29, 0.086], tail_ms=0.05)) == {}


def test_too_few_steps_to_judge() -> None:
    assert excluded_steps(_steps([30, 6])) == {}                      # a first step needs two others
    assert excluded_steps(_steps([30], tail_ms=20)) == {}              # one step is never left out
    assert excluded_steps(_steps([30, 6, 6], profiler=False)) == {}   # no ProfilerStep spans


def test_durations_keep_a_figure_of_one_or_more() -> None:
    assert duration(3.2e-6) == "3.20 µs"
    assert duration(0.07677) == "76.77 ms"
    assert duration(2.5) == "2.50 s"
    assert duration(4e-8) == "40 ns"


def test_a_tiny_share_keeps_two_significant_digits() -> None:
    # MI250 minitoy (HTA's amd_trace): model FLOPs 5.84e-7 of the peak-seconds: "MFU 0.0%" read as nothing ran.
    assert percent(5.840865e-07) == "0.000058%"
    assert percent(0.0004) == "0.040%"
    assert percent(0.312) == "31.2%" and percent(0.0) == "0.0%" and percent(1.0) == "100.0%"
    assert percent(None) == "unknown" and percent(None, "?") == "?"


def test_all_steps_keeps_them(tmp_path: Path) -> None:
    generate("warmup_teardown", tmp_path)
    default = json.loads(run_diag("analyze", str(tmp_path), "--format", "json").stdout)
    every = json.loads(run_diag("analyze", str(tmp_path), "--format", "json", "--all-steps").stdout)
    assert default["steps"] == 3 and len(default["steps_excluded"]) == 4
    assert every["steps"] == 5 and every["steps_excluded"] == []
    assert every["step_time_spread_s"]["max"] > 3 * default["step_time_spread_s"]["max"]
    text = run_diag("analyze", str(tmp_path)).stdout
    assert "(median; mean " in text and "4 step(s) left out of the means as warm-up or teardown" in text
