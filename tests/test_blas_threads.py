"""The `diag` command runs NumPy's OpenBLAS on one thread (diag/runtime/blas_threads.py), unless the user
set it, or the command runs the user's programs; diag used as a library leaves it alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

# A command through cli.main as the command runs it (argv None), then what OpenBLAS was told.
_RUN = """
import os, sys
sys.argv = ["diag"] + {args!r}
from diag import cli
code = cli.main({argv})
print("threads:", os.environ.get("OPENBLAS_NUM_THREADS"), file=sys.stderr)
"""


def _threads(args: list[str], argv: str = "None", chosen: str | None = None) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if chosen:
        env["OPENBLAS_NUM_THREADS"] = chosen
    done = subprocess.run([sys.executable, "-c", _RUN.format(args=args, argv=argv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    return done.stdout, done.stderr.strip().splitlines()[-1]


MFU = ["mfu", "--params", "1e9", "--gpus", "1", "--gpu", "h100-sxm", "--tokens-per-s", "1000"]


@pytest.mark.parametrize(("argv", "chosen", "threads"), [
    ("None", None, "1"),                 # the command
    ("None", "4", "4"),                  # the user's choice stands
    ("sys.argv[1:]", None, "None"),      # a program calling main
])
def test_the_command_runs_openblas_on_one_thread(argv: str, chosen: str | None, threads: str) -> None:
    assert _threads(MFU, argv, chosen)[1] == f"threads: {threads}"


def test_the_users_program_keeps_its_blas(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="diag capture needs torch")
    program = [sys.executable, "-c", "import os; print('theirs:', os.environ.get('OPENBLAS_NUM_THREADS'))"]
    out, _ = _threads(["capture", "--out", str(tmp_path), "--", *program])
    assert "theirs: None" in out
