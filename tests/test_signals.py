"""A signal during an ingest ends the run, never one file (issue 40, item 1).

DuckDB answers a signal that comes while it runs a query by interrupting the query with an error of
its own ("Query interrupted"), which the per-file handler took for a bad file: the run left the file
out, went on and exited 0. Here the signal comes while DuckDB runs a query inside the second file's
parse, as it does while a file is written to the store: the ingest stops with exit 130 (SIGINT) or
143 (SIGTERM), says which files the store holds and which it does not, and holds each whole.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

from diag import cli
from diag.ingest import pipeline
from diag.runtime import store
from fixtures.generate import generate


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = tmp_path_factory.mktemp("signals") / "run"
    generate("healthy", out, world_size=3)
    return sorted(str(p) for p in out.glob("rank-*.json"))


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated")])
def test_a_signal_in_a_query_ends_the_ingest(traces: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str], sig: int, code: int, word: str) -> None:
    real = pipeline.parse_into

    def parse_into(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == traces[1]:
            threading.Timer(0.2, os.kill, (os.getpid(), sig)).start()
            duckdb.connect().execute("SELECT count(*) FROM range(1000000000000)").fetchall()   # interrupted
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pipeline, "parse_into", parse_into)
    db = tmp_path / "run.duckdb"
    # --jobs 1: every file parsed in this process, so the per-file handlers are this process's.
    assert cli.main(["ingest", *traces, "--db", str(db), "--jobs", "1"]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"diag: {word} during ingest: ")
    assert "could not be read" not in err[0]
    con = store.connect(str(db))
    try:
        held = sorted(p for (p,) in con.execute("SELECT path FROM trace_files").fetchall())
    finally:
        con.close()
    # What the line says is what the store holds: the files before the second at most, never it.
    stored = [p for p in traces if p in held]
    assert traces[1] not in held and held == stored
    assert f"{len(stored)} file(s) stored whole" in err[0] and f"{len(traces) - len(stored)} not stored" in err[0]
    assert traces[1] in err[0]
