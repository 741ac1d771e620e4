"""README.md's commands run as written (issue 12): each line of "On your own traces" is run with
its placeholder paths pointing at a generated run that fits the example (a Llama-3-8B-shaped model
on 8 H100s, 8 × 8,192 tokens per step, so the preset and --tokens-per-step describe it)."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from helpers import ROOT, run_diag

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("readme")]

PLACEHOLDERS = ("path/to/trace_dir", "path/to/running_job_trace_dir", "path/to/new_traces")


def _block(after: str) -> list[str]:
    """The commands of the ```sh block that follows the line `after`, comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(re.escape(after) + r"\s*```sh\n(.*?)```", text, re.S)
    assert block, f"README.md has no ```sh block after {after!r}"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fixtures.generate import generate
    from fixtures.scenarios import Scenario

    scenario = Scenario(name="readme", hidden=4096, layers=32, heads=32, head_dim=128, seq_len=8192, micro_batch=1)
    assert scenario.tokens_per_step == 65536    # README's --tokens-per-step
    out = tmp_path_factory.mktemp("readme") / "run"
    generate(scenario, out)
    (out / "model.toml").unlink()               # the README's --model says it instead
    return out


def test_the_readme_examples_run_as_written(llama_run: Path, tmp_path: Path) -> None:
    commands = _block("On your own traces:")
    assert len(commands) >= 6 and all(c.startswith("diag ") for c in commands)
    for command in commands:
        argv = shlex.split(command)[1:]
        argv = [str(llama_run) if a in PLACEHOLDERS else a for a in argv]
        if argv[0] == "gate":               # its baseline: the report the line before wrote
            shutil.copy(tmp_path / "report.json", tmp_path / "base.json")
        done = run_diag(*argv, cwd=tmp_path)
        if argv[0] in ("tui", "live"):      # no terminal here: the arguments parsed, the UI was refused
            assert done.returncode == 2 and "needs a terminal" in done.stderr, (command, done.stderr)
            continue
        assert done.returncode == 0, (command, done.stderr)
        if argv[0] == "mfu":
            assert "MFU            0.498%" in done.stdout   # README: 0.5% MFU
        if "--model" in argv:
            assert re.search(r"MFU \d+\.\d%", done.stdout) and "model FLOPs from llama3-8b" in done.stdout, done.stdout
    assert (tmp_path / "report.json").is_file()


def test_the_quick_start_version_line() -> None:
    done = run_diag("--version")
    assert done.returncode == 0 and re.fullmatch(r"diag \d+\.\d+\.\d+\n", done.stdout)
    assert "pip install -e . && diag demo" in _block("On a fresh machine (Python ≥ 3.10; nothing to start — DuckDB is embedded):")[0]


def test_the_readme_installs_and_tests_as_ci_does() -> None:
    """Issue 39: a stranger with only the README clones, makes a venv, and runs the two commands; the
    test command is CI's own (.ci/run), with the install line before it, and the README stays a
    README (the development log is docs/benchmarks.md)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    install = _block("## Install\n\nPython ≥ 3.10 on Linux or macOS; nothing to start (DuckDB is embedded), no GPU needed to analyze.")
    assert install[0].startswith("git clone ") and "python3 -m venv .venv && . .venv/bin/activate" in install
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    [test] = [c for c in _block("On a fresh machine (Python ≥ 3.10; nothing to start — DuckDB is embedded):") if "pytest" in c]
    assert test.endswith(" && python -m pytest -n 2 --dist loadgroup") and "python -m pytest -n 2 --dist loadgroup\n" in ci
    for step in test.split(" && ")[:-1]:             # torch pinned, then the extras: as CI installs them
        assert f"python -m {step}" in ci or f"python -m pip install -q {step.removeprefix('pip install ')}" in ci, step
    assert len(text.splitlines()) <= 220 and text.count("round") < 5
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", text):
        assert (ROOT / link).is_file(), link
