"""Values changed on the way in are counted, and an integer out of range is one value's warning,
never a conversion error (issue 40, items 2 and 8).

A `distributedInfo.world_size` of 2^31 made the INSERT of the file's row fail for the whole batch
(exit 3, the good file beside it lost too); kernels with `ts` null or missing, a `ph` of 'x' or 'B',
no `cat`, or `dur` null were moved aside, read as CPU ops or given a zero duration with no word.
Each case changes one event (or one field) of a generated rank's trace.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from diag import cli
from diag.api import analyze_path
from diag.ingest.pipeline import IngestOptions
from diag.runtime import store
from fixtures.generate import generate


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranges") / "run"
    generate("healthy", out, world_size=2)
    return out


def changed(run: Path, tmp: Path, change: Callable[[dict[str, Any]], None], name: str = "rank-1.json") -> Path:
    doc = json.loads((run / "rank-1.json").read_text())
    change(doc)
    out = tmp / name
    out.write_text(json.dumps(doc))
    return out


def ingest(tmp: Path, capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, list[str], Any]:
    db = tmp / "x.duckdb"
    code = cli.main(["ingest", *map(str, paths), "--db", str(db), "--jobs", "1"])
    err = capsys.readouterr().err.splitlines()
    return code, err, store.connect(str(db))


@pytest.mark.parametrize("world", [2**31, 2**64, int("9" * 400), 0, -1], ids=["2^31", "2^64", "400 digits", "0", "-1"])
def test_a_world_size_out_of_range_is_a_warning_not_the_batch(run: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str], world: int) -> None:
    bad = changed(run, tmp_path, lambda d: d["distributedInfo"].__setitem__("world_size", world))
    code, err, con = ingest(tmp_path, capsys, bad, run / "rank-0.json")
    try:
        rows = dict(con.execute("SELECT rank, world_size FROM trace_files").fetchall())
    finally:
        con.close()
    assert code == 0 and rows == {0: 2, 1: None}          # both files stored; the bad value read as unknown
    said = [line for line in err if "world_size" in line]
    assert len(said) == 1 and "is not a world size" in said[0] and len(said[0]) < 300


def _kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


CHANGES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "ts null": (lambda e: e.__setitem__("ts", None), "1 complete ('X') events had no 'ts'"),
    "ts missing": (lambda e: e.pop("ts"), "1 complete ('X') events had no 'ts'"),
    "ph x": (lambda e: e.__setitem__("ph", "x"), "1 events had a 'ph' that is not a complete span"),
    "ph B": (lambda e: e.__setitem__("ph", "B"), "1 events had a 'ph' that is not a complete span"),
    "no cat": (lambda e: e.pop("cat"), "1 complete ('X') events had no 'cat'"),
    "dur null": (lambda e: e.__setitem__("dur", None), "1 complete ('X') events had no 'dur'"),
    "dur missing": (lambda e: e.pop("dur"), "1 complete ('X') events had no 'dur'"),
}


@pytest.mark.parametrize("what", CHANGES)
def test_an_event_moved_or_zeroed_is_counted_in_warnings_and_notes(run: Path, tmp_path: Path, what: str) -> None:
    change, words = CHANGES[what]
    trace = tmp_path / "run"
    trace.mkdir()
    (trace / "rank-0.json").write_text((run / "rank-0.json").read_text())
    changed(run, trace, lambda d: change(_kernels(d)[5]))
    _, report = analyze_path(str(trace), ingest_opts=IngestOptions(jobs=1), warn=False)
    said = [n for n in report["notes"] if words in n]
    assert len(said) == 1 and said[0].startswith("rank 1 "), report["notes"]


def test_one_correlation_out_of_range_leaves_the_others(run: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad = changed(run, tmp_path, lambda d: _kernels(d)[0]["args"].__setitem__("correlation", 2**64))
    code, err, con = ingest(tmp_path, capsys, bad)
    try:
        total, typed = con.execute("SELECT count(*), count(correlation) FROM kernels").fetchone() or (0, 0)
    finally:
        con.close()
    assert code == 0 and total == len(_kernels(json.loads(bad.read_text()))) and typed == total - 1
    assert any("values: 1 typed values" in line for line in err)
