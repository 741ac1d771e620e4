"""`diag ingest`: every real trace ingests with every event in exactly one table, counted
independently with the stdlib json; re-ingest adds nothing; ranks and capture windows."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from helpers import kineto_traces, load_json, one, run_diag, shared_traces

from diag.ingest.kineto_decode import parse_pg_ranks
from diag.ingest.kineto_tabulate import EVENT_TABLES
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.runtime import store

RUNTIME = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}


def _is_int(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    return isinstance(v, str) and v.lstrip("-").isdigit()


def independent_counts(doc: dict[str, Any]) -> Counter[str]:
    """Where each event belongs, decided from the raw JSON with the stdlib (the same rules as
    diag/sql/schema.sql's table comments, restated without diag's code)."""
    c: Counter[str] = Counter()
    for e in doc.get("traceEvents", []):
        ph, cat = e.get("ph"), e.get("cat")
        if ph == "X" and e.get("ts") is not None and cat not in ("Trace", "cuda_sync", "cuda_profiler_range"):
            if cat in ("kernel", "Kernel"):
                c["kernels"] += 1
            elif cat in ("gpu_memcpy", "Memcpy", "gpu_memset", "Memset"):
                c["copies"] += 1
            elif cat == "gpu_user_annotation":
                c["gpu_annotations"] += 1
            elif not (_is_int(e.get("pid")) and _is_int(e.get("tid"))):
                c["other_events"] += 1
            elif cat in RUNTIME or str(cat).endswith(("_runtime", "_driver")):
                c["runtime_calls"] += 1
            else:
                c["cpu_ops"] += 1
        elif ph in ("s", "f", "t"):
            c["flows"] += 1
        else:
            c["other_events"] += 1
    return c


Stores = dict[str, tuple[duckdb.DuckDBPyConnection, int]]


@pytest.fixture(scope="module")
def ingested() -> Stores:
    """Each real trace into its own in-memory store (they are different runs)."""
    out: Stores = {}
    for i, p in enumerate(kineto_traces()):
        con = store.connect(None)
        # --rank only applies where distributedInfo has none (a few HTA test traces).
        r = ingest([str(p)], con, IngestOptions(rank=1000 + i, jobs=1))
        assert not r.errors, [e.one_line() for e in r.errors]
        assert len(r.ingested) == 1, p
        out[str(p)] = (con, r.ingested[0][1])
    return out


def test_every_real_trace_ingests_with_exact_counts(ingested: Stores) -> None:
    assert ingested, "no trace ingested"
    for path, (con, fid) in ingested.items():
        doc = load_json(Path(path))
        want = independent_counts(doc)
        got = {t: one(con, f"SELECT count(*) FROM {t} WHERE file_id = ?", [fid])[0] for t in EVENT_TABLES}
        assert {t: n for t, n in got.items() if n} == {t: n for t, n in want.items() if n}, path
        n_events = one(con, "SELECT n_events FROM trace_files WHERE file_id = ?", [fid])[0]
        assert sum(got.values()) == n_events == len(doc["traceEvents"]), path


def test_kernel_times_are_exact_integer_ns(ingested: Stores) -> None:
    path = next(p for p in ingested if p.endswith("nccl_data.json.gz"))
    con, fid = ingested[path]
    # The decimal text, not a float: "4458676983543.183" µs is exactly ...543183 ns, which
    # float(ts) * 1000 gets wrong by one.
    with gzip.open(path, "rt") as f:
        doc = json.load(f, parse_float=Decimal)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"][:200]
    for k in kernels:
        row = con.execute(
            "SELECT ts_ns, dur_ns, stream FROM kernels WHERE file_id = ? AND correlation = ?",
            [fid, k["args"]["correlation"]],
        ).fetchone()
        assert row == (int(k["ts"] * 1000), int(k["dur"] * 1000), k["args"]["stream"])


def _file_row(ingested: Stores, suffix: str, cols: str) -> tuple[Any, ...]:
    path = next(p for p in ingested if p.endswith(suffix))
    con, fid = ingested[path]
    row = con.execute(f"SELECT {cols} FROM trace_files WHERE file_id = ?", [fid]).fetchone()
    assert row is not None
    return tuple(row)


def test_rank_world_and_device_come_from_the_trace(ingested: Stores) -> None:
    row = _file_row(ingested, "control.json.gz", "rank, rank_source, world_size, device_name, has_gpu, schema_era")
    assert row == (3, "distributedInfo", 8, "NVIDIA A100-PG509-200", True, "current")
    assert _file_row(ingested, "inference_rank_1.json.gz", "schema_era") == ("2021",)
    w = _file_row(ingested, "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", "has_gpu, warnings")
    assert w[0] is False and "no GPU activity" in w[1]


def test_collective_args_are_typed(ingested: Stores) -> None:
    path = next(p for p in ingested if p.endswith("nccl_data.json.gz"))
    con, fid = ingested[path]
    doc = load_json(Path(path))
    want = [e for e in doc["traceEvents"] if e.get("name") == "record_param_comms" and "Collective name" in e["args"]]
    rows = con.execute(
        "SELECT collective, pg_name, pg_desc, pg_ranks, group_size, in_nelems, dtype FROM collective_args "
        "WHERE file_id = ? AND source = 'cpu_op' ORDER BY ts_ns", [fid],
    ).fetchall()
    assert len(rows) == len(want) > 0
    a = sorted(want, key=lambda e: e["ts"])[0]["args"]
    assert rows[0] == (a["Collective name"], a["Process Group Name"], a["Process Group Description"], [0, 1],
                       a["Group size"], a["In msg nelems"], a["dtype"])


@pytest.mark.parametrize(
    ("text", "size", "start", "stride", "want"),
    [
        ("[0, 1, 2, 3]", 4, None, None, ([0, 1, 2, 3], False)),
        ("[0, 1, ..., 7]", 8, None, None, ([0, 1, 2, 3, 4, 5, 6, 7], False)),
        ("[0, 8, 16, ..., 56]", 8, None, None, ([0, 8, 16, 24, 32, 40, 48, 56], False)),
        ("[3, ..., 59]", 8, 3, 8, ([3, 11, 19, 27, 35, 43, 51, 59], False)),
        ("[0, 1, ..., 9]", 8, None, None, ([0, 1, 9], True)),   # inconsistent with the group size: kept, flagged
        ('"[4, 5]"', 2, None, None, ([4, 5], False)),
    ],
)
def test_process_group_ranks_including_the_truncated_form(
    text: str, size: int, start: int | None, stride: int | None, want: tuple[list[int], bool]
) -> None:
    assert parse_pg_ranks(text, size, start, stride) == want


def test_reingest_adds_zero_rows(tmp_path: Path) -> None:
    src = shared_traces() / "HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz"
    db = tmp_path / "run.duckdb"
    first = run_diag("ingest", str(src), "--db", str(db))
    assert first.returncode == 0, first.stderr

    def total() -> int:
        con = duckdb.connect(str(db), read_only=True)
        n = sum(one(con, f"SELECT count(*) FROM {t}")[0] for t in (*EVENT_TABLES, "trace_files"))
        con.close()
        return n

    before = total()
    again = run_diag("ingest", str(src), "--db", str(db))
    assert again.returncode == 0 and "already ingested" in again.stderr
    assert total() == before


def test_rank_from_file_name_with_a_warning_else_by_process_or_option(tmp_path: Path) -> None:
    """No distributedInfo.rank: the name's rank, else rank 0 for a lone process (once refused
    with "pass --rank N"), and --rank still names a single file's rank."""
    src = shared_traces() / "kineto/docs/traces/after_fix_trace.json"
    named = tmp_path / "rank-5.json"
    shutil.copy(src, named)
    r = run_diag("ingest", str(named), "--db", str(tmp_path / "a.duckdb"))
    assert r.returncode == 0 and "rank 5 taken from the file name" in r.stderr
    for db, args, rank, source in (("b", (), 0, "process"), ("c", ("--rank", "2"), 2, "option")):
        r = run_diag("ingest", str(src), "--db", str(tmp_path / f"{db}.duckdb"), *args)
        assert r.returncode == 0, r.stderr
        con = duckdb.connect(str(tmp_path / f"{db}.duckdb"), read_only=True)
        assert one(con, "SELECT rank, rank_source FROM trace_files") == (rank, source)
        assert one(con, "SELECT count(*) FROM kernels WHERE rank IS DISTINCT FROM ?", [rank]) == (0,)
        con.close()


