"""A run of JSON whitespace inside `traceEvents` (a 1 MB gzip can hold 1 GiB of it) is skipped in
NumPy windows, not byte by byte in Python (issue 40, item 7: 300 MB of blanks took 33 s; 100 MB
took 18.2 s before and 3.4 s after, measured on the shared 2-core machine)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from diag import cli
from diag.ingest.kineto_split import _past_blanks
from diag.runtime import store
from fixtures.generate import generate


@pytest.mark.parametrize(("data", "pos", "end", "window", "found"), [
    (b"  \n\t{x", 0, 6, 4, 4), (b"  \n\t{x", 0, 6, 1, 4), (b"{", 0, 1, 4, 0), (b"    ", 0, 4, 3, 4),
    (b"ab   c", 2, 6, 2, 5), (b"ab   c", 2, 4, 2, 4),
])
def test_past_blanks(data: bytes, pos: int, end: int, window: int, found: int) -> None:
    assert _past_blanks(data, pos, end, window) == found


def test_a_trace_with_a_long_run_of_blanks_reads_as_without(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate("healthy", tmp_path / "run", world_size=1)
    plain = (tmp_path / "run" / "rank-0.json").read_bytes()
    at = plain.index(b'"traceEvents": [') + len(b'"traceEvents": [')
    blank = tmp_path / "rank-0.json.gz"
    blank.write_bytes(gzip.compress(plain[:at] + b" \n" * (4 << 20) + plain[at:], 1))
    counts = []
    for i, p in enumerate((tmp_path / "run" / "rank-0.json", blank)):
        db = tmp_path / f"{i}.duckdb"
        assert cli.main(["ingest", str(p), "--db", str(db), "--jobs", "1"]) == 0
        con = store.connect(str(db))
        try:
            counts.append(con.execute("SELECT n_events FROM trace_files").fetchall())
        finally:
            con.close()
    assert counts[0] == counts[1]
