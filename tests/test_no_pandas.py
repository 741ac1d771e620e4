"""The `diag` command never imports pandas (diag/runtime/no_pandas.py): pyarrow would, on its first array,
when pandas is installed, and that import was 0.16–0.3 s of every `diag analyze` (issue 16).
Checked as a user runs it: real subprocesses, parse workers included, each reporting on stderr
every import of pyarrow or pandas that reaches Python's import system past diag's guard."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, run_diag

# A sitecustomize (run at every interpreter's start, spawned workers' too) puts a finder first in
# line that only reports and finds nothing; diag's guard, installed later, goes ahead of it, so
# the report of "pandas" means an import of pandas got past the guard.
REPORTER = """
import sys
class Report:
    def find_spec(self, name, path=None, target=None):
        if name in ("pandas", "pyarrow"):
            sys.stderr.write(f"finding {name}\\n")
        return None
sys.meta_path.insert(0, Report())
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fixtures.generate import generate

    out = tmp_path_factory.mktemp("nopandas") / "run"
    generate("healthy", out, world_size=2, steps=3)
    return out


# `diag` as the command runs it (main() reads sys.argv: the guard applies), with both pools
# (ingest's parse, analyze's map) from 2 files, not 512, a file per call: each pool starts its
# two workers, which parse too.
_POOLED = "import sys; from diag.engine import rank_map, run as engine; from diag.ingest import pipeline; " \
          "engine.POOL_FILES = pipeline.POOL_FILES = 2; pipeline._POOL_BATCH = rank_map.BATCH_FILES = 1; " \
          "engine.POOL_MEAN_EVENTS = pipeline.POOL_MEAN_BYTES = 1 << 30; " \
          "from diag.cli import main; sys.exit(main())"


def _diag(tmp: Path, *args: str, pools: bool = False) -> list[str]:
    """`diag ARGS`; the modules its processes looked for, in order."""
    pytest.importorskip("pandas", reason="pandas is not installed: nothing could import it")
    site = tmp / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(REPORTER)
    env = {"PYTHONPATH": f"{site}:{ROOT}"}
    done = subprocess.run([sys.executable, "-c", _POOLED, *args], cwd=ROOT, env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=300) if pools else run_diag(*args, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line.split()[1] for line in done.stderr.splitlines() if line.startswith("finding ")]


@pytest.mark.parametrize("jobs", [1, 2])
def test_analyze_never_imports_pandas(run: Path, tmp_path: Path, jobs: int) -> None:
    found = _diag(tmp_path, "analyze", str(run), "--jobs", str(jobs), "--format", "json", pools=True)
    # Every process that parsed imported pyarrow: with --jobs 2 the parent and two spawned workers
    # for each pool.
    assert found == ["pyarrow"] * (1 if jobs == 1 else 5)


def test_ingest_and_export_never_import_pandas(run: Path, tmp_path: Path) -> None:
    db = tmp_path / "run.duckdb"
    assert _diag(tmp_path, "ingest", str(run), "--db", str(db)) == ["pyarrow"]
    assert _diag(tmp_path, "export", str(db), "--perfetto", str(tmp_path / "x.json")) == ["pyarrow"]
