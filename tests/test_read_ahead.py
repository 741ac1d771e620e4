"""A command's file read ahead in a forked process, or a thread for a big file
(diag/ingest/read_ahead.py), is the same read as read_source's, and anything but a clean read of
the same file with the same options is read again the usual way: the same bytes, hash and errors
either way. Its parse begun ahead (read_ahead.begin) is the same parse."""

from __future__ import annotations

import gzip
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, kineto_traces, run_diag, shared_traces
from test_ingest_split import snapshot

from diag.ingest import kineto, kineto_split, read_ahead, source
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.ingest.source import DEFAULT_MAX_BYTES, SourceBytes, read_source
from diag.runtime import store
from diag.runtime.errors import BadInput
from fixtures.generate import generate


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One generated rank file, plain JSON."""
    out = tmp_path_factory.mktemp("ahead")
    generate("healthy", out, world_size=1)
    return next(out.rglob("*.json"))


def _ahead(path: Path, max_bytes: int = DEFAULT_MAX_BYTES, salvage: bool = False) -> SourceBytes | None:
    read_ahead.start(str(path), max_bytes, salvage)
    taken = read_ahead.take(str(path), max_bytes, salvage)
    assert taken is None or taken[1] is None   # nothing begun: only the read
    return None if taken is None else taken[0]


@pytest.mark.parametrize("compressed", [False, True])
def test_a_read_ahead_is_the_read(trace: Path, tmp_path: Path, compressed: bool) -> None:
    path = trace
    if compressed:
        path = tmp_path / "rank.json.gz"
        path.write_bytes(gzip.compress(trace.read_bytes()))
    got = _ahead(path)
    want = read_source(path)
    assert got is not None and isinstance(got.data, mmap.mmap)
    assert (bytes(got.data), got.content_hash, got.compressed) == (bytes(want.data), want.content_hash, want.compressed)
    assert not read_ahead._pending


def test_the_same_file_by_another_name_is_taken(trace: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(trace)
    read_ahead.start(str(link), DEFAULT_MAX_BYTES, False)
    got = read_ahead.take(str(trace.parent / ".." / trace.parent.name / trace.name), DEFAULT_MAX_BYTES, False)
    assert got is not None and got[0].content_hash == read_source(trace).content_hash


def test_other_options_are_read_again(trace: Path) -> None:
    read_ahead.start(str(trace), DEFAULT_MAX_BYTES, False)
    assert read_ahead.take(str(trace), DEFAULT_MAX_BYTES, True) is None
    assert not read_ahead._pending   # the reader is waited for either way


def test_a_file_changed_after_the_read_began_is_read_again(trace: Path, tmp_path: Path) -> None:
    path = tmp_path / "growing.json"
    path.write_bytes(trace.read_bytes())
    read_ahead.start(str(path), DEFAULT_MAX_BYTES, False)
    with path.open("ab") as f:
        f.write(b"\n")
    assert read_ahead.take(str(path), DEFAULT_MAX_BYTES, False) is None


def test_gzip_whose_trailer_does_not_give_the_size_is_read_again(trace: Path, tmp_path: Path) -> None:
    # Two members: the last one's ISIZE is not the content's size.
    data = trace.read_bytes()
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(data[:1000]) + gzip.compress(data[1000:]))
    assert _ahead(path) is None
    assert read_source(path).data == data


def test_damage_is_said_as_without_a_read_ahead(trace: Path, tmp_path: Path) -> None:
    packed = gzip.compress(trace.read_bytes())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(packed[: len(packed) // 2] + packed[-8:])   # cut short, trailer kept
    assert _ahead(path) is None
    with pytest.raises(BadInput) as e:
        read_source(path)
    assert _ahead(path, salvage=True) is None   # salvaged: a warning, so read again to say it
    assert read_source(path, salvage=True).warnings
    assert "gzip" in e.value.reason


def test_what_is_not_read_ahead(trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import duckdb

    store = tmp_path / "store.duckdb"
    duckdb.connect(str(store)).close()
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    for path in (store, empty, tmp_path, tmp_path / "missing.json"):
        read_ahead.start(str(path), DEFAULT_MAX_BYTES, False)
    read_ahead.start(str(trace), os.path.getsize(trace) - 1, False)   # over --max-bytes
    assert not read_ahead._pending


@pytest.mark.parametrize("compressed", [False, True])
def test_a_big_file_is_read_ahead_by_a_thread_into_memory_it_can_hand_back(
        trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compressed: bool) -> None:
    """Past IN_MEMORY_BYTES (lowered here) a file is read by a thread, not shared with a reader
    process: the same bytes and hash as read_source's, in this process's private memory, whose
    parsed pages SourceBytes.release hands back (they then read as zeros, as without a read ahead)."""
    monkeypatch.setattr(read_ahead, "IN_MEMORY_BYTES", 4096)
    monkeypatch.setattr(source, "IN_MEMORY_BYTES", 4096)
    path = trace
    if compressed:
        path = tmp_path / "rank.json.gz"
        path.write_bytes(gzip.compress(trace.read_bytes()))
    read_ahead.start(str(path), DEFAULT_MAX_BYTES, False)
    assert isinstance(read_ahead._pending[os.path.realpath(path)], read_ahead._Thread)
    got, want = _ahead(path), read_source(path)
    assert got is not None and isinstance(got.data, mmap.mmap) and got.path == str(path)
    assert (bytes(got.data), got.content_hash, got.compressed) == (bytes(want.data), want.content_hash, want.compressed)
    got.release(0, 2 * mmap.PAGESIZE)
    assert bytes(got.data[: mmap.PAGESIZE]) == bytes(mmap.PAGESIZE)


def test_a_big_file_that_cannot_be_read_cleanly_is_read_again(trace: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread's read of a big file fails quietly (a damaged gzip) or is not taken (the file
    changed since): read again the usual way, which says what is wrong."""
    monkeypatch.setattr(read_ahead, "IN_MEMORY_BYTES", 4096)
    packed = gzip.compress(trace.read_bytes())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(packed[: len(packed) // 2] + packed[-8:])
    assert _ahead(cut) is None and _ahead(cut, salvage=True) is None
    path = tmp_path / "growing.json"
    path.write_bytes(trace.read_bytes())
    read_ahead.start(str(path), DEFAULT_MAX_BYTES, False)
    with path.open("ab") as f:
        f.write(b"\n")
    assert read_ahead.take(str(path), DEFAULT_MAX_BYTES, False) is None and not read_ahead._pending


def test_the_command_reads_ahead_to_the_same_report_and_errors(trace: Path, tmp_path: Path) -> None:
    # `diag analyze FILE` reads ahead; --jobs 1 does not (one process): the same report. A damaged
    # gzip gives the same one line and exit code both ways.
    path = tmp_path / "rank.json.gz"
    path.write_bytes(gzip.compress(trace.read_bytes()))
    ahead, alone = run_diag("analyze", str(path), "--format", "json"), \
        run_diag("analyze", str(path), "--format", "json", "--jobs", "1")
    assert ahead.returncode == alone.returncode == 0 and ahead.stdout == alone.stdout
    bad = tmp_path / "bad.json.gz"
    packed = path.read_bytes()
    bad.write_bytes(packed[:40] + bytes(64) + packed[104:])
    ahead, alone = run_diag("analyze", str(bad)), run_diag("analyze", str(bad), "--jobs", "1")
    assert ahead.returncode == alone.returncode == 2
    assert ahead.stderr == alone.stderr and ahead.stderr.count("\n") == 1


def test_a_parse_begun_before_the_imports_is_the_same_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """read_ahead.begin (the command calls it before importing DuckDB and the analysis): the head
    decoded and the child forked ahead, which the ingest then takes: the same rows and file row
    as a file read and parsed with nothing ahead (SPLIT_BYTES lowered, so that real traces split)."""
    monkeypatch.setattr(kineto_split, "SPLIT_BYTES", 1)
    for p in kineto_traces()[:4]:
        read_ahead.start(str(p), DEFAULT_MAX_BYTES, False)
        read_ahead.begin(str(p), DEFAULT_MAX_BYTES, False, None, None)
        _, begun = read_ahead._begun[os.path.realpath(p)]
        assert begun is not None and begun.split is not None and begun.split.half.pid
        assert snapshot(p, split=True) == snapshot(p, split=False), p
        assert not read_ahead._begun and begun.split.half.pid == 0   # taken, and its child reaped


def test_a_parse_begun_for_a_file_not_wanted_ends_its_child(trace: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kineto_split, "SPLIT_BYTES", 1)
    con = store.connect(None)
    ingest([str(trace)], con, IngestOptions(rank=0))
    read_ahead.start(str(trace), DEFAULT_MAX_BYTES, False)
    read_ahead.begin(str(trace), DEFAULT_MAX_BYTES, False, None, None)
    _, begun = read_ahead._begun[os.path.realpath(trace)]
    assert begun is not None and begun.split is not None
    r = ingest([str(trace)], con, IngestOptions(rank=0))   # already in: skipped, before any parse
    assert [s.reason for s in r.skipped] == ["already ingested (same content)"]
    assert begun.split.half.pid == 0 and begun.split.half.files.tables.closed
    con.close()


def test_what_is_not_begun(trace: Path, tmp_path: Path) -> None:
    """Not read ahead: nothing to begin. Not a Kineto trace, one whose head does not decode (the
    read only: read_kineto then says what is wrong, the command's one line, exit 2), or one that
    merges ranks (parse_into tells them apart, as without a read ahead)."""
    read_ahead.begin(str(trace), DEFAULT_MAX_BYTES, False, None, None)
    assert not read_ahead._begun
    bad, nccl, merged = tmp_path / "bad.json", tmp_path / "nccl.json", tmp_path / "merged.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": NaN}]}')
    nccl.write_text('{"version": 1, "events": []}')
    merged.write_text(json.dumps({"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": r + 1, "tid": 0, "args": {"name": f"Rank {r}"}} for r in (0, 1)]}))
    for path in (bad, nccl, merged):
        read_ahead.start(str(path), DEFAULT_MAX_BYTES, False)
        read_ahead.begin(str(path), DEFAULT_MAX_BYTES, False, None, None)
        taken = read_ahead.take(str(path), DEFAULT_MAX_BYTES, False)
        assert taken is not None and taken[1] is None and not read_ahead._begun


