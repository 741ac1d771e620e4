"""A big file's events parsed by this process and a forked child, from either end
(diag/ingest/forked.py): the store ends up exactly as if one process had read the file, whether
the segments' boundaries are between events, fall inside a string, or the child fails."""

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
from diag.ingest import kineto, source
from diag.ingest.forked import Claims, SecondHalf
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
def test_a_mapped_file_whose_pages_are_handed_back_splits_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past source.IN_MEMORY_BYTES a file is read into an anonymous map and each process hands
    back the pages it is done with, the child those of the segments this process has claimed
    too (lowered here so that real traces go that way): the same rows."""
    monkeypatch.setattr(source, "IN_MEMORY_BYTES", 4096)
    for p in kineto_traces()[:4]:
        assert snapshot(p, split=True) == snapshot(p, split=False), p


@pytest.mark.usefixtures("split_everything")
@pytest.mark.parametrize(("tail", "forks"), [
    ("", 1),                                                        # where they seem: forked once
    (', "deviceProperties": [{"id": 0}, {"id": 1}]', 2),            # an array after them: forked again
])
def test_the_child_forked_before_the_check_is_kept_only_where_the_events_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: str, forks: int) -> None:
    """kineto.begin forks the child at where the events seem to be (the first "traceEvents" key,
    the document's last `]`), then checks the whole document: a child whose segments do not span
    the events is closed and one forked where they are. The rows are a single process's."""
    spans: list[tuple[int, int]] = []
    fork = kineto._fork_back

    def counted(path: str, mv: memoryview, pos: int, end: int, *rest: Any) -> Any:
        spans.append((pos, end))
        return fork(path, mv, pos, end, *rest)

    monkeypatch.setattr(kineto, "_fork_back", counted)
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
               "args": {"External id": i}} for i in range(200)]
    f = tmp_path / "rank-0.json"
    f.write_text('{"distributedInfo": {"rank": 0}, "traceEvents": ' + json.dumps(events) + tail + "}")
    got = snapshot(f, split=True)
    assert len(spans) == forks and got == snapshot(f, split=False)
    data = f.read_bytes()
    assert spans[-1] == (data.index(b"[{") + 1, data.index(b"}]") + 1)   # the events' own span


@pytest.mark.usefixtures("split_everything")
def test_a_salvaged_files_events_are_split_in_the_salvaged_copy(tmp_path: Path) -> None:
    """--salvage of a file cut short: the events are read from a copy of its complete part, where
    they seem not to be in the file itself (it has no last `]`): the child is forked on the copy."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
               "args": {"External id": i}} for i in range(200)]
    text = json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events})
    f = tmp_path / "rank-0.json"
    f.write_text(text[: len(text) * 3 // 4])

    def rows(jobs: int | None) -> list[Any]:
        con = store.connect(None)
        r = ingest([str(f)], con, IngestOptions(jobs=jobs, rank=0, salvage=True))
        assert not r.errors, [e.one_line() for e in r.errors]
        out = [con.execute(f"SELECT * EXCLUDE (file_id) FROM {t} ORDER BY ALL").fetchall() for t in TABLES]
        con.close()
        return out

    split, alone = rows(None), rows(1)
    assert split == alone and 100 < len(split[0]) < 200


def string_of_boundaries(tmp_path: Path) -> Path:
    """40 events, the 21st named with ~28 kB of `"}, {"ph": "X"`: event boundaries, to the regex that
    cuts segments, inside a string."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
               "args": {"External id": i}} for i in range(40)]
    events[20]["name"] = '"}, {"ph": "X"' * 2000
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    return f


@pytest.mark.usefixtures("split_everything")
@pytest.mark.parametrize("mine", [0, 1, 16, 31, 32])
def test_segments_ending_inside_a_string_are_read_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          mine: int) -> None:
    """Of the 32 segments, this process claims the first `mine`, the child the rest (the child's
    Claims.back is the real one). Segment boundaries fall inside the long name: where they end
    this process's part, it stops the child and reads on; where they are the child's, the child
    fails and this process reads its part. Either way every event once, as one process reads them."""
    made = Claims.__init__

    def scripted(self: Claims, n: int, where: str | None = None) -> None:
        made(self, n, where)
        self.script = iter(range(min(mine, n))), iter(range(n - 1, min(mine, n) - 1, -1))   # type: ignore[attr-defined]

    monkeypatch.setattr(Claims, "__init__", scripted)
    monkeypatch.setattr(Claims, "front", lambda self: next(self.script[0], None))
    monkeypatch.setattr(Claims, "back", lambda self: next(self.script[1], None))
    paths: list[str] = []
    tables, cancel = SecondHalf.tables, SecondHalf.cancel

    def spied_tables(self: SecondHalf, info: kineto.KinetoFile, bad: Counter[str], fallback: Any) -> Any:
        def read_here(i: kineto.KinetoFile, b: Counter[str]) -> Any:
            paths.append("read here")
            return fallback(i, b)

        return tables(self, info, bad, read_here)

    def spied_cancel(self: SecondHalf) -> None:
        if self.pid:   # a child still running, not the no-op on leaving the block
            paths.append("stopped")
        cancel(self)

    monkeypatch.setattr(SecondHalf, "tables", spied_tables)
    monkeypatch.setattr(SecondHalf, "cancel", spied_cancel)
    f = string_of_boundaries(tmp_path)
    got = snapshot(f, split=True)
    assert got == snapshot(f, split=False)
    assert len(got["cpu_ops"]) == 40
    # The long name spans segments ~11 to ~20: the child's (it fails), this process's last (it
    # stops the child), or this process's only (the child's part is clean).
    assert paths == {0: ["read here"], 1: ["read here"], 16: ["stopped"], 31: [], 32: []}[mine]


