"""Speed a user feels: every measurement is a whole process, start to exit, side by side in one run.

    python bench/e2e.py [--only help,analyze,ingest,small] [--repeat 3] [--big-mb 300] [--small-files 2000,10000]

Each row runs a command line as a child process (`python -m diag.cli …`, or `python -c` doing
the same work with the library compared against), so its time counts interpreter start, imports,
worker processes and writing the result: what someone typing the command waits for (diag's
modules compiled to bytecode first, as an install does). Peak memory
is the largest summed PSS of the process and all its descendants (parse workers included),
sampled every 50 ms from /proc (bench/scale.py's `measure`). Time is the median of --repeat runs,
the rows of one workload interleaved (A B A B …) so that a change in the machine's load hits
both sides alike; peak memory is the largest of the runs. The 1-minute load average is printed
with each workload: on a shared machine it says how far to trust the wall times.

Workloads (the bars are issue 16's):
  help     `diag --help` against `python -c pass` (bar: ≤ 0.15 s)
  analyze  `diag analyze` of the 35 MB control trace to a printed report, against HTA's parse +
           temporal breakdown + comm/comp overlap of the same file (bar: ≥ 4×, no more memory)
  ingest   `diag ingest` of a ≥ --big-mb MB trace (control's steps repeated, bench/ingest.py's
           make_big) against `orjson.loads` of it and HTA's parse (bars: ≤ 0.5× orjson,
           ≥ 12× faster than HTA, ≤ 0.5× HTA's memory); --skip-hta-big leaves HTA out (minutes, GBs)
  small    for each count in --small-files, that many rank files of 20 kernels each (a big
           job's one-step capture): `diag ingest` into a store, then `diag analyze` of it (bars:
           together ≤ 20 s for 2,000, ≤ 60 s for 10,000; both by default, so one run checks
           every bar)

The in-process benches (bench/ingest.py, bench/timeline.py) stay the tools for profiling.
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import CONTROL, make_big  # noqa: E402  (bench/ingest.py: the ≥ 300 MB trace)
from scale import Stage, measure  # noqa: E402  (bench/scale.py: a process tree's time and peak)

DIAG = [sys.executable, "-m", "diag.cli"]
WORKLOADS = ("help", "analyze", "ingest", "small")

# HTA's side, as its README runs it: a trace directory, then the analyses. Logging off, as diag's
# report is the only output on its side too.
_HTA = """
import logging, os, sys, tempfile
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
d = tempfile.mkdtemp()
os.symlink(sys.argv[1], os.path.join(d, os.path.basename(sys.argv[1])))
a = TraceAnalysis(trace_dir=d)
"""
HTA_PARSE = _HTA
HTA_ANALYZE = _HTA + """
print(a.get_temporal_breakdown(visualize=False))
print(a.get_comm_comp_overlap(visualize=False))
"""
ORJSON_LOADS = """
import gzip, sys, orjson
p = sys.argv[1]
with (gzip.open(p, "rb") if p.endswith(".gz") else open(p, "rb")) as f:
    orjson.loads(f.read())
