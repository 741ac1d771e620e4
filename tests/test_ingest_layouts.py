"""How ingest tells formats, ranks, capture windows and runs apart (docs/reference.md "Ranks and captures").

Real traces from ../shared/traces, re-laid out as other tools write them: re-saved with another
key first, renamed as tensorboard_trace_handler names files, merged into one file as sglang's
merge script does, moved hours apart. The conformance suite (test_conformance_layouts.py) does
the same on captures made here, end to end through the CLI.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import load_json, run_diag, shared_traces

from diag.api import analyze_path
from diag.ingest.discover import NameParts, name_parts
from diag.ingest.merged import rank_map
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.ingest.sniff import trace_format
from diag.runtime import store
from diag.runtime.errors import BadInput
from fixtures.generate import generate
from fixtures.scenarios import Scenario

AFTER_FIX = "kineto/docs/traces/after_fix_trace.json"
TWO_RANKS = "HolisticTraceAnalysis/tests/data/trace_filter"   # sampled_rank-0/-1 of a 128-rank A100 job
NCCL_DATA = Path(__file__).parent / "data" / "nccl"


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("rank3.json", NameParts(3, None, None)),
        ("rank-3.pt.trace.json.gz", NameParts(3, None, None)),
        ("trace_rank_12.json", NameParts(12, None, None)),
        ("worker3.1733000000000000000.pt.trace.json.gz", NameParts(3, None, None)),
        ("profile_7.json", NameParts(7, None, None)),
        ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", NameParts(34, None, None)),
        # tensorboard_trace_handler's default `<hostname>_<pid>.<time_ns>`: the pid is no rank,
        # nor is a number in the hostname.
        ("node1.cluster_57.1733000000000000000.pt.trace.json", NameParts(None, "node1.cluster", 57)),
        ("job-worker-3_1234.1733000000000000000.pt.trace.json.gz", NameParts(None, "job-worker-3", 1234)),
        ("rank_3.1733000000000000000.pt.trace.json", NameParts(3, None, None)),
        ("after_fix_trace.json", NameParts(None, None, None)),
        ("benchmark_result_2869224_1695835535_trace.json.gz", NameParts(None, None, None)),
        # A number of 7 or more digits is a date, timestamp or pid, not a rank (world sizes < 10^6).
        ("trace_20240101.json", NameParts(None, None, None)),
        ("profile_1733000000.pt.trace.json.gz", NameParts(None, None, None)),
        ("trace_rank_2024010112.json", NameParts(None, None, None)),
        ("profile_999999.json", NameParts(999999, None, None)),
        ("rank123456.json", NameParts(123456, None, None)),
        # sglang: `<time.time()>-TP-<tp>[-DP-..][-PP-..][-EP-..][-<stage>]`; with DP or PP the TP rank
        # is not the rank.
        ("1764547200.5160012-TP-3.trace.json.gz", NameParts(3, None, None)),
        ("decode-1764547200.51-TP-5-EP-5-EXTEND.trace.json.gz", NameParts(5, None, None)),
        ("1764547200.51-TP-1-DP-1.trace.json.gz", NameParts(None, None, None)),
        ("1764547200.51-TP-1-PP-2.trace.json.gz", NameParts(None, None, None)),
    ],
)
def test_what_a_file_name_says(name: str, want: NameParts) -> None:
    assert name_parts(name) == want


def _resaved(doc: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"tool": "re-saved"}, **doc}


def test_a_kineto_trace_is_told_by_its_structure_wherever_traceEvents_sits() -> None:
    doc = load_json(shared_traces() / AFTER_FIX)
    last = {**{k: v for k, v in doc.items() if k != "traceEvents"}, "traceEvents": doc["traceEvents"]}
    for text in (json.dumps(_resaved(doc)), json.dumps(_resaved(doc), indent=2), json.dumps(last, indent=4)):
        assert trace_format(text.encode()).kind == "kineto"
    inspector = (NCCL_DATA / "inspector_node-017-pid1639453.json").read_bytes()
    assert trace_format(inspector).kind == "nccl_inspector"
    # An Inspector log that merely mentions traceEvents in a value is still a log.
    line = json.loads(inspector.splitlines()[0])
    line["metadata"]["note"] = '"traceEvents"'
    assert trace_format(json.dumps(line).encode() + b"\n" + inspector).kind == "nccl_inspector"


def test_a_file_that_is_both_is_read_as_kineto_and_named_in_a_warning(tmp_path: Path) -> None:
    doc = load_json(shared_traces() / AFTER_FIX)
    both = {"header": {"id": 1}, "coll_perf": {}, **doc}
    fmt = trace_format(json.dumps(both).encode())
    assert fmt.kind == "kineto" and fmt.warning is not None and "coll_perf" in fmt.warning
    path = tmp_path / "both.json"
    path.write_text(json.dumps(both))
    r = run_diag("analyze", str(path))
    assert r.returncode == 0 and f"diag: warning: {path}: ambiguous format: " in r.stderr


def test_a_pretty_printed_resave_is_no_longer_refused_as_an_inspector_log(tmp_path: Path) -> None:
    doc = load_json(shared_traces() / AFTER_FIX)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(_resaved(doc), indent=2))
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(_resaved(doc)))
    for path in (pretty, compact):
        con = store.connect(None)
        r = ingest([str(path)], con, IngestOptions(jobs=1))
        assert not r.errors and len(r.ingested) == 1
        assert con.execute("SELECT kind, rank, n_events FROM trace_files").fetchall() == \
            [("kineto", 0, len(doc["traceEvents"]))]


def _write(path: Path, doc: dict[str, Any]) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def _shifted(doc: dict[str, Any], by_us: float, pid: int | None = None) -> dict[str, Any]:
    """The same capture `by_us` later; with `pid`, as if another process (its CPU pid changed)."""
    out = copy.deepcopy(doc)
    host = max((e["pid"] for e in out["traceEvents"] if isinstance(e.get("pid"), int)), default=None)
    for e in out["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += by_us
        if pid is not None and e.get("pid") == host:
            e["pid"] = pid
    return out


def test_captures_of_one_process_are_its_windows_and_processes_are_ranks_by_pid(tmp_path: Path) -> None:
    doc = load_json(shared_traces() / AFTER_FIX)
    d = tmp_path / "run"
    d.mkdir()
    # Host b's process and host a's: a sorts first whatever the pids; then host a's three cycles.
    _write(d / "b_7.1700000000000000000.pt.trace.json.gz", doc)
    for i in range(3):
        _write(d / f"a_900.17000000000000{i}0000.pt.trace.json.gz", _shifted(doc, 20e6 * (i + 1)))
    con = store.connect(None)
    ingest([str(d)], con, IngestOptions(jobs=1))
    rows = con.execute("SELECT rank, capture_window, rank_source FROM trace_files ORDER BY rank, capture_window").fetchall()
    assert rows == [(0, 0, "process"), (0, 1, "process"), (0, 2, "process"), (1, 0, "process")]
    assert con.execute("SELECT DISTINCT f.rank = k.rank FROM kernels k JOIN trace_files f USING (file_id)").fetchall() \
        == [(True,)]
    # The next cycle, ingested later (diag live): its process's rank, the next window.
    later = _write(tmp_path / "a_900.1700000000000900000.pt.trace.json.gz", _shifted(doc, 90e6))
    ingest([str(later)], con, IngestOptions(jobs=1))
    assert con.execute("SELECT rank, capture_window FROM trace_files WHERE path = ?", [str(later)]).fetchall() == \
        [(0, 3)]


def test_unrelated_runs_in_one_folder_are_refused_naming_them(tmp_path: Path) -> None:
    doc = load_json(shared_traces() / AFTER_FIX)
    hours = tmp_path / "hours"
    hours.mkdir()
    _write(hours / "rank0.json.gz", doc)
    _write(hours / "rank1.json.gz", _shifted(doc, 5 * 3600e6, pid=4321))   # another process, 5 h later
    worlds = tmp_path / "worlds"
    worlds.mkdir()
    for rank, world in ((0, 8), (1, 16)):
        _write(worlds / f"rank{rank}.json.gz", dict(doc, distributedInfo={"rank": rank, "world_size": world}))
    for folder, says in ((hours, "run 2: 1 file(s): rank1.json.gz"), (worlds, "world size 16")):
        r = run_diag("analyze", str(folder))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "2 unrelated runs" in r.stderr and "run 1: 1 file(s): rank0.json.gz" in r.stderr and says in r.stderr


def test_one_process_captured_hours_apart_is_one_run(tmp_path: Path) -> None:
    doc = load_json(shared_traces() / AFTER_FIX)
    _write(tmp_path / "a.json.gz", doc)
    _write(tmp_path / "b.json.gz", _shifted(doc, 5 * 3600e6))   # the same pid: a later profiler cycle
    _, report = analyze_path(str(tmp_path), ingest_opts=IngestOptions(jobs=1), warn=False)
    assert report["ranks"] == [0] and "1 rank(s) with 2 capture windows each" in " ".join(report["notes"])


def _sglang_merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """sglang's profile_merger: pids become "[TPnn] <pid>", deviceProperties concatenated, the
    first file's other keys (its distributedInfo among them) kept."""
    merged: dict[str, Any] = {"traceEvents": [], "deviceProperties": []}
    for rank, doc in enumerate(docs):
        doc = copy.deepcopy(doc)
        for e in doc["traceEvents"]:
            e["pid"] = f"[TP{rank:02d}] {e['pid']}"
        merged["traceEvents"] += doc.pop("traceEvents")
        merged["deviceProperties"] += doc.pop("deviceProperties", [])
        merged.update({k: v for k, v in doc.items() if k not in merged})
    return merged