def test_two_processes_claim_every_segment_once() -> None:
    claims, (r, w) = Claims(500), os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: its claims, from the back, as JSON on the pipe
        theirs = []
        while (i := claims.back()) is not None:
            theirs.append(i)
        os.write(w, json.dumps(theirs).encode())
        os._exit(0)
    os.close(w)
    mine = []
    while (i := claims.front()) is not None:
        mine.append(i)
    with os.fdopen(r) as f:
        theirs = json.loads(f.read())
    os.waitpid(pid, 0)
    claims.close()
    # This process's from 0 up, the child's from 499 down, meeting in between: each segment once.
    assert mine == list(range(len(mine))) and theirs == list(range(499, len(mine) - 1, -1))


def test_a_failed_child_leaves_its_part_to_this_process() -> None:
    def work(bad: Counter[str]) -> Iterator[tuple[int, kineto.KinetoFile, dict[str, pa.Table]]]:
        raise RuntimeError("the child fails")
        yield

    def fallback(info: kineto.KinetoFile, bad: Counter[str]) -> Iterator[dict[str, pa.Table]]:
        info.n_events += 3
        yield {"t": pa.table({"x": [1, 2, 3]})}

    info = kineto.KinetoFile.blank()
    with SecondHalf(work) as half:
        tables = list(half.tables(info, Counter(), fallback))
    assert [t["t"].column("x").to_pylist() for t in tables] == [[1, 2, 3]] and info.n_events == 3
    assert half.files.tables.closed and half.files.counts.closed   # unlinked files: nothing left on disk


def test_the_childs_tables_and_counts_come_back_in_file_order_a_table_at_a_time() -> None:
    """The child parses segments 2, 1, 0 (from the back), segment 1 in two chunks: its tables come
    back in file order, each table whole, and its segments' counts are added in file order (the
    first GPU device is the first segment's that has one)."""
    def work(bad: Counter[str]) -> Iterator[tuple[int, kineto.KinetoFile, dict[str, pa.Table]]]:
        for segment, chunks in ((2, [[5]]), (1, [[3], [4]]), (0, [[1, 2]])):
            counts = kineto.KinetoFile.blank()
            counts.kernel_devices = [segment]
            for x in chunks:
                counts.n_events += len(x)
                bad["typed"] += 1
                yield segment, counts, {"a": pa.table({"x": x}), "b": pa.table({"y": [str(v) for v in x]}),
                                        "empty": pa.table({"z": pa.array([], pa.int8())})}

    info, bad = kineto.KinetoFile.blank(), Counter[str]()
    with SecondHalf(work) as half:
        tables = list(half.tables(info, bad, lambda i, b: iter(())))
    # Each table once, whole (so that the store inserts it in one statement), its rows in order.
    assert [list(t) for t in tables] == [["a"], ["b"]]
    assert tables[0]["a"].column("x").to_pylist() == [1, 2, 3, 4, 5]
    assert tables[1]["b"].column("y").to_pylist() == ["1", "2", "3", "4", "5"]
    assert info.n_events == 5 and bad == {"typed": 4} and info.kernel_devices == [0]


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
        # This process's chunks, the flush, then the child's, a table at a time.
        assert mine is None or set(calls[mine + 1:]) <= {"tables"}


def test_a_child_found_ended_is_reaped_once_and_its_tables_still_come_back() -> None:
    def work(bad: Counter[str]) -> Iterator[tuple[int, kineto.KinetoFile, dict[str, pa.Table]]]:
        counts = kineto.KinetoFile.blank()
        counts.n_events += 1
        yield 0, counts, {"t": pa.table({"x": [7]})}

    info = kineto.KinetoFile.blank()
    with SecondHalf(work) as half:
        while half.running():   # reaps the child when it has ended
            pass
        assert not half.running() and half.pid == 0
        tables = list(half.tables(info, Counter(), lambda i, b: iter(())))   # no second wait for the reaped child
    assert [t["t"].column("x").to_pylist() for t in tables] == [[7]] and info.n_events == 1
