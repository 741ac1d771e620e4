"""Values a trace holds that cannot be kept as written (issue 15, item 3): each is refused (exit 2
naming the file and the event's index in the file) or kept with a counted warning in
trace_files.warnings and in the report's notes — never stored as garbage with exit 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import one, run_diag, shared_traces

from diag.ingest.kineto import read_kineto
from diag.runtime.errors import BadInput
from fixtures.generate import generate
from fixtures.scenarios import Scenario


def _events(n: int = 20) -> list[dict[str, Any]]:
    return [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 1000.5 + i * 10,
             "dur": 5, "args": {"External id": i}} for i in range(n)]


def _write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}))
    return path


def _generated(tmp_path: Path) -> Path:
    d = tmp_path / "gen"
    generate(Scenario(name="values", world_size=1, steps=2, layers=2), d)
    return next(d.glob("*.json"))


def test_a_time_past_the_int64_ns_range_is_refused_at_its_index_in_the_file(tmp_path: Path) -> None:
    events = _events()
    events[15]["ts"] = 1e19        # µs: 1e22 ns, past int64 (it was stored as INT64_MIN)
    f = _write(tmp_path / "rank-0.json", events)
    info, chunks = read_kineto(str(f), f.read_bytes(), chunk_bytes=300)   # a few events per chunk
    with pytest.raises(BadInput, match=r"event 15: ts 1e\+19 µs is beyond"):
        list(chunks)
    r = run_diag("ingest", str(f), "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and str(f) in r.stderr and "event 15" in r.stderr


def test_an_event_that_is_not_one_is_named_by_its_index_in_the_file(tmp_path: Path) -> None:
    events = _events()
    events[13]["name"] = {"not": "a name"}
    f = _write(tmp_path / "rank-0.json", events)
    with pytest.raises(BadInput, match=r"event 13 is not a Kineto event: .* at name"):
        list(read_kineto(str(f), f.read_bytes(), chunk_bytes=300)[1])


def test_a_name_with_bytes_that_are_not_utf8_is_mended_and_counted(tmp_path: Path) -> None:
    """A typed string (an op's name cut mid-character) holding a byte that is not UTF-8: msgspec's
    check of the whole document skips over it, the typed decode refuses it. The event is kept with
    the byte as U+FFFD and counted; before, the whole file was refused ("events from byte 1 do not
    decode as a list"). Small chunks: the mend happens in whichever chunk holds the byte."""
    f = _write(tmp_path / "rank-0.json", _events())
    text = f.read_bytes()
    f.write_bytes(text.replace(b'"aten::op7"', b'"aten::op\xe97"').replace(b'"aten::op12"', b'"aten::\xff\xfeop12"'))
    info, chunks = read_kineto(str(f), f.read_bytes(), chunk_bytes=300)
    names = [n for t in chunks for n in t["cpu_ops"]["name"].to_pylist()]
    expected = [f"aten::op{i}" for i in range(20)]
    expected[7], expected[12] = "aten::op\ufffd7", "aten::\ufffd\ufffdop12"
    assert names == expected
    assert "values: 3 byte sequences were not UTF-8 (a string cut mid-character?); each kept as U+FFFD" in info.warnings


def test_parsed_ranges_are_released_as_bytes_of_the_file(tmp_path: Path) -> None:
    """`release` is told file offsets (it hands those pages of the file's map back): each range lies
    within the events array, and together they cover its events, whatever precedes the array."""
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1, "pad": "x" * 5000},
                             "traceEvents": _events(200), "after": "y" * 3000}))
    data = f.read_bytes()
    first, last = data.index(b'{"ph"'), data.rindex(b"}]") + 1     # the first event, the end of the last
    released: list[tuple[int, int]] = []
    _, chunks = read_kineto(str(f), data, chunk_bytes=2000, release=lambda a, b: released.append((a, b)))
    assert sum(t["cpu_ops"].num_rows for t in chunks) == 200
    assert len(released) > 5 and released[0][0] == first and released[-1][1] == last
    assert all(a < b and data[a:a + 1] == b"{" for a, b in released)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(released, released[1:], strict=False))


