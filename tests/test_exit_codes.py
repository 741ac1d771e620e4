"""Faults around the store and the inputs are exit 2 with one line naming the cause (issue 15, item 9):
a store another process holds, a --db that cannot be one, a full disk, a FIFO or a device, a
missing path. Each runs the real CLI in a subprocess."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import run_diag

from fixtures.generate import generate


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "run"
    generate("healthy", out, world_size=2)
    return out


def one_line(r: subprocess.CompletedProcess[str], *says: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.startswith("diag: ")]
    assert len(lines) == 1 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert all(s in lines[0] for s in says), lines[0]


@contextlib.contextmanager
def tmpfs(where: Path, *options: str) -> Iterator[Path]:
    """A small filesystem of its own (root only), to fill or to mount read-only."""
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_missing_input_creates_no_store(tmp_path: Path) -> None:
    db = tmp_path / "x.duckdb"
    one_line(run_diag("ingest", str(tmp_path / "missing"), "--db", str(db)), "missing: no such file or directory")
    assert not db.exists()
    one_line(run_diag("analyze", str(tmp_path / "missing"), "--db", str(db)), "no such file or directory")
    assert not db.exists()


def test_live_on_a_missing_directory(tmp_path: Path) -> None:
    one_line(run_diag("live", str(tmp_path / "missing"), timeout=60), "no such directory")


def test_a_second_writer_is_told_who_holds_the_store(traces: Path, tmp_path: Path) -> None:
    db = tmp_path / "x.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, sys; c = duckdb.connect({str(db)!r}); "
                                                     "print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        one_line(run_diag("ingest", str(traces), "--db", str(db)), str(db), f"in use by another process (PID {holder.pid}")
    finally:
        holder.communicate("")


def test_a_db_that_is_not_duckdb(traces: Path, tmp_path: Path) -> None:
    db = tmp_path / "notes.duckdb"
    db.write_text("my notes\n")
    one_line(run_diag("ingest", str(traces), "--db", str(db)), str(db), "not a DuckDB database file")
    assert db.read_text() == "my notes\n"


def test_a_db_in_a_missing_directory(traces: Path, tmp_path: Path) -> None:
    db = tmp_path / "nope" / "x.duckdb"
    one_line(run_diag("ingest", str(traces), "--db", str(db)), str(db), "cannot open the store: No such file")


def test_a_read_only_db(traces: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        db = tmp_path / "x.duckdb"
        assert run_diag("ingest", str(traces), "--db", str(db)).returncode == 0
        tmp_path.chmod(0o555)
        db.chmod(0o444)
        try:
            one_line(run_diag("ingest", str(traces), "--db", str(db)), str(db), "cannot open the store")
        finally:
            tmp_path.chmod(0o755)
        return
    with tmpfs(tmp_path / "ro", "size=4m", "ro") as ro:
        one_line(run_diag("ingest", str(traces), "--db", str(ro / "x.duckdb")), "Read-only file system")


def test_a_full_disk_names_the_cause(traces: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    with tmpfs(tmp_path / "small", "size=1m") as small:
        r = run_diag("ingest", str(traces), "--db", str(small / "x.duckdb"))
    one_line(r, "No space left on device", "nothing of this file was kept")
    assert "cannot rollback" not in r.stderr


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    if kind == "fifo":
        path = tmp_path / "rank-0.json"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
        if not path.exists():
            pytest.skip("no /dev/zero")
    r = run_diag("ingest", str(path), "--db", str(tmp_path / "x.duckdb"), timeout=60)
    one_line(r, "not a regular file", "a FIFO" if kind == "fifo" else "a device")
