"""Timelines read ahead (timeline.load_ranks, which analyze maps through engine.map_ranks): the
same timelines as one file at a time, in order, and the same digests and rows as the local pool's
map; the second connection and the reading thread end with the iteration, also when it is left
early."""

from __future__ import annotations

import dataclasses
import pickle
import threading
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from diag.attribution.tables import combined
from diag.engine import rank_map
from diag.engine.map_step import map_ranks
from diag.engine.rank_map import map_elsewhere
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.runtime import store
from diag.runtime.executor import LocalExecutor
from diag.timeline.rank import load_rank, load_ranks, rank_files
from fixtures.generate import generate
from rules import RULES


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d: Path = tmp_path_factory.mktemp("healthy")
    generate("healthy", d, steps=2, world_size=4)
    c = store.connect(None)
    result = ingest([str(d)], c, IngestOptions(jobs=1))
    assert len(result.ingested) == 4, [e.one_line() for e in result.errors]
    return c


def assert_same(a: Any, b: Any, path: str) -> None:
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), path
    elif isinstance(a, pa.Table):
        assert a.equals(b), path
    elif dataclasses.is_dataclass(a) or isinstance(a, msgspec.Struct):
        names = [f.name for f in (dataclasses.fields(a) if dataclasses.is_dataclass(a) else msgspec.structs.fields(a))]
        for name in names:
            assert_same(getattr(a, name), getattr(b, name), f"{path}.{name}")
    elif isinstance(a, tuple):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_read_ahead_gives_the_timelines_of_one_file_at_a_time(con: Any) -> None:
    files = rank_files(con)
    ahead = list(load_ranks(con, files))
    assert [tl.file_id for tl in ahead] == files
    for tl in ahead:
        alone = load_rank(con, tl.file_id)
        assert_same(tl, alone, f"file {tl.file_id}")
        for column in ("source", "name", "stream", "correlation", "launch_ts_ns", "launch_end_ns", "launch_tid"):
            assert getattr(tl, column) == getattr(alone, column) and len(getattr(tl, column)) == len(tl), column
    assert "kernel" in ahead[0].source and ahead[0].kclass.dtype == object


def test_pool_map_equals_map_in_process(con: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local pool's map (rank_map: batches exported to Parquet, mapped in spawned workers)
    gives each file the digest and rows this process gives it, in order across batches."""
    rules = [r() for r in RULES]
    files = rank_files(con)
    monkeypatch.setattr(rank_map, "BATCH_FILES", 3)   # 4 files: batches of 3 and 1
    with LocalExecutor(2) as pool:
        batches = list(map_elsewhere(con, files, None, pool, None))
    assert [len(digests) for digests, _ in batches] == [3, 1]
    here = list(map_ranks(con, files, rules, None))
    there = [d for digests, _ in batches for d in digests]
    for f, (digest, _), one in zip(files, here, there, strict=True):
        assert digest.file_id == one.file_id == f
        assert pickle.dumps(pickle.loads(pickle.dumps(digest))) == pickle.dumps(one)   # as sent back
    rows_here = combined([rows for _, rows in here])
    rows_there = combined([rows for _, batch in batches for rows in batch])
    assert rows_here.keys() == rows_there.keys()
    for table, data in rows_here.items():
        assert data.equals(rows_there[table]), table


def test_leaving_early_ends_the_reading_thread(con: Any) -> None:
    files = rank_files(con)
    before = set(threading.enumerate())
    timelines = load_ranks(con, files)
    assert next(timelines).file_id == files[0]
    assert [t for t in set(threading.enumerate()) - before if t.name.startswith("diag-read")]
    timelines.close()
    assert not set(threading.enumerate()) - before
    assert list(load_ranks(con, [])) == []
    assert con.execute("SELECT count(*) FROM kernels").fetchall()[0][0] > 0