"""


@dataclass(frozen=True)
class Row:
    name: str
    cmd: Sequence[str]


@dataclass(frozen=True)
class Result:
    name: str
    wall_s: float    # median
    cpu_s: float     # median user + system of the whole tree: what load on a shared machine leaves alone
    peak_mb: float   # largest


def run_side_by_side(rows: Sequence[Row], repeat: int) -> list[Result]:
    """Every row `repeat` times, interleaved; a failing command stops the bench with its stderr."""
    runs: dict[str, list[Stage]] = {r.name: [] for r in rows}
    for _ in range(repeat):
        for r in rows:
            runs[r.name].append(measure(r.cmd))
    return [summarize(r.name, runs[r.name]) for r in rows]


def summarize(name: str, stages: Sequence[Stage]) -> Result:
    return Result(name, statistics.median(s.wall_s for s in stages), statistics.median(s.cpu_s for s in stages),
                  max(s.peak_bytes for s in stages) / 1e6)


def print_table(title: str, results: Sequence[Result], base: str) -> None:
    print(f"\n{title}   (load average {os.getloadavg()[0]:.1f})")
    print(f"{'process':<36}{'time s':>9}{'CPU s':>8}{'peak MB':>10}{'× ' + base:>22}")
    t0 = next(r.wall_s for r in results if r.name == base)
    for r in results:
        print(f"{r.name:<36}{r.wall_s:>9.2f}{r.cpu_s:>8.2f}{r.peak_mb:>10.0f}{r.wall_s / t0:>22.2f}")


def _by_name(results: Sequence[Result]) -> dict[str, Result]:
    return {r.name: r for r in results}


def bench_help(repeat: int) -> None:
    res = run_side_by_side([Row("python -c pass", [sys.executable, "-c", "pass"]),
                            Row("diag --help", [*DIAG, "--help"])], repeat)
    print_table("diag --help", res, "python -c pass")
    print(f"bar: diag --help ≤ 0.15 s: {_by_name(res)['diag --help'].wall_s:.2f} s")


def bench_analyze(repeat: int) -> None:
    res = run_side_by_side([Row("HTA parse + breakdown + overlap", [sys.executable, "-c", HTA_ANALYZE, str(CONTROL)]),
                            Row("diag analyze", [*DIAG, "analyze", str(CONTROL)])], repeat)
    print_table(f"{CONTROL.name}: {_count_mb(CONTROL):.1f} MB of JSON, start to printed report", res, "diag analyze")
    r = _by_name(res)
    h, d = r["HTA parse + breakdown + overlap"], r["diag analyze"]
    print(f"bar: HTA / diag time ≥ 4×: {h.wall_s / d.wall_s:.1f}×; diag / HTA peak memory ≤ 1: "
          f"{d.peak_mb / h.peak_mb:.2f}")


def bench_ingest(repeat: int, big_mb: int, skip_hta: bool, tmp: Path) -> None:
    big = make_big(CONTROL, big_mb, tmp / "big_rank-3.json")
    db = tmp / "big.duckdb"
    # Each run ingests into a fresh store: a second ingest of the same file is a no-op.
    ingest = f"import os, sys; from diag.cli import main; os.path.exists('{db}') and os.remove('{db}'); sys.exit(main())"
    rows = [Row("orjson.loads", [sys.executable, "-c", ORJSON_LOADS, str(big)]),
            Row("diag ingest", [sys.executable, "-c", ingest, "ingest", str(big), "--db", str(db)])]
    if not skip_hta:
        rows.insert(0, Row("HTA parse", [sys.executable, "-c", HTA_PARSE, str(big)]))
    res = run_side_by_side(rows, repeat)
    print_table(f"{big.name}: {big.stat().st_size / 1e6:.0f} MB of JSON, ingested into a store", res, "diag ingest")
    r = _by_name(res)
    d, o = r["diag ingest"], r["orjson.loads"]
    line = f"bar: diag / orjson time ≤ 0.5: {d.wall_s / o.wall_s:.2f}"
    if "HTA parse" in r:
        h = r["HTA parse"]
        line += f"; HTA / diag time ≥ 12×: {h.wall_s / d.wall_s:.1f}×; diag / HTA peak memory ≤ 0.5: " \
                f"{d.peak_mb / h.peak_mb:.2f}"
    print(line)
    big.unlink()


def write_small_files(out: Path, n: int, kernels: int = 20) -> None:
    """`n` ranks' one-step captures: a ProfilerStep with `kernels` launches, each kernel linked by
    its correlation id, and distributedInfo naming the rank (what one rank's short capture holds)."""
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(n):
        pid, tid = 1000 + rank, 1000 + rank
        ev: list[dict[str, object]] = [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": pid, "tid": tid,
             "ts": 0.0, "dur": 50.0 * kernels + 100},
        ]
        for k in range(kernels):
            t, corr = 10.0 + 50 * k, 1 + k
            ev += [
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                 "ts": t, "dur": 5.0, "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": f"ampere_bf16_s16816gemm_{k % 4}", "pid": 0, "tid": 7,
                 "ts": t + 8, "dur": 40.0, "args": {"correlation": corr, "device": 0, "stream": 7}},
                {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": pid, "tid": tid, "ts": t},
                {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": t + 8, "bp": "e"},
            ]
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": n},
               "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
               "traceEvents": ev, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
        (out / f"rank-{rank}.json").write_text(json.dumps(doc))


def bench_small(repeat: int, n: int, tmp: Path) -> None:
    d = tmp / f"small{n}"
    write_small_files(d, n)
    db = tmp / "small.duckdb"
    ingest = f"import os, sys; from diag.cli import main; os.path.exists('{db}') and os.remove('{db}'); sys.exit(main())"
    ing: list[Stage] = []
    ana: list[Stage] = []
    for _ in range(repeat):
        ing.append(measure([sys.executable, "-c", ingest, "ingest", str(d), "--db", str(db)]))
        ana.append(measure([*DIAG, "analyze", str(db), "--format", "json"]))
    res = [summarize("diag ingest", ing), summarize("diag analyze (of the store)", ana)]
    total = statistics.median(i.wall_s + a.wall_s for i, a in zip(ing, ana, strict=True))
    print_table(f"{n} rank files of 20 kernels each", res, "diag ingest")
    bar = {2000: " ≤ 20 s", 10000: " ≤ 60 s"}.get(n, "")
    print(f"bar: ingest + analyze{bar}: {total:.2f} s ({total / n * 1000:.1f} ms per file)")
    shutil.rmtree(d)


def compile_bytecode() -> None:
    """diag's modules compiled to bytecode once, as `pip install` does, so that no row pays for
    compiling them: 0.14–0.2 s of every `diag analyze` where PYTHONDONTWRITEBYTECODE keeps Python
    from caching it (as in this project's dev shell), while HTA's and the libraries' were compiled
    at their install."""
    for pkg in ("diag", "rules", "tui"):
        spec = importlib.util.find_spec(pkg)
        for where in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(where, quiet=1)


def _count_mb(path: Path) -> float:
    with gzip.open(path) as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 20), b"")) / 1e6


