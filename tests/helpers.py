"""Shared test helpers: where the real traces are, and the CLI as a real subprocess."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"


# Every skip for want of the real traces says this (tests/conftest.py counts them in the summary).
NO_TRACES = f"real traces not found at {TRACES} (../shared/traces beside the repository: docs/traces.md)"


def shared_traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(NO_TRACES)
    return TRACES


def kineto_traces() -> list[Path]:
    """Every Kineto trace under ../shared/traces (the NCCL profiler dump is not one)."""
    root = shared_traces()
    return sorted(p for p in root.rglob("*") if p.name.endswith((".json", ".json.gz")) and "pha-Z-nccl" not in str(p))


def load_json(path: Path) -> Any:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        return json.load(f)


def run_diag(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`diag ARGS...` as a real subprocess, as a user (or CI) runs it."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "diag.cli", *args], cwd=cwd, env=full_env, capture_output=True, text=True,
        timeout=timeout,
    )


def one(con: Any, sql: str, params: Any = ()) -> tuple[Any, ...]:
    """The single row a query must return."""
    row = con.execute(sql, params).fetchone()
    assert row is not None, sql
    return tuple(row)


# DESIGN.md's invariant: a bucket holding this share of the step or more must be explained.
EXPLAIN_AT = 0.05


def unexplained_buckets(report: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Buckets other than model_compute with ≥ 5% of the step whose findings (naming the bucket)
    sum to less than half of it: {bucket: (share, explained)}."""
    out = {}
    for bucket, share in report["ledger"].items():
        if bucket == "model_compute" or share < EXPLAIN_AT:
            continue
        explained = sum(f["lost_fraction"] for f in report["findings"] if f["bucket"] == bucket)
        if explained < share / 2:
            out[bucket] = (share, explained)
    return out