def test_a_merged_files_child_is_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that merges ranks is never split, but that is looked for after the child is forked
    (the search reads the whole file): its child is then ended, and nothing is begun."""
    monkeypatch.setattr(kineto_split, "SPLIT_BYTES", 1)
    made: list[kineto.Begun] = []
    real = kineto.begin

    def begin(*args: Any, **kwargs: Any) -> kineto.Begun:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(kineto, "begin", begin)
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps({"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": r + 1, "tid": 0, "args": {"name": f"Rank {r}"}} for r in (0, 1)
    ] + [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1 + i % 2, "tid": 1, "ts": i, "dur": 1}
         for i in range(50)]}))
    read_ahead.start(str(merged), DEFAULT_MAX_BYTES, False)
    read_ahead.begin(str(merged), DEFAULT_MAX_BYTES, False, None, None)
    taken = read_ahead.take(str(merged), DEFAULT_MAX_BYTES, False)
    assert taken is not None and taken[1] is None and not read_ahead._begun
    assert len(made) == 1 and made[0].split is not None, "the child was forked first"
    assert made[0].split.half.pid == 0 and made[0].split.half.files.tables.closed


def test_the_command_begins_a_big_files_parse_to_the_same_report(tmp_path: Path) -> None:
    # The control trace (35 MB of events): split, its child forked before the analysis imports;
    # --jobs 1 reads it in one process. The same report. Bad JSON: the same one line, exit 2.
    src = shared_traces() / "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz"
    ahead, alone = run_diag("analyze", str(src), "--format", "json"), \
        run_diag("analyze", str(src), "--format", "json", "--jobs", "1")
    assert ahead.returncode == alone.returncode == 0 and ahead.stdout == alone.stdout
    # A --spill-dir not made yet (the run makes it): the child's files cannot be made ahead, and
    # the file is split once the run's directory is there.
    later = run_diag("analyze", str(src), "--format", "json", "--spill-dir", str(tmp_path / "not" / "yet"))
    assert later.returncode == 0 and later.stdout == alone.stdout, later.stderr
    bad = tmp_path / "nan.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": NaN}]}')
    ahead, alone = run_diag("analyze", str(bad)), run_diag("analyze", str(bad), "--jobs", "1")
    assert ahead.returncode == alone.returncode == 2
    assert ahead.stderr == alone.stderr and ahead.stderr.count("\n") == 1


# A process of its own, as the command's: the parse's modules imported by begin (its child forked
# there, with SPLIT_BYTES lowered), then a whole parse, each table built as the child builds them.
_PARSE_ONLY = """
import sys
from diag.runtime.no_pandas import keep_pandas_out
keep_pandas_out()
from diag.ingest import kineto, kineto_split, read_ahead
from diag.ingest.source import DEFAULT_MAX_BYTES, read_source
kineto_split.SPLIT_BYTES = 1
path = sys.argv[1]
read_ahead.start(path, DEFAULT_MAX_BYTES, False)
read_ahead.begin(path, DEFAULT_MAX_BYTES, False, None, None)
assert read_ahead._begun, "nothing begun"
before_fork = "pyarrow.compute" in sys.modules
src = read_source(path, DEFAULT_MAX_BYTES, False)
info, chunks = kineto.read_kineto(path, src.data)
assert sum(t.num_rows for c in chunks for t in c.values()) > 0
print(before_fork, "pyarrow.compute" in sys.modules)
"""


def test_the_parse_imports_no_pyarrow_compute(trace: Path) -> None:
    """pyarrow.compute costs ~35 ms to import: not on the path before the parse's child is forked
    (read_ahead.begin), nor in the parse the child runs (kineto_tabulate._extent takes the times' range in
    NumPy). The parent imports it later, with the analysis, while the child parses."""
    done = subprocess.run([sys.executable, "-c", _PARSE_ONLY, str(trace)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]
