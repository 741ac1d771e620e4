"""The command line as a contract (issue 12): what a newcomer types, what a pipe or a CI log gets,
the version, and the one line a bad value earns. Every case runs `diag` as a real subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag import __version__
from helpers import ROOT, run_diag

pytestmark = pytest.mark.xdist_group("cli")


def test_version_is_the_packages_and_the_reports(tmp_path: Path) -> None:
    done = run_diag("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"diag {__version__}"
    report = run_diag("demo", "--format", "json", "--out", str(tmp_path / "demo"), env={"TMPDIR": str(tmp_path)})
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["diag_version"] == __version__


def test_demo_without_a_terminal_prints_the_report_and_leaves_nothing(tmp_path: Path) -> None:
    """`diag demo </dev/null >out.txt`: no UI where nobody can see it; the report, exit 0, and the
    generated run removed (TMPDIR is this test's own, so what is left there is the demo's)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = run_diag("demo", env={"TMPDIR": str(scratch)}, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "waterfall (MFU points" in done.stdout and "\x1b[" not in done.stdout
    assert "MFU005 stragglers" in done.stdout
    assert list(scratch.iterdir()) == []


def test_demo_out_keeps_the_run(tmp_path: Path) -> None:
    done = run_diag("demo", "--no-tui", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "run").glob("*.pt.trace.json*"))) == 8
    assert str(tmp_path / "run") in done.stderr


@pytest.mark.parametrize("command", ["tui", "live"])
def test_the_ui_without_a_terminal_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    done = run_diag(command, str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "needs a terminal" in done.stderr, done.stderr


@pytest.mark.parametrize("command", [["example", "--out", "x"], ["capture", "--out", "x", "--", "python", "-c", "pass"]])
def test_a_command_needing_torch_says_which_extra(command: list[str], tmp_path: Path) -> None:
    """Without torch (hidden from the interpreter, as on a base install), exit 2 with the
    one line that says how to get it, before anything is started or written."""
    hide = tmp_path / "hide"
    hide.mkdir()
    # `sys.modules[name] = None` makes `import name` fail and find_spec answer None.
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    done = run_diag(*command, cwd=tmp_path, env={"PYTHONPATH": f"{hide}:{ROOT}"})
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"diag {command[0]} needs torch: pip install -e '.[capture]'\n"
    assert not (tmp_path / "x").exists()
