"""Scale: the map steps (parse, analysis) on local processes and on Ray give the same report,
field by field, as the analysis in one process; map
calls keep their order; parsing works in bounded batches; the store's memory is capped and it
spills to a private directory; analysis keeps digests, not timelines, and an analysis that
re-maps only new files equals a full one. (The throughput and memory numbers are bench/scale.py's.)"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import one, run_diag

from diag.engine.run import AnalyzeOptions, analyze
from diag.ingest.kineto import read_kineto
from diag.ingest.kineto_tabulate import EVENT_TABLES
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.outputs.report import build_report
from diag.runtime import store
from diag.runtime.executor import make_executor
from diag.timeline.rank import RankTimeline
from fixtures.generate import generate

WORKERS = 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 ranks, one of them a straggler: collectives to match and waits to attribute across ranks."""
    out = tmp_path_factory.mktemp("straggler")
    generate("straggler", out, steps=2)
    return out


def _report(run_dir: Path, executor: str) -> dict[str, Any]:
    con = store.connect(None)
    result = ingest([str(run_dir)], con, IngestOptions(jobs=WORKERS, executor=executor))
    assert not result.errors, [e.one_line() for e in result.errors]
    assert len(result.ingested) == 8
    # The analysis map on the same executor: each rank exported to Parquet, mapped by a worker.
    with make_executor(executor, WORKERS) as ex:
        report = build_report(analyze(con, AnalyzeOptions(model=str(run_dir / "model.toml")), executor=ex))
    con.close()
    return report


def differences(a: Any, b: Any, path: str = "report") -> Iterator[str]:
    """Every field where two JSON-like values differ, by its path."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(a.keys() | b.keys(), key=str):
            if k not in a or k not in b:
                yield f"{path}.{k}: only in {'the first' if k in a else 'the second'}"
            else:
                yield from differences(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: {a!r} vs {b!r}"


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=WORKERS, include_dashboard=False, log_to_driver=False,
             object_store_memory=128 * 1024**2)
    yield
    ray.shutdown()


def test_ray_tasks_give_the_local_report_field_by_field(run_dir: Path, local_ray: None) -> None:
    """Parse and analysis map on local processes, on Ray tasks, and the analysis in this process:
    the same report, field by field."""
    local = _report(run_dir, "local")
    on_ray = _report(run_dir, "ray")
    assert local["findings"], "the straggler case should find something to compare"
    assert list(differences(local, on_ray)) == []
    con = store.connect(None)
    ingest([str(run_dir)], con, IngestOptions())
    in_process = build_report(analyze(con, AnalyzeOptions(model=str(run_dir / "model.toml"))))
    assert list(differences(local, in_process)) == []


def test_executor_keeps_call_order(local_ray: None) -> None:
    for kind in ("local", "ray"):
        with make_executor(kind, WORKERS) as ex:
            assert list(ex.imap(os.path.join, [("d", str(i)) for i in range(9)], in_flight=3)) == [f"d/{i}" for i in range(9)], kind


def test_unknown_executor_is_refused() -> None:
    with pytest.raises(ValueError, match="local, ray"):
        make_executor("dask")


def test_a_file_is_parsed_in_bounded_batches(run_dir: Path) -> None:
    """Memory holds one batch of events as Python objects whatever the file's size: a file of
    ~650 kB read in 64 kB batches comes in ~10 of them, none much larger than the rest."""
    path = run_dir / "rank-0.json"
    data = path.read_bytes()
    chunk = 64 * 1024
    info, batches = read_kineto(str(path), data, chunk_bytes=chunk)
    rows = [sum(b[t].num_rows for t in EVENT_TABLES) for b in batches]
    assert len(rows) >= len(data) // chunk - 1
    assert sum(rows) == info.n_events
    assert max(rows) <= 2 * info.n_events / len(rows)


def test_store_memory_is_capped_and_spills_to_a_private_directory(tmp_path: Path) -> None:
    con = store.connect(None)
    limit, temp = one(con, "SELECT current_setting('memory_limit'), current_setting('temp_directory')")
    assert os.path.isabs(temp) and Path(temp).parent != Path.cwd(), temp
    assert store.MEMORY_LIMIT_BYTES <= 1024**3
    # An in-memory store holds the whole run; a file store's blocks are compressed and evictable.
    assert limit == f"{store.MEMORY_STORE_LIMIT_BYTES // 1024**2}.0 MiB" and store.MEMORY_STORE_LIMIT_BYTES <= 512 * 1024**2, limit
    con.close()
    con = store.connect(tmp_path / "x.duckdb")
    assert one(con, "SELECT current_setting('temp_directory')") == (str(tmp_path / "x.duckdb.tmp"),)
    con.close()


def test_cli_workers_spill_where_told_and_clean_up(run_dir: Path, tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    res = run_diag("ingest", str(run_dir), "--db", str(tmp_path / "x.duckdb"), "--jobs", "2",
                   "--executor", "local", "--spill-dir", str(spill))
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 8
    assert spill.is_dir() and not any(spill.iterdir())


def test_analysis_keeps_no_timeline_and_a_warm_cache_equals_a_full_run(run_dir: Path, tmp_path: Path) -> None:
    """Live mode's path: half the ranks analyzed, then the rest ingested and analyzed with the
    digests of the first half kept. Report and tables equal a cold analysis of all of them, and
    no rank's timeline outlives the map step (memory does not grow with the ranks)."""
    opts = AnalyzeOptions(model=str(run_dir / "model.toml"))
    files = sorted(run_dir.glob("rank-*.json"))
    first, later = tmp_path / "first", tmp_path / "later"
    first.mkdir()
    later.mkdir()
    for f in files[:4]:
        shutil.copy(f, first)
    for f in files[4:]:
        shutil.copy(f, later)

    def tables(con: Any) -> dict[str, Any]:
        return {t: con.execute(f"SELECT count(*), count(DISTINCT file_id) FROM {t}").fetchall()
                for t in ("steps", "activities", "gpu_segments", "gpu_states", "collectives")}

    warm = store.connect(None)
    cache: dict[int, Any] = {}
    ingest([str(first)], warm, IngestOptions())
    analyze(warm, opts, cache)
    assert len(cache) == 4
    ingest([str(later)], warm, IngestOptions())
    warm_report = build_report(analyze(warm, opts, cache))
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is RankTimeline]
    # A digest is plain data: it can cross to another process (an executor's task) and back.
    assert list(differences(build_report(analyze(warm, opts, pickle.loads(pickle.dumps(cache)))), warm_report)) == []

    cold = store.connect(None)
    ingest([str(run_dir)], cold, IngestOptions())
    cold_report = build_report(analyze(cold, opts))
    assert cold_report["findings"]
    assert list(differences(cold_report, warm_report)) == []
    assert tables(warm) == tables(cold)
