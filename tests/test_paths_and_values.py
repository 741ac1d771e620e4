"""Paths checked before any work and careless option values refused (issue 40, items 4, 6, 7, 12):
each is one line naming the path or the option, exit 2, never exit 3, a hang or unbounded memory."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import run_diag

from diag import cli
from diag.outputs.report import path_line
from fixtures.generate import generate


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("paths") / "run"
    generate("healthy", out, world_size=2)
    return out


def diag(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, list[str]]:
    """cli.main in this process: the exit code and stderr's lines."""
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    return code, capsys.readouterr().err.splitlines()


def one_line(code: int, err: list[str], *words: str) -> None:
    assert code == 2 and len(err) == 1, err
    assert all(w in err[0] for w in words), err[0]
    assert "Error" not in err[0] and "Exception" not in err[0], err[0]   # no Python internals


@pytest.mark.parametrize("suffix", [".json", ".csv", ".parquet"])
def test_db_must_be_a_duckdb_file(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str) -> None:
    # DuckDB opened such a file as an in-memory database with a view over it: nothing stored, exit 0.
    db = tmp_path / f"store{suffix}"
    db.write_text('{"a": 1}\n')
    commands: list[list[str | Path]] = [["analyze", run], ["ingest", run], ["export", run, "--perfetto", tmp_path / "o.json"]]
    for command in commands:
        one_line(*diag(capsys, *command, "--db", db), str(db), "not a DuckDB database file")
    assert db.read_text() == '{"a": 1}\n'


def test_outputs_are_checked_before_the_analysis(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for out, words in ((tmp_path, "is a directory"), (tmp_path / "missing" / "x.json", "no such directory")):
        started = time.monotonic()
        one_line(*diag(capsys, "export", run, "--perfetto", out), str(out), words)
        one_line(*diag(capsys, "analyze", run, "--out", out), str(out), words)
        assert time.monotonic() - started < 2   # refused before the traces were read
    if os.path.exists("/dev/full"):
        one_line(*diag(capsys, "export", run, "--perfetto", "/dev/full"), "/dev/full", "cannot write")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_fifos_and_devices_are_refused_not_read(run: Path, tmp_path: Path) -> None:
    # As real processes (the read-ahead starts before the command's handler): a FIFO blocked forever,
    # /dev/zero was read until the OOM killer came.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    report = tmp_path / "report.json"
    assert run_diag("analyze", str(run), "--format", "json", "--out", str(report)).returncode == 0
    for args in (["gate", "--baseline", "/dev/zero", str(report)], ["gate", "--baseline", str(fifo), str(report)],
                 ["gate", "--baseline", str(report), str(fifo)], ["gate", "--baseline", str(report), str(report),
                                                                   "--budget", "/dev/zero"],
                 ["analyze", str(fifo)], ["analyze", "/dev/zero"], ["ingest", str(fifo), "--db", str(tmp_path / "x.db")]):
        r = run_diag(*args, timeout=20)
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 1 and ("a FIFO" in err[0] or "a device" in err[0]), (args, r.stderr)


def test_a_path_past_path_max_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    one_line(*diag(capsys, "analyze", "a" * 5000), "File name too long")


def test_export_ranges_are_bounded(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    one_line(*diag(capsys, "export", run, "--perfetto", tmp_path / "o.json", "--ranks", "0-99999999999"),
             "--ranks", "more than 1,000,000")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(("args", "option"), [
    (["--peak-tflops", "1e30"], "--peak-tflops"), (["--jobs", "99999999999"], "--jobs"), (["--rank", "1e3"], "--rank"),
])
def test_careless_values_are_refused(run: Path, capsys: pytest.CaptureFixture[str], args: list[str], option: str) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["analyze", str(run), *args])
    assert e.value.code == 2 and option in capsys.readouterr().err


def test_tokens_per_step_without_a_model_is_refused(run: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "rank-0.json").write_text((run / "rank-0.json").read_text())   # no model.toml beside it
    one_line(*diag(capsys, "analyze", bare, "--tokens-per-step", "1000"), "--tokens-per-step", "needs a model")
    assert diag(capsys, "analyze", run, "--tokens-per-step", "1000")[0] == 0   # run/model.toml takes it


def test_diag_debug_keeps_exit_3(run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # An internal error with DIAG_DEBUG=1 printed its traceback and exited 1: the gate's "failed".
    from diag import commands

    def broken(args: Any) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(commands, "run_analyze", broken)
    monkeypatch.setenv("DIAG_DEBUG", "1")
    code, err = diag(capsys, "analyze", run)
    assert code == 3 and "Traceback" in "\n".join(err) and "RuntimeError: a bug" in err[-1]


def test_the_critical_path_line_of_paths_without_segments_is_left_out() -> None:
    # The bench trace (a step's control repeated) gave paths whose summaries were empty:
    # `max() arg is an empty sequence`, exit 3, in the text report.
    report = {"steps_excluded": [], "ranks": [0], "critical_path": [{"step": 1, "summary": {"by_rank": {}, "by_kind": {}}}]}
    assert path_line(report) == ""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_in_a_directory_what_is_not_a_file_is_left_out_with_a_warning(run: Path, tmp_path: Path) -> None:
    # A FIFO or a link to /dev/zero under a trace's name was skipped without a word.
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank-0.json").write_text((run / "rank-0.json").read_text())
    os.mkfifo(d / "rank-1.json")
    (d / "rank-2.json").symlink_to("/dev/zero")
    r = run_diag("ingest", str(d), "--db", str(tmp_path / "x.duckdb"), timeout=60)
    warned = [line for line in r.stderr.splitlines() if "not a regular file" in line]
    assert r.returncode == 0 and len(warned) == 2, r.stderr
    assert any("a FIFO" in w for w in warned) and any("a device" in w for w in warned)


@pytest.mark.parametrize(("shares", "code"), [("fp8=0.6,bf16=0.6", 2), ("fp8=0.2,bf16=0.3", 2),
                                              ("fp8=0.6,bf16=0.4", 0), ("fp8=3,bf16=2", 0)])
def test_dtype_fractions_must_add_up_to_one(capsys: pytest.CaptureFixture[str], shares: str, code: int) -> None:
    # fp8=0.6,bf16=0.6 was renormalised to a 50/50 mix without a word; ratios are normalized as documented.
    got, err = diag(capsys, "mfu", "--params", "70e9", "--gpus", "8", "--gpu", "h100-sxm", "--mfu", "0.4",
                    "--dtype", shares)
    assert got == code, err
    if code:
        one_line(got, err, "--dtype", "add up to")
