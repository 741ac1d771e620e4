"""A big file's second half parsed in a forked child (diag/ingest/forked.py): the store ends up
exactly as if one process had read the file, whether the split lands on an event boundary, falls
inside a string, or the child fails."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import kineto_traces

from diag import store
from diag.ingest import kineto
from diag.ingest.forked import SecondHalf
from diag.ingest.pipeline import IngestOptions, ingest

TABLES = (*kineto.EVENT_TABLES, "collective_args")


def snapshot(path: Path, split: bool) -> dict[str, Any]:
    """Every row of every table (order-free: a chunk's copies are memcpy then memset, so rows
    group by chunk) and the file's row, ingested with or without the split."""
    con = store.connect(None)
    r = ingest([str(path)], con, IngestOptions(jobs=None if split else 1, rank=0))
    assert not r.errors, [e.one_line() for e in r.errors]
    out: dict[str, Any] = {t: con.execute(f"SELECT * EXCLUDE (file_id) FROM {t} ORDER BY ALL").fetchall()
                           for t in TABLES}
    out["file"] = con.execute("SELECT * EXCLUDE (file_id, ingested_at) FROM trace_files").fetchall()
    out["warnings"] = r.warnings
    con.close()
    return out


@pytest.fixture
def split_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kineto, "SPLIT_BYTES", 1)


@pytest.mark.usefixtures("split_everything")
def test_split_ingest_equals_one_process_on_real_traces() -> None:
    traces = kineto_traces()[:6]
    for p in traces:
        assert snapshot(p, split=True) == snapshot(p, split=False), p


@pytest.mark.usefixtures("split_everything")
def test_a_split_inside_a_string_is_found_out_and_read_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The middle of the events falls in a name full of `}, {`: the first boundary after it is
    not an event boundary. The child is stopped when this process reaches it, and this process
    reads on; the child's half is never asked for."""
    asked: list[str] = []
    cancel = SecondHalf.cancel

    def tables(self: SecondHalf, info: kineto.KinetoFile, bad: Counter[str]) -> Iterator[dict[str, pa.Table]]:
        asked.append("tables")
        return iter(())

    def cancel_running(self: SecondHalf) -> None:
        if self.pid:   # a child still running, not the no-op on leaving the block
            asked.append("cancel")
        cancel(self)

    read = kineto._range
    parent = os.getpid()

    def read_range(path: str, info: kineto.KinetoFile, mv: memoryview, pos: int, end: int, *rest: Any) -> Any:
        if os.getpid() == parent:
            asked.append("read" if pos < end else "nothing left")
        return read(path, info, mv, pos, end, *rest)

    monkeypatch.setattr(SecondHalf, "tables", tables)
    monkeypatch.setattr(SecondHalf, "cancel", cancel_running)
    monkeypatch.setattr(kineto, "_range", read_range)
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
               "args": {"External id": i}} for i in range(40)]
    events[20]["name"] = '"}, {"ph": "X"' * 2000
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    got = snapshot(f, split=True)
    # This process reads to the split, stops the child there, then reads the rest (not: reads
    # through to the end and only then stops the child).
    assert asked == ["read", "cancel", "read"]
    assert got == snapshot(f, split=False)
    assert len(got["cpu_ops"]) == 40


def test_a_failed_child_leaves_the_half_to_this_process() -> None:
    parent = os.getpid()

    def parse(info: kineto.KinetoFile, bad: Counter[str]) -> Iterator[dict[str, pa.Table]]:
        if os.getpid() != parent:
            raise RuntimeError("the child fails")
        info.n_events += 3
        yield {"t": pa.table({"x": [1, 2, 3]})}

    info = kineto.KinetoFile.blank()
    with SecondHalf(parse) as half:
        tables = list(half.tables(info, Counter()))
    assert [t["t"].column("x").to_pylist() for t in tables] == [[1, 2, 3]] and info.n_events == 3
    assert not os.path.exists(half.dir)


def test_the_childs_tables_and_counts_come_back_in_order_a_table_at_a_time() -> None:
    def parse(info: kineto.KinetoFile, bad: Counter[str]) -> Iterator[dict[str, pa.Table]]:
        for i in range(3):
            info.n_events += 2
            bad["typed"] += 1
            yield {"a": pa.table({"x": [i, i]}), "b": pa.table({"y": [str(i)]}),
                   "empty": pa.table({"z": pa.array([], pa.int8())})}

    info, bad = kineto.KinetoFile.blank(), Counter[str]()
    with SecondHalf(parse) as half:
        tables = list(half.tables(info, bad))
    # Each table once, whole (so that the store inserts it in one statement), its rows in order.
    assert [list(t) for t in tables] == [["a"], ["b"]]
    assert tables[0]["a"].column("x").to_pylist() == [0, 0, 1, 1, 2, 2]
    assert tables[1]["b"].column("y").to_pylist() == ["0", "1", "2"]
    assert not any("empty" in t for t in tables) and info.n_events == 6 and bad == {"typed": 3}


def test_this_process_writes_its_rows_while_the_child_still_parses(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Done with its part before the child, this process writes what it holds rather than wait
    idle: the sink is flushed after the last of its tables and before the first of the child's,
    and only while the child runs (one INSERT a table otherwise, not two). The file reads alike."""
    monkeypatch.setattr(kineto, "SPLIT_BYTES", 1)
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
               "args": {"External id": i}} for i in range(400)]
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    data = f.read_bytes()
    for child_running in (True, False):
        calls: list[str] = []
        monkeypatch.setattr(SecondHalf, "running", lambda self, r=child_running: r)
        info, chunks = kineto.read_kineto(str(f), data, chunk_bytes=2000, split=True,
                                          while_waiting=partial(calls.append, "flush"))
        ops: list[str] = []
        for t in chunks:
            calls.append("tables")
            ops += t["cpu_ops"].column("name").to_pylist() if "cpu_ops" in t else []
        assert ops == [e["name"] for e in events]
        mine = calls.index("flush") if child_running else None
        assert calls.count("flush") == (1 if child_running else 0)
        # This process's chunks (several, of 2000 bytes), the flush, then the child's, a table at a time.
        assert mine is None or (mine > 1 and calls[mine + 1:] and set(calls[mine + 1:]) == {"tables"})


def test_a_child_found_ended_is_reaped_once_and_its_tables_still_come_back() -> None:
    def parse(info: kineto.KinetoFile, bad: Counter[str]) -> Iterator[dict[str, pa.Table]]:
        info.n_events += 1
        yield {"t": pa.table({"x": [7]})}

    info = kineto.KinetoFile.blank()
    with SecondHalf(parse) as half:
        while half.running():   # reaps the child when it has ended
            pass
        assert not half.running() and half.pid == 0
        tables = list(half.tables(info, Counter()))   # no second wait for the reaped child
    assert [t["t"].column("x").to_pylist() for t in tables] == [[7]] and info.n_events == 1
