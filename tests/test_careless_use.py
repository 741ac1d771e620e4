"""Issue 40, item 12's leftovers: what a directory holds besides traces is skipped with a warning
that names it; no message shows Python's internals; a reader that stops reading (`| head -1`) ends
the command quietly with 141, as SIGPIPE ends a POSIX tool."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from helpers import TRACES, run_diag, shared_traces

from diag.ingest.pipeline import ingest
from diag.runtime import store
from diag.runtime.errors import in_words

SMALL = "kineto/docs/traces/after_fix_trace.json"
# What a user must never read: Python's class names and its advice to programmers.
INTERNALS = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b|sys\.set_int_max_str_digits|unhashable type|Traceback")


def test_fifo_device_link_and_unreadable_directory_are_warned_by_name(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO and a link to /dev/zero under trace names, and a subdirectory that cannot be listed:
    each left out with its own line naming it (the link by its own name, not /dev/zero's; the
    directory was passed over without a word by rglob), the good trace beside them read."""
    shared_traces()
    (tmp_path / "rank-0.json").write_bytes((TRACES / SMALL).read_bytes())
    os.mkfifo(tmp_path / "rank-1.json")
    (tmp_path / "rank-2.json").symlink_to("/dev/zero")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "rank-5.json").write_bytes((TRACES / SMALL).read_bytes())
    # chmod 000 does not stop root (CI may run as root): the listing fails as it would without rights.
    real = os.scandir

    def scandir(path: object = ".") -> object:
        if str(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)   # type: ignore[call-overload]
    monkeypatch.setattr(os, "scandir", scandir)
    result = ingest([str(tmp_path)], store.connect(None))
    lines = {e.path: e.one_line() for e in result.errors}
    assert set(lines) == {str(tmp_path / "rank-1.json"), str(tmp_path / "rank-2.json"), str(locked)}, lines
    assert "FIFO" in lines[str(tmp_path / "rank-1.json")] and "device" in lines[str(tmp_path / "rank-2.json")]
    assert "permission denied" in lines[str(locked)], lines
    assert [p for p, _ in result.ingested] == [str(tmp_path / "rank-0.json")]


@pytest.mark.parametrize("what", ["model", "budget", "baseline"])
def test_an_integer_past_pythons_digit_limit_is_bad_input_in_words(what: str, tmp_path: Path) -> None:
    """A 5000-digit integer in a model TOML, a budget TOML or a baseline report: exit 3 with
    "ValueError: Exceeds the limit (4300 digits) ... use sys.set_int_max_str_digits()"."""
    shared_traces()
    huge = "9" * 5000
    trace = str(TRACES / SMALL)
    model, budget, baseline = tmp_path / "m.toml", tmp_path / "b.toml", tmp_path / "base.json"
    model.write_text(f"[model]\nparams = {huge}\nlayers = 2\nheads = 2\nhead_dim = 4\nseq_len = 8\n")
    budget.write_text(f"mfu = {huge}\n")
    baseline.write_text(f'{{"schema": "diag.report/1", "mfu": {huge}}}')
    argv = {"model": ["analyze", trace, "--model", str(model)],
            "budget": ["gate", "--baseline", trace, trace, "--budget", str(budget)],
            "baseline": ["gate", "--baseline", str(baseline), trace]}[what]
    p = run_diag(*argv)
    assert p.returncode == 2, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert "an integer of more than" in line and not INTERNALS.search(p.stderr), p.stderr


def test_in_words_drops_class_names_and_python_advice() -> None:
    try:
        int("9" * 5000)
    except ValueError as e:
        assert in_words(e) == f"an integer of more than {sys.get_int_max_str_digits()} digits"
    try:
        hash([])
    except TypeError as e:
        assert not INTERNALS.search(in_words(e)), in_words(e)
    con = duckdb.connect()
    try:
        con.execute("SELECT '{'::JSON")
    except duckdb.Error as e:
        assert not INTERNALS.search(in_words(e)) and not in_words(e).startswith("Conversion"), in_words(e)
    assert in_words(PermissionError(13, "Permission denied")) == "permission denied"


@pytest.mark.parametrize("argv", [
    ["mfu", "--params", "70e9", "--gpus", "1024", "--gpu", "h100-sxm", "--tokens-per-s", "12000"],
    ["analyze", str(TRACES / SMALL)],
    ["analyze", str(TRACES / SMALL), "--format", "json"],
], ids=["mfu", "analyze-text", "analyze-json"])
def test_a_reader_that_went_away_ends_the_command_quietly(argv: list[str]) -> None:
    """stdout's reader closed before diag writes (`| head -1` once head has its line): exit 141, as
    SIGPIPE ends `cat`, and nothing on stderr about it (it was exit 3, 'internal error:
    BrokenPipeError', or 'Exception ignored ... BrokenPipeError' and exit 1 at the last flush)."""
    if argv[0] == "analyze":
        shared_traces()
    r, w = os.pipe()
    os.close(r)   # the reader is gone before the first write
    p = subprocess.run([sys.executable, "-m", "diag.cli", *argv], stdout=w, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    os.close(w)
    assert p.returncode == 141, p.stderr
    assert not INTERNALS.search(p.stderr) and "internal error" not in p.stderr and "Broken" not in p.stderr, p.stderr
