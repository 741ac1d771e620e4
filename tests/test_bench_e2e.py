"""bench/e2e.py's harness (issue 41): a process tree's CPU seconds, interleaved rows, paired ratios,
the table and JSON, and the big trace that can be analyzed (unique ids, renumbered steps, shifted
clocks). No timing is asserted: the commands measured here burn a known amount of CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import e2e  # noqa: E402
from ingest import make_big  # noqa: E402
from scale import Stage, measure  # noqa: E402

# A child that starts a grandchild burning 0.3 s of its own CPU and waits for it.
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
PARENT = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}], check=True)"


def test_measure_counts_the_cpu_of_descendants_it_waited_for() -> None:
    s = measure([sys.executable, "-c", PARENT])
    assert s.cpu_s >= 0.3                      # the grandchild's 0.3 s, on any machine's load
    assert s.cpu_s == pytest.approx(s.user_s + s.sys_s)
    assert s.peak_bytes > 0


def test_measure_names_a_failing_command_with_its_stderr() -> None:
    with pytest.raises(RuntimeError, match="exited 3: boom"):
        measure([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])


def _stage(wall: float, cpu: float, peak_mb: float = 100) -> Stage:
    return Stage(wall, cpu, int(peak_mb * 1e6), cpu, 0.0)


def test_rows_run_interleaved_and_a_missing_row_is_not_run() -> None:
    order: list[str] = []

    def run(cmd: object) -> Stage:
        order.append(list(cmd)[0])  # type: ignore[call-overload]
        return _stage(1, 1)

    rows = [e2e.Row("a", ["A"]), e2e.Row("gone", None, "not installed"), e2e.Row("b", ["B"])]
    out = e2e.run_side_by_side(rows, 3, run)
    assert order == ["A", "B"] * 3
    assert [len(m.runs) for m in out] == [3, 0, 3]
    assert out[1].missing == "not installed"


def _workload() -> e2e.Workload:
    diag = e2e.Measured("diag analyze", ["diag"], [_stage(1.0, 2.0, 300), _stage(2.0, 2.0, 310), _stage(1.0, 4.0, 290)])
    hta = e2e.Measured("HTA parse + breakdown + overlap", ["hta"],
                       [_stage(5.0, 10.0, 600), _stage(4.0, 12.0, 620), _stage(6.0, 8.0, 610)])
    missing = e2e.Measured("TraceLens tree + GPU timeline", [], missing="not installed")
    return e2e.Workload("analyze", "analyze x: 50.0 MB", 50.0, "diag analyze", [diag, hta, missing])


def test_ratios_are_paired_round_by_round() -> None:
    wl = _workload()
    diag, hta = wl.rows[0], wl.rows[1]
    # CPU: 10/2, 12/2, 8/4 → 5, 6, 2: paired, not the ratio of medians (10 / 2 = 5).
    assert e2e.paired(hta, diag, "cpu_s") == (2.0, 5.0, 6.0)
    assert e2e.paired(hta, diag, "wall_s") == (2.0, 5.0, 6.0)
    assert e2e.paired(wl.rows[2], diag, "cpu_s") is None


def test_table_shows_medians_peaks_cpu_per_mb_and_missing_rows() -> None:
    text = e2e.table([_workload()])
    hta = next(line for line in text.splitlines() if "HTA" in line)
    # median wall 5, median CPU 10, largest peak 620 MB, 10 s / 50 MB = 200 ms/MB, ratios 5 (2–6)
    assert hta.split()[-8:] == ["5.00", "10.00", "620", "200.0", "5.00", "(2.00–6.00)", "5.00", "(2.00–6.00)"]
    assert "TraceLens tree + GPU timeline" in text and "not installed" in text
    assert "base: diag analyze" in text


def test_json_keeps_every_run_and_the_ratios() -> None:
    doc = json.loads(json.dumps(e2e.to_json([_workload()], 3)))
    rows = doc["workloads"][0]["rows"]
    assert len(rows[1]["runs"]) == 3 and rows[1]["cpu_ratio"] == [2.0, 5.0, 6.0]
    assert rows[1]["cpu_ms_per_mb"] == 200.0
    assert rows[2]["missing"] == "not installed" and rows[2]["runs"] == []


def test_bars_judge_the_worst_round() -> None:
    lines = e2e.bars([_workload()])
    assert any(line.startswith("NOT met") and "HTA ÷ diag CPU ≥ 5" in line for line in lines)   # 2× in one round
    assert any(line.startswith("met") and "peak ≤ HTA's" in line for line in lines)


def _trace(path: Path) -> None:
    """Two steps, each a CPU op launching a kernel (External id, correlation, a flow), metadata and
    the profiler's span: the fields make_big must renumber."""
    ev: list[dict[str, object]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": 1000, "dur": 200},
    ]
    for i, step in enumerate((7, 8)):
        t = 1000 + 100 * i
        ev += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t, "dur": 90},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 1, "dur": 20,
             "args": {"External id": 10 + i, "Sequence number": 50 + i, "pad": "x" * 300}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 2, "dur": 5,
             "args": {"External id": 10 + i, "correlation": 90 + i}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": t + 10, "dur": 50,
             "args": {"External id": 10 + i, "correlation": 90 + i, "device": 0, "stream": 7}},
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 90 + i, "pid": 1, "tid": 1, "ts": t + 2},
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 90 + i, "pid": 0, "tid": 7, "ts": t + 10, "bp": "e"},
        ]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))


