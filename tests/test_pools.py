"""Many small files go through pools of local workers (issue 16): ingest parses them ahead in
batches (pipeline._parse_ahead), analyze maps them in batches (engine._map_pool, rank_map.py).
Either way the store, the outcomes and the report are those of one process (`--jobs 1`), file by
file and in order, hostile and duplicate files among them. The thresholds are lowered here so
that a few files take the pools' path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from diag.api import analyze_opened
from diag.engine import run as engine
from diag.engine.run import AnalyzeOptions
from diag.ingest import pipeline
from diag.ingest.options import IngestOptions, IngestResult
from diag.ingest.pipeline import ingest
from diag.runtime import store
from diag.runtime.executor import LocalExecutor
from fixtures.generate import generate

# Columns that differ between two ingests of the same files: when, and the numbering.
_NOT_COMPARED = {"ingested_at", "file_id"}


class _Counted(LocalExecutor):
    made = 0

    def __init__(self, workers: int | None = None) -> None:
        type(self).made += 1
        super().__init__(workers)


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> type[_Counted]:
    """Pools for 3 files or more, on 2 workers whatever this machine's cores."""
    _Counted.made = 0
    monkeypatch.setattr(pipeline, "POOL_FILES", 3)
    monkeypatch.setattr(pipeline, "POOL_MEAN_BYTES", 1 << 30)   # the generated ranks are not 20 kernels
    monkeypatch.setattr(engine, "POOL_MEAN_EVENTS", 1 << 30)
    monkeypatch.setattr(pipeline, "_POOL_BATCH", 2)   # several batches, one of them partial
    monkeypatch.setattr(pipeline, "LocalExecutor", _Counted)
    monkeypatch.setattr(engine, "POOL_FILES", 3)
    monkeypatch.setattr(engine, "LocalExecutor", _Counted)
    monkeypatch.setattr("diag.engine.rank_map.BATCH_FILES", 2)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    return _Counted


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five small rank files, with a copy of one (same content), a file that is not JSON, an
    empty one, and a second file of rank 2 over the same window (a clash) among them."""
    d = tmp_path_factory.mktemp("pools")
    generate("healthy", d, steps=2, world_size=5)
    ranks = sorted(d.glob("*rank*"))
    shutil.copy(ranks[1], d / "copy_of_rank1.json")
    (d / "garbage.json").write_text('{"traceEvents": [{"ph": "X", "ts": ')
    (d / "empty.json").write_text("")
    clash = json.loads(ranks[2].read_text())
    clash["traceEvents"][0]["name"] = "changed"
    (d / "zz_clash.json").write_text(json.dumps(clash))
    return d


def _ingest(path: Path, jobs: int | None) -> tuple[Any, IngestResult]:
    con = store.connect(None)
    return con, ingest([str(path)], con, IngestOptions(jobs=jobs))


def _outcomes(r: IngestResult) -> tuple[Any, ...]:
    return (r.ingested, sorted((s.path, s.reason) for s in r.skipped), [e.one_line() for e in r.errors],
            r.warnings)


def _rows(con: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, each with its file's path in place of its file id."""
    path = dict(con.execute("SELECT file_id, path FROM trace_files").fetchall())
    out = {}
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall():
        cols = [c for (c,) in con.execute(f"SELECT column_name FROM duckdb_columns() WHERE table_name = '{table}' "
                                          "ORDER BY column_index").fetchall()]
        keep = [c for c in cols if c not in _NOT_COMPARED]
        select = ", ".join([f'"{c}"' for c in keep] + (["file_id"] if "file_id" in cols else []))
        rows = con.execute(f'SELECT {select} FROM "{table}"').fetchall()
        if "file_id" in cols:
            rows = [(*r[:-1], path.get(r[-1])) for r in rows]
        out[table] = sorted(rows, key=repr)
    return out


def test_ingest_pool_gives_what_one_process_gives(run_dir: Path, pools: type[_Counted]) -> None:
    con, pooled = _ingest(run_dir, None)
    assert pools.made == 1
    alone_con, alone = _ingest(run_dir, 1)
    assert pools.made == 1   # --jobs 1: no pool
    assert _outcomes(pooled) == _outcomes(alone)
    assert len(pooled.ingested) == 5 and len(pooled.errors) == 3 and len(pooled.skipped) == 1, _outcomes(pooled)
    assert _rows(con) == _rows(alone_con)


def test_analyze_pool_gives_the_report_of_one_process(run_dir: Path, pools: type[_Counted]) -> None:
    con, _ = _ingest(run_dir, 1)
    _, pooled = analyze_opened(con, AnalyzeOptions())
    assert pools.made == 1
    pooled_rows = _rows(con)
    _, alone = analyze_opened(con, AnalyzeOptions(), jobs=1)
    assert pools.made == 1
    assert json.dumps(pooled, sort_keys=True) == json.dumps(alone, sort_keys=True)
    assert pooled_rows == _rows(con)


def test_parse_batches_stop_at_their_bytes_as_at_their_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool's batch of small files comes back whole and 2 × workers are in flight: 128 files of
    0.9 MB a batch held ~1 GB in the parent (issue 41), so a batch also stops at _POOL_BATCH_BYTES
    of JSON, a gzipped file counted _GZIP_RATIO times its size; files of a few kB go _POOL_BATCH at
    a time, as before."""
    monkeypatch.setattr(pipeline, "_POOL_BATCH", 3)
    monkeypatch.setattr(pipeline, "_POOL_BATCH_BYTES", 1000)
    sizes = {"a.json": 400, "b.json": 400, "c.json": 400, "d.json.gz": 30, "e.json": 10, "f.json": 10, "g.json": 10,
             "h.json": 10}
    for name, n in sizes.items():
        (tmp_path / name).write_bytes(b"x" * n)
    paths = [str(tmp_path / n) for n in sizes]
    # a+b = 800, +c would be 1200; c + d (30 × 20 = 600) = 1000; e f g: three files; h.
    assert [[Path(p).name for p in b] for b in pipeline._pool_batches(paths)] == \
        [["a.json", "b.json"], ["c.json", "d.json.gz"], ["e.json", "f.json", "g.json"], ["h.json"]]