def test_a_stream_written_as_hex_text_is_its_number(tmp_path: Path) -> None:
    """ROCm's roctracer writes each HIP call's stream as text ("stream": "0x0"), and a GPU event's
    may be so too: the number it names, not a typed value counted as unexpected (every ROCm trace
    warned so), nor the GPU row's tid. Text that names no number falls back to the tid, counted."""
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 9, "ts": 1000 + 10 * i, "dur": 5,
               "args": {"device": 0, "stream": stream, "correlation": i}}
              for i, stream in enumerate(["0x1f", "0X2", "12", 3, "default"])]
    f = _write(tmp_path / "rank-0.json", events)
    info, chunks = read_kineto(str(f), f.read_bytes())
    assert [s for t in chunks for s in t["kernels"]["stream"].to_pylist()] == [31, 2, 12, 3, 9]
    assert info.warnings == ["values: 1 typed values were of an unexpected type or out of range; kept raw, typed what fit"]
    rocm = shared_traces() / "HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    r = run_diag("ingest", str(rocm), "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 0 and "typed values" not in r.stderr, r.stderr
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    # Its 14 kernels ran on stream 0, as their own args say; its 16 HIP calls on "0x0".
    assert con.execute("SELECT stream, count(*) FROM kernels GROUP BY stream").fetchall() == [(0, 14)]
    con.close()


def test_named_pids_and_tids_are_mapped_not_dropped(tmp_path: Path) -> None:
    events = _events(6)
    for e in events[:3]:
        e["tid"] = "pt_autograd_0"
    events[3]["pid"] = "1"                    # a number written as a string reads as that number
    events[4]["pid"] = events[5]["pid"] = "host-a"
    f = _write(tmp_path / "rank-0.json", events)
    db = tmp_path / "x.duckdb"
    r = run_diag("ingest", str(f), "--db", str(db))
    assert r.returncode == 0 and "values: 5 pid/tid values were names" in r.stderr, r.stderr
    con = duckdb.connect(str(db), read_only=True)
    ids = con.execute("SELECT pid, tid FROM cpu_ops ORDER BY ts_ns").fetchall()
    con.close()
    assert len(ids) == 6                                 # every op kept (all were dropped before)
    named_tid, named_pid = ids[0][1], ids[4][0]
    assert ids[:3] == [(1, named_tid)] * 3 and named_tid < 0      # one name, one id
    assert ids[3] == (1, 1) and ids[4] == ids[5] == (named_pid, 1) and named_pid < 0 and named_pid != named_tid