def test_capture_windows_of_one_rank_are_kept_apart_and_clashes_named(tmp_path: Path) -> None:
    src = load_json(shared_traces() / "kineto/docs/traces/after_fix_trace.json")
    later = json.loads(json.dumps(src))
    for e in later["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += 10_000_000  # 10 s later: the next profiler cycle
    overlapping = json.loads(json.dumps(src))
    overlapping["traceEvents"][0]["name"] = "changed"
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank-0.a.json").write_text(json.dumps(src))
    (d / "rank-0.b.json").write_text(json.dumps(later))
    db = tmp_path / "w.duckdb"
    assert run_diag("ingest", str(d), "--db", str(db)).returncode == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT capture_window FROM trace_files ORDER BY first_ts_ns").fetchall() == [(0,), (1,)]
    con.close()
    (tmp_path / "rank-0.c.json").write_text(json.dumps(overlapping))
    r = run_diag("ingest", str(tmp_path / "rank-0.c.json"), "--db", str(db))
    assert r.returncode == 2 and "rank-0.c.json" in r.stderr and "rank-0.a.json" in r.stderr


def test_while_an_ingest_writes_duckdb_takes_the_cores_the_parse_leaves(tmp_path: Path) -> None:
    """store.appending: at least one thread, each row group written as it fills; DuckDB's own
    settings back afterwards, however the block ends."""
    con = store.connect(tmp_path / "s.duckdb")
    con.execute("SET threads = 3")

    def settings() -> tuple[int, int]:
        rows = dict(con.execute("SELECT name, value FROM duckdb_settings() "
                                "WHERE name IN ('threads', 'write_buffer_row_group_count')").fetchall())
        return int(rows["threads"]), int(rows["write_buffer_row_group_count"])

    before = settings()
    with store.appending(con, parse_cores=1):
        assert settings() == (max(1, (os.cpu_count() or 1) - 1), 1)
    assert settings() == before
    with pytest.raises(RuntimeError), store.appending(con, parse_cores=10**6):
        assert settings() == (1, 1)
        raise RuntimeError
    assert settings() == before
    con.close()


def test_the_runs_last_file_is_checkpointed_as_it_commits(tmp_path: Path) -> None:
    """store.FileWriter(last=True): the commit checkpoints, writing no log of the rows (the close
    would checkpoint them anyway); another file's rows are logged, as DuckDB does by default under
    the threshold. The threshold is back afterwards, and the rows are the same either way."""
    def wal_after(last: bool) -> tuple[int, list[Any]]:
        db = tmp_path / f"{last}.duckdb"
        con = store.connect(db)
        with store.FileWriter(con, rank=0, last=last) as w:
            w.add({"cpu_ops": pa.table({"name": ["aten::mm"] * 1000, "ts_ns": range(1000), "dur_ns": [1] * 1000})})
            w.finish({"path": "t.json", "content_hash": "h", "kind": "kineto", "rank": 0, "n_events": 1000,
                      "has_gpu": False, "partial": False})
        wal = Path(f"{db}.wal")
        logged = wal.stat().st_size if wal.exists() else 0
        threshold = con.execute("SELECT current_setting('checkpoint_threshold')").fetchall()[0][0]
        rows = con.execute("SELECT name, ts_ns, dur_ns FROM cpu_ops ORDER BY ts_ns").fetchall()
        con.close()
        assert threshold == store.CHECKPOINT_THRESHOLD.replace("MiB", ".0 MiB")
        return logged, rows

    (logged_last, rows_last), (logged, rows) = wal_after(True), wal_after(False)
    assert logged_last == 0 < logged and rows_last == rows and len(rows) == 1000


def test_a_failed_insert_tells_its_own_error(tmp_path: Path) -> None:
    """store.registered: inside a transaction a failed INSERT aborts it, and DuckDB then refuses the
    unregister too; the INSERT's error is the one raised, and the name is free afterwards."""
    con = store.connect(tmp_path / "s.duckdb")
    con.execute("BEGIN TRANSACTION")
    with pytest.raises(duckdb.ConversionException), \
            store.registered(con, "_rows", pa.table({"x": pa.array(["not a number"])})):
        con.execute("INSERT INTO cpu_ops (file_id, ts_ns, dur_ns) SELECT x, 0, 0 FROM _rows")
    con.execute("ROLLBACK")
    with store.registered(con, "_rows", pa.table({"x": pa.array([1])})):
        assert con.execute("SELECT x FROM _rows").fetchall() == [(1,)]
    con.close()

# Args as a profiler may write them: spacing, key order, a float's own spelling, an escape.
_ODD_ARGS = ['{"External id": 7,  "z": 1.50e2, "a": "caf\\u00e9"}', '{ }', '{"Input Dims": [[2, 3], []]}']


def _args_trace(path: Path) -> Path:
    events = ",\n".join(
        f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": {i}.5, "dur": 1, "args": {a}}}'
        for i, a in enumerate(_ODD_ARGS))
    path.write_text('{"distributedInfo": {"rank": 0}, "traceEvents": [\n' + events + "\n]}")
    return path


def _args_compression(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {c for (c,) in con.execute("SELECT DISTINCT compression FROM pragma_storage_info('cpu_ops') "
                                      "WHERE column_name = 'args' AND segment_type <> 'VALIDITY'").fetchall()}


@pytest.mark.skipif(tuple(map(int, duckdb.__version__.split(".")[:2])) < (2, 0),
                    reason="DuckDB 1.x writes a storage format without zstd strings by default")
def test_a_file_store_keeps_args_verbatim_in_zstd(tmp_path: Path) -> None:
    """store.connect: a file store of DuckDB 2's format compresses the `args` columns with zstd;
    the text reads back byte for byte as the trace wrote it."""
    db = tmp_path / "s.duckdb"
    con = store.connect(db)
    ingest([str(_args_trace(tmp_path / "t.json"))], con, IngestOptions())
    con.close()   # the checkpoint writes (and compresses) the rows
    con = duckdb.connect(str(db), read_only=True)
    assert [a for (a,) in con.execute("SELECT args FROM cpu_ops ORDER BY ts_ns").fetchall()] == _ODD_ARGS
    assert _args_compression(con) == {"ZSTD"}
    con.close()


def test_stores_of_other_formats_leave_args_to_duckdb(tmp_path: Path) -> None:
    """In memory, or in a file of an older storage format (DuckDB 1.4's default, v1.0.0, which holds
    no zstd strings), the schema carries no compression clause."""
    old = tmp_path / "old.duckdb"
    duckdb.connect(str(old), config={"storage_compatibility_version": "v1.0.0"}).close()
    for con in (store.connect(None), store.connect(old)):
        (ddl,) = con.execute("SELECT sql FROM duckdb_tables() WHERE table_name = 'cpu_ops'").fetchall()[0]
        assert "args JSON" in ddl and "COMPRESSION" not in ddl
        con.close()
