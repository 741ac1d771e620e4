"""Bad input: one line on stderr naming the file (and the byte offset where known), exit 2;
`--salvage` keeps the complete events before the damage and marks the file partial."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import duckdb
import pytest
from helpers import one, run_diag

from diag.ingest import source

EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 1000.5 + i * 10, "dur": 5,
     "args": {"External id": i}}
    for i in range(20)
]


def trace_text(**extra: object) -> str:
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": EVENTS, **extra}
    return json.dumps(doc, indent=1)


def ingest(tmp_path: Path, f: Path, *extra: str) -> tuple[int, str]:
    r = run_diag("ingest", str(f), "--db", str(tmp_path / "x.duckdb"), *extra)
    return r.returncode, r.stderr


def one_line_naming(stderr: str, f: Path) -> bool:
    return stderr.count("\n") == 1 and str(f) in stderr and "Traceback" not in stderr


def rows(tmp_path: Path) -> tuple[int, bool | None]:
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    n = one(con, "SELECT count(*) FROM cpu_ops")[0]
    part = one(con, "SELECT any_value(partial) FROM trace_files")[0]
    con.close()
    return n, part


def test_truncated_file_is_refused_then_salvaged(tmp_path: Path) -> None:
    text = trace_text()
    cut = text.index('"aten::op12"')          # killed mid-write, inside event 12
    f = tmp_path / "rank-0.json"
    f.write_text(text[:cut])
    code, err = ingest(tmp_path, f)
    assert code == 2 and one_line_naming(err, f) and "truncated" in err and f"byte {cut}" in err
    assert rows(tmp_path) == (0, None)        # atomic: nothing of the file
    code, err = ingest(tmp_path, f, "--salvage")
    assert code == 0, err
    assert rows(tmp_path) == (12, True)       # events 0..11 were complete



def test_the_report_notes_the_salvaged_file_alone(tmp_path: Path) -> None:
    """A salvaged rank beside a whole one: the report's notes name the salvaged file, where it
    was damaged and how many events were analyzed; the whole rank gets no note."""
    text = trace_text()
    cut = text.index('"aten::op12"')
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank-0.json").write_text(text[:cut])
    (run / "rank-1.json").write_text(text.replace('"rank": 0', '"rank": 1'))
    r = run_diag("analyze", str(run), "--salvage", "--format", "json")
    assert r.returncode == 0, r.stderr
    notes = [n for n in json.loads(r.stdout)["notes"] if "--salvage" in n]
    assert notes == [f"rank 0 (rank-0.json): damaged at byte {cut}; analyzed the 12 complete events before it "
                     "(--salvage)"], notes

def test_truncated_gzip_is_refused_with_offset(tmp_path: Path) -> None:
    data = gzip.compress(trace_text().encode())
    f = tmp_path / "rank-0.pt.trace.json.gz"
    f.write_bytes(data[: len(data) // 2])
    code, err = ingest(tmp_path, f)
    assert code == 2 and one_line_naming(err, f) and "truncated gzip" in err and "byte" in err


def test_corrupt_gzip(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(trace_text().encode()))
    data[20:40] = b"\xff" * 20
    f = tmp_path / "rank-0.json.gz"
    f.write_bytes(bytes(data))
    code, err = ingest(tmp_path, f)
    assert code == 2 and one_line_naming(err, f) and "gzip" in err


def test_control_character_inside_a_string(tmp_path: Path) -> None:
    text = trace_text().replace("aten::op7", "aten::op\x017")
    f = tmp_path / "rank-0.json"
    f.write_text(text)
    code, err = ingest(tmp_path, f)
    assert code == 2 and one_line_naming(err, f) and "control character 0x01" in err
    assert f"byte {text.index(chr(1))}" in err
    assert ingest(tmp_path, f, "--salvage")[0] == 0
    assert rows(tmp_path) == (7, True)


def test_nan_literal(tmp_path: Path) -> None:
    text = trace_text().replace('"dur": 5', '"dur": NaN', 1)
    f = tmp_path / "rank-0.json"
    f.write_text(text)
    code, err = ingest(tmp_path, f)
    assert code == 2 and one_line_naming(err, f) and "NaN" in err and f"byte {text.index('NaN')}" in err


def test_huge_integers_stay_exact(tmp_path: Path) -> None:
    big = 2**70 + 1
    ev = [{"ph": "f", "id": big, "pid": 1, "tid": 1, "ts": 5, "cat": "ac2g", "name": "ac2g", "bp": "e"}]
    doc = {"distributedInfo": {"rank": 0}, "traceEvents": EVENTS + ev}
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps(doc))
    code, err = ingest(tmp_path, f)
    assert code == 0, err
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    assert one(con, "SELECT flow_id FROM flows")[0] == str(big)
    con.close()


def test_deep_nesting(tmp_path: Path) -> None:
    f = tmp_path / "rank-0.json"
    f.write_text('{"traceEvents": [{"ph": "X", "args": ' + "[" * 200_000 + "]" * 200_000 + "}]}")
    code, err = ingest(tmp_path, f)
    assert code == 2 and one_line_naming(err, f) and "nested too deeply" in err


def test_decompression_bomb_is_capped(tmp_path: Path) -> None:
    # 64 MiB of spaces inside a valid trace packs to ~64 KiB.
    text = trace_text()
    bomb = text[:-1] + " " * (64 << 20) + "}"
    f = tmp_path / "rank-0.json.gz"
    f.write_bytes(gzip.compress(bomb.encode(), compresslevel=9))
    assert f.stat().st_size < 1 << 20
    code, err = ingest(tmp_path, f, "--max-bytes", str(1 << 20))
    assert code == 2 and one_line_naming(err, f) and "cap" in err and "--max-bytes" in err


def test_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "rank-0.json"
    f.write_text("")
    code, err = ingest(tmp_path, f)
    assert code == 2 and one_line_naming(err, f) and "empty" in err


@pytest.mark.parametrize("text", ['{"hello": "world"}', "[1, 2, 3]", '{"traceEvents": 5}'])
def test_json_that_is_not_a_trace(tmp_path: Path, text: str) -> None:
    f = tmp_path / "rank-0.json"
    f.write_text(text)
    code, err = ingest(tmp_path, f)
    assert code == 2 and one_line_naming(err, f) and "not a" in err


def test_a_bad_file_does_not_stop_the_good_ones(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank-0.json").write_text(trace_text())
    (d / "rank-1.json").write_text(trace_text()[:100])
    code, err = ingest(tmp_path, d)
    errors = [line for line in err.splitlines() if "rank-1.json" in line]
    # As `diag analyze` on the same directory: a warning naming the file left out, exit 0.
    assert code == 0 and len(errors) == 1 and errors[0].startswith("diag: warning: ")
    assert rows(tmp_path)[0] == 20
    analyzed = run_diag("analyze", str(d))
    assert analyzed.returncode == 0 and analyzed.stderr.splitlines() == err.splitlines()


def test_gzip_member_concatenation_reads_whole(tmp_path: Path) -> None:
    text = trace_text().encode()
    half = len(text) // 2
    f = tmp_path / "rank-0.json.gz"
    f.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    assert ingest(tmp_path, f)[0] == 0
    assert rows(tmp_path) == (20, False)   # two gzip members, as `cat a.gz b.gz` makes


@pytest.mark.parametrize("layout", ["one member", "two members", "a small last member", "NUL padding",
                                    "an empty member first"])
def test_gzip_content_and_hash_whatever_the_trailer_says(tmp_path: Path, layout: str) -> None:
    """The inflated size is read from the gzip trailer (the last member's ISIZE) and checked: where
    it is not the whole content's, the content is counted and inflated again, to the same bytes."""
    text = trace_text().encode()
    one, parts = gzip.compress(text), {
        "one member": [text], "two members": [text[: len(text) // 2], text[len(text) // 2 :]],
        "a small last member": [text[:-3], text[-3:]], "NUL padding": [text], "an empty member first": [b"", text],
    }[layout]
    data = b"".join(gzip.compress(p) for p in parts) + (b"\0" * 512 if layout == "NUL padding" else b"")
    assert layout != "one member" or data == one
    f = tmp_path / "rank-0.json.gz"
    f.write_bytes(data)
    src = source.read_source(str(f))
    assert bytes(src.data) == text and src.content_hash == hashlib.sha256(text).hexdigest()


def test_typed_args_of_an_unexpected_type_or_range_are_kept_raw_and_counted(tmp_path: Path) -> None:
    """A typed key holding a string, or an integer past int64 (2^70), is typed null, its event and
    raw text kept whole, and each such event counted in one warning; the other keys still type.
    A collective's keys (decoded apart, only where "Collective name" is set) alike. (A stream written
    as a number's text is that number, as ROCm writes it: test_values.)"""
    big = 2**70
    odd = [
        {"ph": "X", "cat": "kernel", "name": "k0", "pid": 0, "tid": 7, "ts": 2000, "dur": 3,
         "args": {"stream": "the default", "correlation": 11, "device": 0}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::big", "pid": 1, "tid": 1, "ts": 2100, "dur": 3,
         "args": {"External id": big, "Sequence number": 4}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 2200, "dur": 3,
         "args": {"External id": 9, "Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1024,
                  "Group size": "8", "Process Group Ranks": "[0, 1]"}},
    ]
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": EVENTS + odd}))
    code, err = ingest(tmp_path, f)
    assert code == 0 and "3 typed values were of an unexpected type" in err, err
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    # The stream falls back to the GPU row's tid, as for the 2021 schema.
    assert one(con, "SELECT stream, correlation, device FROM kernels") == (7, 11, 0)
    ext, seq, raw = one(con, "SELECT external_id, seq_num, args::VARCHAR FROM cpu_ops WHERE name = 'aten::big'")
    assert (ext, seq) == (None, 4) and str(big) in raw
    assert one(con, "SELECT count(*) FROM cpu_ops")[0] == len(EVENTS) + 2
    assert one(con, "SELECT external_id, collective, dtype, in_nelems, group_size, pg_ranks FROM collective_args") \
        == (9, "allreduce", "Float", 1024, None, [0, 1])
    con.close()


def test_args_with_bytes_that_are_not_utf8_are_mended_and_counted(tmp_path: Path) -> None:
    """A byte that is not UTF-8 inside an args string (a name cut mid-character) passes the JSON
    check, which skips over what it does not type: the event is kept, its args stored with the bad
    bytes as U+FFFD, every other byte as written, and each such byte sequence counted in one warning
    ("caf\\xc3" is one, "\\xff\\xfe" two, as Python's "replace" reads them)."""
    bad = [b'{"note": "caf\xc3", "External id": 41}', b'{"Input Dims": [[1]], "x": "\xff\xfe"}']
    events = [json.dumps({k: v for k, v in e.items() if k != "args"})[:-1].encode() + b', "args": ' + a + b"}"
              for e, a in zip(EVENTS, bad, strict=False)]
    f = tmp_path / "rank-0.json"
    f.write_bytes(b'{"distributedInfo": {"rank": 0}, "traceEvents": [' + b",\n".join(events) + b"]}")
    code, err = ingest(tmp_path, f)
    assert code == 0 and "values: 3 byte sequences were not UTF-8" in err, err
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    assert con.execute("SELECT external_id, args::VARCHAR, input_dims::VARCHAR FROM cpu_ops ORDER BY ts_ns").fetchall() == [
        (41, '{"note": "caf\ufffd", "External id": 41}', None),
        (None, '{"Input Dims": [[1]], "x": "\ufffd\ufffd"}', "[[1]]"),
    ]
    con.close()


def test_one_warning_per_reason_counts_the_files(tmp_path: Path) -> None:
    """Three CPU-only ranks: one counted line, alike from ingest and analyze, not one per file."""
    d = tmp_path / "run"
    d.mkdir()
    for rank in range(3):
        (d / f"rank-{rank}.json").write_text(trace_text(distributedInfo={"rank": rank, "world_size": 3}))
    code, err = ingest(tmp_path, d)
    gpu = [line for line in err.splitlines() if "no GPU activity" in line]
    assert code == 0 and len(gpu) == 1 and gpu[0].startswith("diag: warning: 3 files: no GPU activity")
    assert str(d / "rank-0.json") in gpu[0]
    analyzed = run_diag("analyze", str(d))
    assert analyzed.returncode == 0 and gpu == [x for x in analyzed.stderr.splitlines() if "no GPU activity" in x]
