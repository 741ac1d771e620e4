"""Files that change after they were read (issue 15, items 1 and 4).

NCCL Inspector appends a line per communicator and dump interval for as long as the job runs: a
file read before is read on from where that read stopped, so the store holds each record once,
under one file row, whether the log was read whole or in pieces (live, or `diag ingest` again);
a log that shrank or changed before that point is a new file, said in a warning. A `.json.gz`
cut off by a killed run is salvaged up to the damage, and its whole version, if it comes,
replaces what was salvaged.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import duckdb
from helpers import one, run_diag

from diag.engine.run import AnalyzeOptions
from diag.ingest.nccl import parse_nccl_file
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.runtime import store
from fixtures.generate import generate
from fixtures.scenarios import Scenario
from tui.sources import Live

SCENARIO = Scenario(name="grow", world_size=1, steps=2, layers=2)


def _inspector_line(i: int, header: bool = True) -> bytes:
    """One line as inspector.cc writes it (json.cc: compact, keys in this order)."""
    head = '"header":{"id":"0x7f8c496ae9f661","rank":2,"n_ranks":8,"nnodes":1},' if header else ""
    return (
        f'{{{head}"metadata":{{"inspector_output_format_version":"v4.0","dump_timestamp_us":{1748030377748202 + i}}},'
        f'"coll_perf":{{"coll":"AllReduce","coll_sn":{1400 + i},"coll_msg_size_bytes":1048576,'
        f'"coll_exec_time_us":{600 + i},"coll_timing_source":"kernel_gpu","coll_algobw_gbs":1.7,"coll_busbw_gbs":3.1}}}}\n'
    ).encode()


LOG = b"".join(_inspector_line(i, header=i % 3 != 1) for i in range(12))


def test_a_log_read_in_two_pieces_is_the_log_read_whole() -> None:
    """Cut anywhere (inside a line, after a line without its newline yet, in the newline run),
    the second read goes on from where the first stopped: the same rows, warnings and state."""
    log = LOG[: LOG.index(b"\n") + 1] + b"\n" + LOG[LOG.index(b"\n") + 1 :]    # and a blank line
    whole = parse_nccl_file("x.log", log)
    for cut in range(LOG.index(b"{", 1), len(log) + 1):
        first = parse_nccl_file("x.log", log[:cut])
        rest = parse_nccl_file("x.log", log, resume=first.resume)
        assert first.table.to_pylist() + rest.table.to_pylist() == whole.table.to_pylist(), cut
        assert (rest.warnings, rest.resume) == (whole.warnings, whole.resume), cut


def _ops(con: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    return con.execute(
        "SELECT f.path, f.n_events, f.warnings, o.record_idx, o.seq, o.comm_id, o.rank, o.duration_ns "
        "FROM nccl_ops o JOIN trace_files f USING (file_id) ORDER BY o.record_idx"
    ).fetchall()


def _whole(tmp_path: Path, log: Path) -> list[tuple[Any, ...]]:
    """The rows of the final log read whole, once, into a store of its own."""
    con = store.connect(None)
    ingest([str(log)], con)
    rows = _ops(con)
    con.close()
    return rows


def test_live_reads_the_records_appended_while_it_runs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    generate(SCENARIO, run)
    log = run / "node-017-pid1639453.log"
    log.write_bytes(LOG[: LOG.index(b"\n", LOG.index(b"\n") + 1) + 1])     # the first two records
    live = Live(str(run), None, AnalyzeOptions(), IngestOptions())

    def poll_until(what: str, cond: Any) -> None:
        for _ in range(6):
            live.poll()
            with live.store.reader() as cur:
                if cond(cur):
                    return
        raise AssertionError(f"not after 6 polls: {what}")

    def records(cur: duckdb.DuckDBPyConnection) -> int:
        return int(one(cur, "SELECT count(*) FROM nccl_ops")[0])

    poll_until("the first two records", lambda cur: records(cur) == 2)
    # The job appends: whole lines, then one cut inside, as the dump thread leaves it between writes.
    grown = LOG[: len(LOG) * 2 // 3]
    with open(log, "ab") as f:
        f.write(grown[log.stat().st_size :])
    poll_until("the complete lines appended", lambda cur: records(cur) == grown.count(b"\n"))
    with open(log, "ab") as f:
        f.write(LOG[len(grown) :])
    poll_until("all twelve records", lambda cur: records(cur) == 12)
    with live.store.reader() as cur:
        assert one(cur, "SELECT count(*) FROM trace_files WHERE kind = 'nccl_inspector'")[0] == 1
        assert _ops(cur) == _whole(tmp_path, log)


def test_ingest_again_adds_only_the_new_records(tmp_path: Path) -> None:
    log = tmp_path / "node-017-pid1639453.log"
    db = tmp_path / "x.duckdb"
    cut = LOG.index(b"\n", len(LOG) // 3) + 40     # inside a line: "ignored the unfinished last line"
    log.write_bytes(LOG[:cut])
    first = run_diag("ingest", str(log), "--db", str(db))
    assert first.returncode == 0 and "unfinished last line" in first.stderr, first.stderr
    log.write_bytes(LOG)
    again = run_diag("ingest", str(log), "--db", str(db), "--jobs", "2")    # parsed in a worker process
    assert again.returncode == 0 and "events=12" in again.stdout, again.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert one(con, "SELECT count(*), count(DISTINCT path) FROM trace_files") == (1, 1)
    assert _ops(con) == _whole(tmp_path, log)      # the header carried over the cut, warnings included
    con.close()


def test_a_log_that_shrank_is_a_new_file_said_in_a_warning(tmp_path: Path) -> None:
    log = tmp_path / "node-017-pid1639453.log"
    db = tmp_path / "x.duckdb"
    log.write_bytes(LOG)
    assert run_diag("ingest", str(log), "--db", str(db)).returncode == 0
    first_line = LOG.index(b"\n") + 1
    log.write_bytes(LOG[:first_line])                  # the job restarted under the same name
    r = run_diag("ingest", str(log), "--db", str(db))
    assert r.returncode == 0 and f"shrank to {first_line} bytes from the {len(LOG)}" in r.stderr, r.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert one(con, "SELECT count(*), sum(n_events) FROM trace_files") == (1, 1)
    assert one(con, "SELECT count(*) FROM nccl_ops") == (1,)
    con.close()


def _truncated_gz(tmp_path: Path) -> tuple[Path, bytes]:
    """A generated trace gzipped, and cut at two thirds of it as a killed run leaves it."""
    src = tmp_path / "src"
    generate(SCENARIO, src)
    whole = gzip.compress(next(src.glob("*.json")).read_bytes())
    run = tmp_path / "run"
    run.mkdir()
    f = run / "rank-0.pt.trace.json.gz"
    f.write_bytes(whole[: len(whole) * 2 // 3])
    return f, whole


def test_salvage_keeps_the_events_before_a_gzip_cut_and_the_whole_file_replaces_them(tmp_path: Path) -> None:
    f, whole = _truncated_gz(tmp_path)
    db = tmp_path / "x.duckdb"
    plain = run_diag("ingest", str(f), "--db", str(db))
    assert plain.returncode == 2 and "--salvage" in plain.stderr
    salvaged = run_diag("ingest", str(f), "--db", str(db), "--salvage")
    assert salvaged.returncode == 0 and "truncated gzip stream" in salvaged.stderr, salvaged.stderr
    con = duckdb.connect(str(db), read_only=True)
    n_partial, partial = one(con, "SELECT n_events, partial FROM trace_files")
    con.close()
    events = json.loads(gzip.decompress(whole))["traceEvents"]
    assert partial and 0 < n_partial < len(events)
    f.write_bytes(whole)                       # the run was not killed after all: the file completes
    r = run_diag("ingest", str(f), "--db", str(db))
    assert r.returncode == 0 and "capture window" not in r.stderr, r.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert one(con, "SELECT count(*), any_value(n_events), bool_or(partial) FROM trace_files") == (1, len(events), False)
    counted = one(con, "SELECT (SELECT count(*) FROM cpu_ops) + (SELECT count(*) FROM kernels) + "
                       "(SELECT count(*) FROM runtime_calls) + (SELECT count(*) FROM copies) + "
                       "(SELECT count(*) FROM flows) + (SELECT count(*) FROM other_events) + "
                       "(SELECT count(*) FROM gpu_annotations)")[0]
    con.close()
    assert counted == len(events)              # none of the salvaged rows is left beside the whole file's


def test_live_salvages_a_stuck_gzip_and_takes_its_whole_version(tmp_path: Path) -> None:
    f, whole = _truncated_gz(tmp_path)
    now = [0.0]
    live = Live(str(f.parent), None, AnalyzeOptions(), IngestOptions(salvage=True), clock=lambda: now[0],
                settle_s=5.0)
    for _ in range(3):                         # seen, held still, read and refused as truncated
        live.poll()
        now[0] += 1.0
    now[0] += 10.0                             # unchanged past settle_s: stuck, salvaged
    snap = live.poll()
    assert snap is not None and snap.report is not None and snap.live is not None and not snap.live.pending
    with live.store.reader() as cur:
        assert one(cur, "SELECT partial FROM trace_files") == (True,)
    f.write_bytes(whole)
    for _ in range(2):                         # changed, then held still: read, and it replaces the salvage
        now[0] += 1.0
        live.poll()
    with live.store.reader() as cur:
        assert one(cur, "SELECT count(*), bool_or(partial) FROM trace_files") == (1, False)


def test_a_grown_profiler_dump_replaces_what_was_read_of_it(tmp_path: Path) -> None:
    """The profiler plugin's dump is one JSON array, read whole: a longer version of it replaces
    the rows of the shorter, under one file row (before, both stayed: each record twice)."""
    whole = (Path(__file__).parent / "data" / "nccl" / "example_profiler_4242_1.json").read_bytes()
    dump = tmp_path / "example_profiler_4242_1.json"
    dump.write_bytes(whole[: whole.index(b"\n", len(whole) // 2) + 1])    # cut between two events
    db = tmp_path / "x.duckdb"
    first = run_diag("ingest", str(dump), "--db", str(db))
    assert first.returncode == 0 and "without its closing ']'" in first.stderr, first.stderr
    dump.write_bytes(whole)
    assert run_diag("ingest", str(dump), "--db", str(db)).returncode == 0
    con = duckdb.connect(str(db), read_only=True)
    assert one(con, "SELECT count(*) FROM trace_files") == (1,)
    assert _ops(con) == _whole(tmp_path, dump)
    con.close()


def test_lines_appended_with_another_rank_unsettle_the_rank_of_the_rows_read_before(tmp_path: Path) -> None:
    log = tmp_path / "node-017-pid1639453.log"
    log.write_bytes(LOG)
    con = store.connect(None)
    ingest([str(log)], con)
    assert con.execute("SELECT DISTINCT rank FROM nccl_ops").fetchall() == [(2,)]
    with open(log, "ab") as f:
        f.write(_inspector_line(12).replace(b'"rank":2', b'"rank":3'))
    ingest([str(log)], con)
    rows = _ops(con)
    con.close()
    assert rows == _whole(tmp_path, log) and {r[6] for r in rows} == {None}
    assert "2 different communicator ranks" in rows[0][2]