def test_big_trace_copies_are_later_steps_of_the_same_run(tmp_path: Path) -> None:
    _trace(tmp_path / "src.json")
    one_copy = len(json.dumps(json.loads((tmp_path / "src.json").read_text())["traceEvents"][2:]))
    big = make_big(tmp_path / "src.json", 1, tmp_path / "big.json")
    doc = json.loads(big.read_bytes())
    ev = doc["traceEvents"]
    copies = -(-1_000_000 // one_copy)   # as many as reach 1 MB
    assert doc["schemaVersion"] == 1
    assert sum(e["ph"] == "M" for e in ev) == 1                      # metadata once
    span = [e for e in ev if e.get("cat") == "Trace"]
    assert len(span) == 1
    steps = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) >= 2 * (copies - 1)
    assert [e["name"] for e in steps] == [f"ProfilerStep#{7 + i}" for i in range(len(steps))]
    starts = [e["ts"] for e in steps]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    # The span covers every copy: its end is at or after the last step's.
    assert span[0]["ts"] + span[0]["dur"] >= steps[-1]["ts"] + steps[-1]["dur"]
    ops = [e["args"]["External id"] for e in ev if e.get("cat") == "cpu_op"]
    kernels = [e["args"]["correlation"] for e in ev if e.get("cat") == "kernel"]
    seq = [e["args"]["Sequence number"] for e in ev if e.get("cat") == "cpu_op"]
    for ids in (ops, kernels, seq):
        assert len(set(ids)) == len(ids) == len(steps)
    for ph in ("s", "f"):
        assert sorted(e["id"] for e in ev if e["ph"] == ph) == sorted(kernels)   # each flow still names its kernel
    # A kernel keeps its launch's External id within a copy.
    by_corr = {e["args"]["correlation"]: e["args"]["External id"] for e in ev if e.get("cat") == "cuda_runtime"}
    assert all(by_corr[e["args"]["correlation"]] == e["args"]["External id"] for e in ev if e.get("cat") == "kernel")


def test_bars_compare_cpu_per_mb_across_rank_counts() -> None:
    def ranks(n: int, mb: float, cpu: float) -> e2e.Workload:
        d = e2e.Measured("diag analyze", ["diag"], [_stage(cpu, cpu, 500)])
        return e2e.Workload("ranks", f"{n} generated ranks: {mb:.0f} MB of JSON", mb, "diag analyze", [d])

    # 5 s / 50 MB at 64 ranks, 50 s / 400 MB at 512: 0.125 ÷ 0.1 = 1.25 the CPU per MB.
    lines = e2e.bars([ranks(64, 50, 5), ranks(512, 400, 50)])
    assert lines == ["NOT met  ranks: CPU per MB at 512 ÷ at 64 ≤ 1.1: 1.25"]


def test_bars_say_whether_the_ratio_to_hta_grows_with_size() -> None:
    control, big = _workload(), _workload()
    big.key = "big"
    big.rows[1].runs = [_stage(5.0, 2 * s.cpu_s) for s in big.rows[1].runs]   # HTA twice as slow on the big trace
    lines = e2e.bars([control, big])
    assert "met      HTA ÷ diag CPU grows with size (control → big): 5.00 → 10.00" in lines


def test_bars_keep_issue_16s_small_files_bar() -> None:
    rows = [e2e.Measured("diag ingest", ["i"], [_stage(8.0, 9.0)]), e2e.Measured("diag analyze (of the store)", ["a"], [_stage(13.0, 9.0)])]
    lines = e2e.bars([e2e.Workload("small", "2000 rank files of 20 kernels each", 26.0, None, rows)])
    assert lines == ["NOT met  2000 small files: ingest + analyze ≤ 20 s wall: 21.0 s"]


def test_stages_ingests_the_file_as_the_command_does(tmp_path: Path) -> None:
    """bench/stages.py times the same work `diag ingest` does: its store holds as many event rows
    as the command's row for the file counts, and it prints every stage and the total."""
    import subprocess

    import duckdb

    trace = Path(__file__).resolve().parents[2] / "shared/traces/kineto/docs/traces/before_fix_trace.json"
    if not trace.exists():
        pytest.skip(f"{trace} is absent")
    bench = Path(__file__).resolve().parents[1] / "bench"
    out = subprocess.run([sys.executable, str(bench / "stages.py"), str(trace), "--db", str(tmp_path / "s.duckdb")],
                         check=True, capture_output=True, text=True).stdout
    for stage in ("imports", "typed decode (msgspec)", "tabulate (Arrow tables)", "inserts", "total"):
        assert stage in out
    theirs = tmp_path / "cmd.duckdb"
    subprocess.run([sys.executable, "-m", "diag.cli", "ingest", "--db", str(theirs), str(trace)], check=True,
                   capture_output=True)
    tables = ("cpu_ops", "gpu_annotations", "runtime_calls", "kernels", "copies", "flows", "other_events")
    with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
        rows = sum(con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in tables)
    with duckdb.connect(str(theirs), read_only=True) as con:
        assert rows == con.execute("SELECT n_events FROM trace_files").fetchall()[0][0] > 0
