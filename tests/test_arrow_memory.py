"""The `diag` command takes Arrow's memory from the system allocator (diag/runtime/arrow_memory.py),
unless the user chose a pool; diag used as a library leaves the program's pool alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import ROOT

# `diag mfu` through cli.main as the command runs it (argv None), then the pool pyarrow gives.
_RUN = """
import sys
sys.argv = ["diag", "mfu", "--params", "1e9", "--gpus", "1", "--gpu", "h100-sxm", "--tokens-per-s", "1000"]
from diag import cli
assert cli.main({argv}) == 0
import pyarrow
print(pyarrow.default_memory_pool().backend_name, file=sys.stderr)
"""


def _backend(argv: str, chosen: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    done = subprocess.run([sys.executable, "-c", _RUN.format(argv=argv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "chosen", "backend"), [
    ("None", None, "system"),          # the command
    ("None", "jemalloc", "jemalloc"),  # the user's choice stands
])
def test_the_command_uses_the_system_allocator(argv: str, chosen: str | None, backend: str) -> None:
    assert _backend(argv, chosen) == backend


def test_a_program_calling_main_keeps_its_pool() -> None:
    bare = subprocess.run([sys.executable, "-c", "import pyarrow; print(pyarrow.default_memory_pool().backend_name)"],
                          env={k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"},
                          capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert _backend("sys.argv[1:]", None) == bare