def test_a_merged_gpu_file_is_split_into_the_timelines_of_its_ranks(tmp_path: Path) -> None:
    files = sorted((shared_traces() / TWO_RANKS).glob("*.json.gz"))
    docs = [load_json(f) for f in files]
    assert [d["distributedInfo"]["rank"] for d in docs] == [0, 1]
    merged = _write(tmp_path / "merged-123.trace.json.gz", _sglang_merge(docs))
    _, apart = analyze_path(str(shared_traces() / TWO_RANKS), ingest_opts=IngestOptions(jobs=1), warn=False)
    _, split = analyze_path(str(merged), ingest_opts=IngestOptions(jobs=1), warn=False)
    assert split["ranks"] == apart["ranks"] == [0, 1]
    assert split["steps"] == apart["steps"]
    for rank, ledger in apart["ledger_by_rank"].items():
        assert split["ledger_by_rank"][rank] == pytest.approx(ledger, abs=1e-9)
    # In this process, and spilled from a worker process: the same rows, each event with its rank.
    for jobs in (1, 2):
        con = store.connect(None)
        # A second file (an NCCL log) so that jobs=2 does start workers.
        r = ingest([str(merged), str(NCCL_DATA / "inspector_node-017-pid1639453.json")], con, IngestOptions(jobs=jobs))
        assert not r.errors and [p for p, _ in r.ingested][:2] == [str(merged)] * 2   # two file ids, one per rank
        per_rank = con.execute("SELECT rank, n_events, rank_source FROM trace_files WHERE kind = 'kineto' "
                               "ORDER BY rank").fetchall()
        assert per_rank == [(i, len(d["traceEvents"]), "merged") for i, d in enumerate(docs)]