def _counts(text: str) -> list[int]:
    """--small-files: "2000,10000" → [2000, 10000] (argparse reports the ValueError of a bad count)."""
    return [int(c) for c in text.split(",") if c.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-mb", type=int, default=300)
    ap.add_argument("--small-files", type=_counts, default="2000,10000", help="comma-separated file counts")
    ap.add_argument("--skip-hta-big", action="store_true", help="leave HTA out of the big ingest (minutes, GBs)")
    args = ap.parse_args(argv)
    chosen = [w.strip() for w in args.only.split(",") if w.strip()]
    if unknown := set(chosen) - set(WORKLOADS):
        ap.error(f"--only: unknown {', '.join(sorted(unknown))} (choose from {', '.join(WORKLOADS)})")
    if {"analyze", "ingest"} & set(chosen) and not CONTROL.exists():
        print(f"{CONTROL} is absent: the analyze and ingest workloads need it", file=sys.stderr)
        return 2
    compile_bytecode()
    tmp = Path(tempfile.mkdtemp(prefix="diag-e2e-"))
    try:
        for w in chosen:
            if w == "help":
                bench_help(args.repeat)
            elif w == "analyze":
                bench_analyze(args.repeat)
            elif w == "ingest":
                bench_ingest(args.repeat, args.big_mb, args.skip_hta_big, tmp)
            else:
                for n in args.small_files:
                    bench_small(args.repeat, n, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