def test_events_without_ph_keep_a_gpu_trace_a_gpu_trace(tmp_path: Path) -> None:
    src = _generated(tmp_path)
    doc = json.loads(src.read_text())
    n = len(doc["traceEvents"])
    for e in doc["traceEvents"]:
        e.pop("ph", None)
    f = tmp_path / "run" / "rank-0.json"
    f.parent.mkdir()
    f.write_text(json.dumps(doc))
    r = run_diag("analyze", str(f.parent), "--format", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["mfu"] is not None and not any("CPU-only" in note for note in report["notes"])
    assert any(f"{n} events had no 'ph'" in note for note in report["notes"]), report["notes"]
    base = json.loads(run_diag("analyze", str(src), "--format", "json").stdout)
    assert report["ledger"] == base["ledger"]


def test_negative_durations_are_kept_as_zero_and_counted(tmp_path: Path) -> None:
    events = _events()
    events[2]["dur"] = -3
    events[7]["dur"] = -0.5
    f = _write(tmp_path / "rank-0.json", events)
    db = tmp_path / "x.duckdb"
    assert run_diag("ingest", str(f), "--db", str(db)).returncode == 0
    con = duckdb.connect(str(db), read_only=True)
    assert one(con, "SELECT min(dur_ns), count(*) FILTER (dur_ns = 0) FROM cpu_ops") == (0, 2)
    warnings = json.loads(one(con, "SELECT warnings FROM trace_files")[0])
    con.close()
    assert "values: 2 events had a negative duration; kept with duration 0" in warnings


def test_each_row_keeps_its_own_event_s_values_and_raw_args_whatever_the_mix_of_kinds(tmp_path: Path) -> None:
    """A chunk's events are grouped by destination table before their columns are built
    (kineto_tabulate._Chunk): every value and every raw args text must stay with its own event."""
    raw_args = ['{"External id": 1, "note": "é \\u00e9"}', '{ "correlation" : 7 }', None, '{"External id": 3}', "{}"]
    cats = ["cpu_op", "cuda_runtime", "ac2g", "kernel", "cpu_op"]
    events = []
    for i in range(40):   # the five kinds interleaved, eight times
        k = i % 5
        e: dict[str, Any] = {"ph": "s" if cats[k] == "ac2g" else "X", "cat": cats[k], "name": f"ev{i}", "pid": 1,
                             "tid": 2, "ts": 100 + i, "dur": 1 + i / 1000}
        if cats[k] == "ac2g":
            e["id"], e["dur"] = i, -5           # a flow's duration is read by nothing: not counted
        if cats[k] == "kernel":
            e["pid"], e["tid"] = 0, 7
        if raw_args[k] is not None:
            e["args"] = "@ARGS@"
        events.append(e)
    events[4].pop("tid")                         # a host span without tid goes to other_events
    events[9].pop("ts")                          # and so does a complete event without a start
    text = json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events})
    for k in range(40):
        if (raw := raw_args[k % 5]) is not None:
            text = text.replace('"@ARGS@"', raw, 1)
    f = tmp_path / "rank-0.json"
    f.write_text(text, encoding="utf-8")
    info, chunks = read_kineto(str(f), f.read_bytes())
    tables = [t for t in chunks]
    assert len(tables) == 1 and not any("negative" in w for w in info.warnings)
    t = tables[0]
    rows = {name: t[name].to_pylist() for name in ("cpu_ops", "runtime_calls", "flows", "kernels", "other_events")}
    expect_args = {i: raw_args[i % 5] for i in range(40)}   # the JSON text as written
    by_table = {"cpu_ops": [i for i in range(40) if i % 5 in (0, 4) and i not in (4, 9)],
                "runtime_calls": [i for i in range(40) if i % 5 == 1], "flows": [i for i in range(40) if i % 5 == 2],
                "kernels": [i for i in range(40) if i % 5 == 3], "other_events": [4, 9]}
    for name, ids in by_table.items():
        assert [r["name"] for r in rows[name]] == [f"ev{i}" for i in ids], name
        assert [r["args"] for r in rows[name]] == [expect_args[i] for i in ids], name
        if name != "other_events":
            assert [r["ts_ns"] for r in rows[name]] == [(100 + i) * 1000 for i in ids], name
    assert [r["dur_ns"] for r in rows["cpu_ops"]] == [1000 + i for i in by_table["cpu_ops"]]
    assert [r["ts_ns"] for r in rows["other_events"]] == [104_000, None]
    assert [r["correlation"] for r in rows["runtime_calls"]] == [7] * 8
    assert [(r["device"], r["stream"]) for r in rows["kernels"]] == [(0, 7)] * 8
    assert [r["flow_id"] for r in rows["flows"]] == [str(i) for i in by_table["flows"]]


@pytest.mark.parametrize(("head", "said"), [
    ({"baseTimeNanoseconds": 10**23}, "baseTimeNanoseconds"),
    ({"schemaVersion": 2**40}, "schemaVersion"),
    ({"distributedInfo": {"rank": 10**11}}, "rank 100000000000 (from distributedInfo) is not a rank"),
])
def test_header_values_past_their_column_are_refused_by_name(tmp_path: Path, head: dict[str, Any], said: str) -> None:
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0}, **head, "traceEvents": _events()}))
    r = run_diag("ingest", str(f), "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr and "Exception" not in r.stderr


def test_epoch_microseconds_become_exact_nanoseconds(tmp_path: Path) -> None:
    """Kineto writes absolute epoch µs (~1.7e15, HTA's with_gpu_user_annotation trace): whole µs are
    stored to the ns, where scaling them as floats put them up to 128 ns off (…557 µs → …557120 ns);
    a fraction is kept to the ns of the float JSON gives (0.25 µs of resolution at that size)."""
    events = _events(3)
    events[0]["ts"], events[1]["ts"], events[2]["ts"] = 1672876799191557, 1672876799191579, 1672876799191557.5
    f = _write(tmp_path / "rank-0.json", events)
    _, chunks = read_kineto(str(f), f.read_bytes())
    stored = [t["cpu_ops"].column("ts_ns").to_pylist() for t in chunks]
    assert sorted(sum(stored, [])) == [1672876799191557000, 1672876799191557500, 1672876799191579000]