def test_a_salvaged_merged_file_is_replaced_whole_by_its_complete_version(tmp_path: Path) -> None:
    """Every rank split from a salvaged merged file goes when the whole file comes, not only the
    last (they share its path): a rank left behind would clash with its own new window."""
    generate(Scenario(name="merged", world_size=2, steps=2, layers=2), tmp_path / "src")
    docs = [load_json(f) for f in sorted((tmp_path / "src").glob("rank-*.json"))]
    whole = gzip.compress(json.dumps(_sglang_merge(docs)).encode())
    f = tmp_path / "merged.pt.trace.json.gz"
    f.write_bytes(whole[: len(whole) * 4 // 5])       # cut in rank 1's events, as a killed run leaves it
    con = store.connect(None)
    r = ingest([str(f)], con, IngestOptions(salvage=True, jobs=1))
    rows = "SELECT rank, n_events, partial FROM trace_files ORDER BY rank"
    assert not r.errors
    rank0, (rank, n, partial) = con.execute(rows).fetchall()
    assert rank0 == (0, len(docs[0]["traceEvents"]), True)
    assert rank == 1 and partial and 0 < n < len(docs[1]["traceEvents"])
    f.write_bytes(whole)
    r = ingest([str(f)], con, IngestOptions(jobs=1))
    assert not r.errors, r.errors
    assert con.execute(rows).fetchall() == [(i, len(d["traceEvents"]), False) for i, d in enumerate(docs)]


def test_sglang_labels_with_several_kinds_of_parallelism_are_numbered_in_its_order() -> None:
    events = [{"name": "process_name", "ph": "M", "pid": f"[{label}] {pid}", "tid": 0, "args": {"name": "python"}}
              for label in ("TP01-DP01", "TP00-DP00", "TP00-DP01", "TP01-DP00") for pid in (4242, 0)]
    m = rank_map(json.dumps({"traceEvents": events}).encode())
    assert m is not None and m.ranks == [0, 1, 2, 3]
    # (DP, TP) order: DP0 TP0, DP0 TP1, DP1 TP0, DP1 TP1.
    assert [m.place(f"[{lb}] 0", None) for lb in ("TP00-DP00", "TP01-DP00", "TP00-DP01", "TP01-DP01")] == \
        [(0, 0), (1, 0), (2, 0), (3, 0)]


def test_one_rank_with_named_processes_is_not_a_merged_file() -> None:
    events = [{"name": "process_name", "ph": "M", "pid": p, "tid": 0, "args": {"name": "Rank 0"}} for p in (77, 0, 1)]
    assert rank_map(json.dumps({"traceEvents": events}).encode()) is None


def test_rank_option_is_for_one_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="--rank"):
        ingest([str(shared_traces() / TWO_RANKS)], store.connect(None), IngestOptions(rank=0, jobs=1))


def test_a_cupti_range_profiler_capture_says_why_it_has_no_gpu_timeline() -> None:
    """HTA's cupti_profiler trace: an A100 run captured with CUPTI's range profiler, whose GPU work
    is `cuda_profiler_range` events (counters per range) with no kernel, memcpy or memset."""
    path = shared_traces() / "HolisticTraceAnalysis/tests/data/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"
    events = load_json(path)["traceEvents"]
    ranges = sum(e.get("cat") == "cuda_profiler_range" for e in events)
    assert ranges and not any(e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") for e in events)
    r = run_diag("analyze", str(path), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert f"captured as {ranges} CUPTI profiler ranges" in r.stderr
    report = json.loads(r.stdout)
    assert report["timeline"] == "host"
    # The host timeline's activities are aten ops: no note calls them unknown kernel names.
    assert not any("kernel names" in n for n in report["notes"])


def test_numeric_string_pids_and_tids_are_numbers_not_names(tmp_path: Path) -> None:
    """torch 1.9-era traces write a host thread as text ("tid": "5555"): it is that number, the same
    rows as the integers give, with no "values were names" warning (issue 36)."""
    doc = load_json(shared_traces() / AFTER_FIX)
    texts = copy.deepcopy(doc)
    for e in texts["traceEvents"]:
        for key in ("pid", "tid"):
            if type(e.get(key)) is int:
                e[key] = str(e[key])
    rows = {}
    for name, d in (("ints", doc), ("texts", texts)):
        con = store.connect(None)
        ingest([str(_write(tmp_path / f"{name}.json.gz", d))], con, IngestOptions(jobs=1))
        assert "names" not in json.dumps(con.execute("SELECT warnings FROM trace_files").fetchall())
        rows[name] = con.execute("SELECT pid, tid, ts_ns, name FROM cpu_ops ORDER BY ts_ns, name, tid").fetchall()
    assert rows["texts"] == rows["ints"] and rows["ints"]


def test_torch_1_9_stream_tids_are_the_stream_number(tmp_path: Path) -> None:
    """Kineto before torch 1.10 wrote a GPU event's tid as "stream 7", on its kernels and on the end
    of each kernel's launch flow: the stream's number (7, as later Kineto writes it), not a thread
    name; a ResNet-50 capture of that era had 9258 of them counted as "values were names" (issue 36).
    The profiler's own spans ("pid": "Spans", "tid": "PyTorch Profiler") are no pid/tid to read."""
    host = {"pid": 13721, "tid": "123"}
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#1", **host, "ts": 0, "dur": 600,
         "args": {"Input Dims": [], "External id": 1}},
        {"ph": "X", "cat": "Trace", "ts": 0, "dur": 600, "pid": "Spans", "tid": "PyTorch Profiler",
         "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": "stream 7", "args": {"name": "stream 7"}},
    ]
    for i in range(5):
        events += [
            {"ph": "X", "cat": "Operator", "name": "aten::mm", **host, "ts": 10 + i * 100, "dur": 50,
             "args": {"Input Dims": [[64, 64], [64, 64]], "External id": i + 2}},
            {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", **host, "ts": 15 + i * 100, "dur": 3,
             "args": {"correlation": i + 1, "external id": i + 2}},
            {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": "stream 7",
             "ts": 30 + i * 100, "dur": 30, "args": {"correlation": i + 1, "external id": i + 2, "device": 0,
                                                     "stream": 7}},
            {"ph": "s", "id": i + 1, **host, "ts": 15 + i * 100, "cat": "async", "name": "launch"},
            {"ph": "f", "id": i + 1, "pid": 0, "tid": "stream 7", "ts": 30 + i * 100, "cat": "async",
             "name": "launch", "bp": "e"},
        ]
    con = store.connect(None)
    ingest([str(_write(tmp_path / "resnet19.json.gz", {"schemaVersion": 1, "traceEvents": events}))], con,
           IngestOptions(jobs=1))
    assert "names" not in json.dumps(con.execute("SELECT warnings FROM trace_files").fetchall())
    assert con.execute("SELECT DISTINCT pid, tid FROM flows ORDER BY ALL").fetchall() == [(0, 7), (13721, 123)]
    assert con.execute("SELECT DISTINCT tid FROM cpu_ops WHERE name = 'aten::mm'").fetchall() == [(123,)]
