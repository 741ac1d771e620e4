"""Each failure the fuzzers (tests/test_fuzz.py, scripts/fuzz.py) found, as the smallest input that
showed it: exit 3 (an internal error) where a run should go on or refuse the file in one line."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

from helpers import TRACES, one, shared_traces

from diag.api import analyze_path
from diag.ingest.pipeline import ingest
from diag.runtime import store
from fixtures.fuzz import NCCL

TRITON = "HolisticTraceAnalysis/tests/data/triton_example/triton_example.json.gz"


def test_input_dims_not_a_list_is_no_shape(tmp_path: Path) -> None:
    """`"Input Dims": -1` on an op (a number, not a list of shapes): TypeError 'int' object is not
    iterable in the timeline's tensor sizes, exit 3. Such an op has no shape; the run goes on."""
    shared_traces()
    doc = json.loads(gzip.decompress((TRACES / TRITON).read_bytes()))
    changed = 0
    for e in doc["traceEvents"]:
        if "Input Dims" in e.get("args", {}):
            e["args"]["Input Dims"], changed = -1, changed + 1
    assert changed
    (tmp_path / "rank-0.json").write_text(json.dumps(doc))
    _, report = analyze_path(str(tmp_path), warn=False)
    assert report["steps"] >= 0


def _stored_records(directory: Path) -> list[str]:
    con = store.connect(None)
    result = ingest([str(directory)], con)
    assert not result.errors, [e.one_line() for e in result.errors]
    return [r for (r,) in con.execute("SELECT record::VARCHAR FROM nccl_ops").fetchall()]


def test_inspector_line_escaping_a_lone_surrogate_is_stored(tmp_path: Path) -> None:
    """An Inspector line with `"coll": "\\ud800AllReduce"` (a JSON escape of half a UTF-16 pair):
    DuckDB's JSON cast refused the record (ConversionException), exit 3 for every file of the batch.
    The half is stored as U+FFFD."""
    line = (NCCL / "inspector_node-017-pid1639453.json").read_text().splitlines()[0]
    (tmp_path / "node-pid1.log").write_text(line.replace('"coll":"AllReduce"', '"coll":"\\ud800AllReduce"') + "\n")
    (record,) = _stored_records(tmp_path)
    assert "\ufffdAllReduce" in record


def test_flight_recorder_string_with_a_lone_surrogate_is_stored(tmp_path: Path) -> None:
    """A Flight Recorder pickle whose profiling_name holds a lone surrogate (a pickle may): Arrow
    cannot encode it (UnicodeEncodeError), exit 3. Stored as U+FFFD."""
    from diag.ingest.safe_pickle import load_plain
    name = "fr_torch2.13_gloo_nccl_trace_rank_0"
    dump = load_plain(name, (NCCL / name).read_bytes())
    assert isinstance(dump, dict)
    dump["entries"][0]["profiling_name"] = "gloo:all_reduce\udc80"
    dump["entries"][0]["process_group"] = ("0", "\ud800pg")
    (tmp_path / name).write_bytes(pickle.dumps(dump))
    records = _stored_records(tmp_path)
    assert any("\ufffd" in r for r in records)


def test_warning_quoting_a_lone_surrogate_is_stored(tmp_path: Path) -> None:
    """A profiler-plugin element the parser skips with a warning that quotes it: the warning held a
    lone surrogate and trace_files.warnings (JSON) refused it, exit 3."""
    doc = json.loads((NCCL / "example_profiler_4242_1.json").read_text())
    doc.insert(1, "\ud800")
    (tmp_path / "example_profiler_4242_1.json").write_text(json.dumps(doc))
    con = store.connect(None)
    result = ingest([str(tmp_path)], con)
    assert not result.errors, [e.one_line() for e in result.errors]
    assert one(con, "SELECT count(*) FROM trace_files WHERE warnings IS NOT NULL")[0] == 1
