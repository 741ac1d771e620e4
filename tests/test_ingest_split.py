"""A big file's events parsed by this process and a forked child, each claiming segments in file
order (diag/ingest/forked.py): the store ends up exactly as if one process had read the file,
whether the segments' boundaries are between events, fall inside a string, or the child fails."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import kineto_traces

from diag.ingest import kineto, kineto_split, kineto_tabulate, source
from diag.ingest.forked import Claims, Part, SecondHalf
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.runtime import store

TABLES = (*kineto_tabulate.EVENT_TABLES, "collective_args")


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
    monkeypatch.setattr(kineto_split, "SPLIT_BYTES", 1)


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
    fork = kineto_split._fork_back

    def counted(path: str, mv: memoryview, pos: int, end: int, *rest: Any) -> Any:
        spans.append((pos, end))
        return fork(path, mv, pos, end, *rest)

    monkeypatch.setattr(kineto_split, "_fork_back", counted)
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


def scripted_claims(monkeypatch: pytest.MonkeyPatch, mine: Callable[[int], bool]) -> None:
    """Claims handing this process the segments `mine` says are its own, the child the others,
    each in file order (each process walks its own copy of the script)."""
    made = Claims.__init__

    def scripted(self: Claims, n: int, where: str | None = None) -> None:
        made(self, n, where)
        ours, theirs = [i for i in range(n) if mine(i)], [i for i in range(n) if not mine(i)]
        self.script = os.getpid(), iter(ours), iter(theirs)   # type: ignore[attr-defined]

    def claim(self: Claims) -> int | None:
        parent, ours, theirs = self.script   # type: ignore[attr-defined]
        return next(ours if os.getpid() == parent else theirs, None)

    monkeypatch.setattr(Claims, "__init__", scripted)
    monkeypatch.setattr(Claims, "claim", claim)


@pytest.mark.usefixtures("split_everything")
@pytest.mark.parametrize("pattern", ["first 0", "first 1", "first 16", "first 32", "even"])
def test_segments_ending_inside_a_string_are_read_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          pattern: str) -> None:
    """Of the 32 segments, this process claims those the pattern names, the child the others.
    Segment boundaries fall inside the long name: the part ending there stops short of it, and
    the next parts, whoever parsed them, are not taken (begun where no part ended): this process
    reads on from where that part ended, in its turn. Every event once, as one process reads them."""
    kind, _, n = pattern.partition(" ")
    scripted_claims(monkeypatch, (lambda i: i % 2 == 0) if kind == "even" else (lambda i: i < int(n)))
    calls: Counter[str] = Counter()
    parse, read = kineto_split._part, kineto_split._range

    def spied_part(*args: Any) -> Any:
        calls["part"] += 1
        return parse(*args)

    def spied_range(*args: Any) -> Any:
        calls["range"] += 1
        return (yield from read(*args))

    monkeypatch.setattr(kineto_split, "_part", spied_part)
    monkeypatch.setattr(kineto_split, "_range", spied_range)
    f = string_of_boundaries(tmp_path)
    got = snapshot(f, split=True)
    assert got == snapshot(f, split=False)
    assert len(got["cpu_ops"]) == 40
    # In this process, each part parsed ahead reads once; the rest are reads in a segment's turn.
    assert calls["range"] - calls["part"] >= 1


def test_two_processes_claim_every_segment_once() -> None:
    claims, (r, w) = Claims(500), os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: its claims, as JSON on the pipe
        theirs = []
        while (i := claims.claim()) is not None:
            theirs.append(i)
        os.write(w, json.dumps(theirs).encode())
        os._exit(0)
    os.close(w)
    mine = []
    while (i := claims.claim()) is not None:
        mine.append(i)
    with os.fdopen(r) as f:
        theirs = json.loads(f.read())
    os.waitpid(pid, 0)
    claims.close()
    # Each process's in file order; together, each segment once.
    assert mine == sorted(mine) and theirs == sorted(theirs) and sorted(mine + theirs) == list(range(500))


def _part(*xs: int, bad: int = 0) -> Part:
    counts = kineto_tabulate.KinetoFile.blank()
    counts.n_events = len(xs)
    counts.kernel_devices = [xs[0]]
    chunks = [{"a": pa.table({"x": [x]}), "b": pa.table({"y": [str(x)]}), "empty": pa.table({"z": pa.array([], pa.int8())})}
              for x in xs]
    return Part(100 + xs[-1], counts.counts(), Counter({"typed": bad}), chunks)


def test_the_childs_parts_come_back_whole_with_their_counts() -> None:
    """The child parses segment 0 in two chunks, cannot parse segment 1, parses segment 2: each
    part comes back with each table whole (so that the store inserts it in one statement), its
    rows in the order written, where its parse ended and its counts; the unparsable one as None."""
    parts = {0: _part(1, 2, bad=2), 2: _part(5)}
    with closing(Claims(3)) as claims, SecondHalf(claims, parts.get) as half:
        got = [half.part(i) for i in range(3)]
    assert got[1] is None and got[0] is not None and got[2] is not None
    assert [list(t) for t in got[0].tables] == [["a", "b"]]
    assert got[0].tables[0]["a"].column("x").to_pylist() == [1, 2]
    assert got[0].tables[0]["b"].column("y").to_pylist() == ["1", "2"]
    assert (got[0].end, got[0].counts, got[0].bad) == (102, parts[0].counts, Counter({"typed": 2}))
    assert got[2].tables[0]["a"].column("x").to_pylist() == [5] and got[2].counts["kernel_devices"] == [5]
    assert half.files.tables.closed   # an unlinked file: nothing left on disk


def test_a_failed_child_leaves_its_parts_to_this_process() -> None:
    """The child fails (killed, or an error that is not the file's): every part it has not said
    done is None, without waiting, and this process parses it."""
    def work(i: int) -> Part | None:
        if i == 1:
            raise RuntimeError("the child fails")
        return _part(i + 1)

    with closing(Claims(3)) as claims, SecondHalf(claims, work) as half:
        got = [half.part(i) for i in range(3)]
        assert half.part(7) is None   # said nothing of it, and ended: not waited for
    assert got[0] is not None and got[1] is None and got[2] is None


@pytest.mark.usefixtures("split_everything")
@pytest.mark.parametrize("theirs", [True, False])
def test_this_process_writes_its_rows_while_it_waits_for_the_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   theirs: bool) -> None:
    """Waiting for the child's part, this process writes what it holds rather than wait idle; with
    every segment its own, it never waits (one INSERT a table, not one a segment). The file
    reads alike."""
    scripted_claims(monkeypatch, lambda i: not theirs)
    monkeypatch.setattr(SecondHalf, "ready", lambda self, i: False)   # never done before it is asked for
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
               "args": {"External id": i}} for i in range(400)]
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    calls: list[str] = []
    info, chunks = kineto.read_kineto(str(f), f.read_bytes(), chunk_bytes=2000, split=True,
                                      while_waiting=partial(calls.append, "flush"))
    ops: list[str] = []
    for t in chunks:
        calls.append("tables")
        ops += t["cpu_ops"].column("name").to_pylist() if "cpu_ops" in t else []
    assert ops == [e["name"] for e in events] and info.n_events == 400
    # Each of the child's parts (a table each) is waited for, the rows held written first.
    segments = calls.count("tables") if theirs else 0
    assert calls.count("flush") == segments and (not theirs or calls == ["flush", "tables"] * segments)
    assert segments == 0 or segments > kineto_split.SEGMENTS // 2
