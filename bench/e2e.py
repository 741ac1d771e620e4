"""Speed a user feels, measured honestly: whole processes, CPU-seconds beside wall, side by side.

    python bench/e2e.py [--only help,analyze,ingest,big,ranks,small] [--repeat 3] [--big-mb 100]
                        [--ranks 8,64] [--small-files 2000] [--json OUT.json] [--hog N]

Each row runs a command line as a child process (`python -m diag.cli …`, or `python -c` doing the
same work with the library compared against) from start to exit: interpreter start, imports, worker
processes and writing the result, what someone typing the command waits for (diag's modules
compiled to bytecode first, as an install does). Every row reports:
- wall seconds, and CPU seconds: user + system of the process and every descendant it waited for
  (wait4's resource usage; bench/scale.py's `measure`). CPU time is what the work costs; on a
  shared machine other processes stretch the wall time but hardly touch it, and a second core
  shortens wall time without lowering it. The bars are set in CPU seconds.
- peak memory: the largest summed PSS of the process tree, sampled every 50 ms from /proc.
The rows of one workload run interleaved (A B C A B C …, --repeat rounds), so a change in the
machine's load hits every side alike, and each ratio is paired: row ÷ the workload's diag row within
one round, then the min, median and max over the rounds. Times shown are medians; peaks the largest.
The 1-minute load average is kept with each workload: it says how far to trust the wall times.

Baselines are the fastest honest ones: `orjson.loads` and msgspec's untyped `msgspec.json.decode`
of the same bytes, each with Python's garbage collector off (their result has no cycles; with it
on, ~80 % of orjson's time on a 300 MB trace is collection, which flatters anything compared with
it), and HTA (and AMD's TraceLens where it is installed) doing their analyses of the same inputs.

Workloads:
  help     `diag --help` against `python -c pass`
  analyze  the 35 MB control trace to a printed report: diag (default jobs and --jobs 1) against
           HTA's parse + temporal breakdown + comm/comp overlap, and TraceLens's tree + GPU timeline
  ingest   a ≥ --big-mb MB trace (control's steps repeated as later steps of the same run:
           bench/ingest.py's make_big) into a store, against orjson, msgspec and HTA's parse
  big      the same big trace analyzed to a printed report, against HTA's analyses of it
  ranks    for each count in --ranks, that many generated ranks (the fixture generator's
           `straggler` case, ~0.67 MB each, kept in --data between runs) analyzed to a report,
           against HTA; CPU per MB shows whether ranks cost more than their bytes
  small    for each count in --small-files, that many rank files of 20 kernels each:
           `diag ingest` into a store, then `diag analyze` of it

The issue's full run: --big-mb 300 --ranks 8,64,512,4096 --small-files 2000,10000 (tens of
minutes, several GB of disk in --data). The in-process benches (bench/ingest.py, bench/timeline.py)
stay the tools for profiling.
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
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import CONTROL, make_big  # noqa: E402  (bench/ingest.py: the big, analyzable trace)
from scale import ROOT, Stage, measure  # noqa: E402  (bench/scale.py: a process tree's CPU, wall, peak)

DIAG = [sys.executable, "-m", "diag.cli"]
WORKLOADS = ("help", "analyze", "ingest", "big", "ranks", "small")

# HTA's side, as its README runs it: a trace directory (a file is linked into one, a directory's
# rank files are), then the analyses. Logging off, as diag's report is the only output on its side.
_HTA = """
import logging, os, sys, tempfile
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
p, d = sys.argv[1], tempfile.mkdtemp()
for f in ([os.path.join(p, n) for n in os.listdir(p) if n.startswith("rank-")] if os.path.isdir(p) else [p]):
    os.symlink(os.path.abspath(f), os.path.join(d, os.path.basename(f)))
a = TraceAnalysis(trace_dir=d)
"""
HTA_PARSE = _HTA
HTA_ANALYZE = _HTA + """
print(a.get_temporal_breakdown(visualize=False))
print(a.get_comm_comp_overlap(visualize=False))
"""
# TraceLens (AMD), as its perf-report script starts: the call tree, then the GPU timeline.
TRACELENS_ANALYZE = """
import sys
from TraceLens import TreePerfAnalyzer
a = TreePerfAnalyzer.from_file(sys.argv[1])
print(a.get_df_gpu_timeline())
"""
TRACELENS_MISSING = "not installed (not on PyPI: pip install git+https://github.com/AMD-AGI/TraceLens)"
# The parsers alone, the garbage collector off (see the module's docstring).
_READ = """
import gc, gzip, sys
gc.disable()
p = sys.argv[1]
with (gzip.open(p, "rb") if p.endswith(".gz") else open(p, "rb")) as f:
    data = f.read()
"""
ORJSON_LOADS = _READ + "import orjson\norjson.loads(data)\n"
MSGSPEC_DECODE = _READ + "import msgspec\nmsgspec.json.decode(data)\n"


@dataclass(frozen=True)
class Row:
    name: str
    cmd: Sequence[str] | None   # None: the row is shown, not run
    missing: str = ""           # why it is not run


@dataclass
class Measured:
    name: str
    cmd: list[str]
    runs: list[Stage] = field(default_factory=list)
    missing: str = ""

    def median(self, what: str) -> float:
        return statistics.median(getattr(s, what) for s in self.runs)

    @property
    def peak_mb(self) -> float:
        return max(s.peak_bytes for s in self.runs) / 1e6


@dataclass
class Workload:
    key: str                 # which of WORKLOADS
    title: str
    mb: float                # MB of JSON read (0: none); CPU per MB divides by it
    base: str | None         # the row every ratio divides by
    rows: list[Measured]
    load_avg: float = 0.0


def run_side_by_side(rows: Sequence[Row], repeat: int,
                     run: Callable[[Sequence[str]], Stage] = measure) -> list[Measured]:
    """Every runnable row `repeat` times, interleaved; a failing command stops the bench with its stderr."""
    out = [Measured(r.name, list(r.cmd or []), missing=r.missing) for r in rows]
    for _ in range(repeat):
        for r, m in zip(rows, out, strict=True):
            if r.cmd is not None:
                m.runs.append(run(r.cmd))
    return out


def paired(row: Measured, base: Measured, what: str) -> tuple[float, float, float] | None:
    """Row ÷ base, round by round (the two ran back to back): min, median, max."""
    if not row.runs or not base.runs:
        return None
    r = [getattr(a, what) / getattr(b, what) for a, b in zip(row.runs, base.runs, strict=True)]
    return min(r), statistics.median(r), max(r)


def _spread(r: tuple[float, float, float] | None) -> str:
    return "" if r is None else f"{r[1]:.2f} ({r[0]:.2f}–{r[2]:.2f})"


HEADER = ("process", "wall s", "CPU s", "peak MB", "CPU ms/MB", "wall ÷ base", "CPU ÷ base")


def table(workloads: Sequence[Workload]) -> str:
    """One table: a title line per workload, then its rows. The ratios are paired (min–max over
    the rounds in brackets); CPU ms/MB is the row's median CPU time per MB of JSON read."""
    w0, w = 44, (9, 9, 9, 11, 22, 22)
    lines = [f"{HEADER[0]:<{w0}}" + "".join(f"{h:>{n}}" for h, n in zip(HEADER[1:], w, strict=True))]
    for wl in workloads:
        based = f"base: {wl.base}; " if wl.base else ""
        lines.append(f"\n{wl.title}   ({based}load average {wl.load_avg:.1f})")
        base = next((m for m in wl.rows if m.name == wl.base), None)
        for m in wl.rows:
            if not m.runs:
                lines.append(f"  {m.name:<{w0 - 2}}{m.missing}")
                continue
            per_mb = f"{m.median('cpu_s') * 1e3 / wl.mb:.1f}" if wl.mb else ""
            cells = (f"{m.median('wall_s'):.2f}", f"{m.median('cpu_s'):.2f}", f"{m.peak_mb:.0f}", per_mb,
                     _spread(paired(m, base, "wall_s")) if base else "", _spread(paired(m, base, "cpu_s")) if base else "")
            lines.append(f"  {m.name:<{w0 - 2}}" + "".join(f"{c:>{n}}" for c, n in zip(cells, w, strict=True)))
    return "\n".join(lines)


def to_json(workloads: Sequence[Workload], repeat: int, hog: int = 0) -> dict[str, object]:
    """Every run's numbers, the medians and the paired ratios, with what the machine was."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out: list[dict[str, object]] = []
    for wl in workloads:
        base = next((m for m in wl.rows if m.name == wl.base), None)
        rows = []
        for m in wl.rows:
            r: dict[str, object] = {"name": m.name, "cmd": m.cmd, "missing": m.missing, "runs": [asdict(s) for s in m.runs]}
            if m.runs:
                r |= {"wall_s": m.median("wall_s"), "cpu_s": m.median("cpu_s"), "peak_mb": m.peak_mb,
                      "cpu_ms_per_mb": m.median("cpu_s") * 1e3 / wl.mb if wl.mb else None}
                if base:
                    r |= {"wall_ratio": paired(m, base, "wall_s"), "cpu_ratio": paired(m, base, "cpu_s")}
            rows.append(r)
        out.append({"workload": wl.key, "title": wl.title, "mb": wl.mb, "base": wl.base,
                    "load_avg": wl.load_avg, "rows": rows})
    return {"commit": commit, "cpus": os.cpu_count(), "python": sys.version.split()[0], "repeat": repeat,
            "hog": hog, "workloads": out}


# Issue 16's bars: so many files of 20 kernels ingested and analyzed in at most so many seconds.
SMALL_BARS_S = {2000: 20, 10000: 60}


def _row(wl: Workload, name: str) -> Measured | None:
    m = next((m for m in wl.rows if m.name == name), None)
    return m if m and m.runs else None


def bars(workloads: Sequence[Workload]) -> list[str]:
    """The issue's goals, each as measured here (CPU seconds unless it says wall)."""
    out: list[str] = []

    def say(goal: str, value: str, met: bool) -> None:
        out.append(f"{'met    ' if met else 'NOT met'}  {goal}: {value}")

    for wl in workloads:
        d = _row(wl, "diag analyze") or _row(wl, "diag ingest")
        hta = _row(wl, "HTA parse + breakdown + overlap") or _row(wl, "HTA parse")
        if wl.key == "help" and (h := _row(wl, "diag --help")):
            say("diag --help ≤ 0.15 s wall", f"{h.median('wall_s'):.2f} s", h.median("wall_s") <= 0.15)
        if wl.key in ("analyze", "big") and d and hta and (r := paired(hta, d, "cpu_s")):
            say(f"{wl.key}: HTA ÷ diag CPU ≥ 5", f"{_spread(r)}", r[0] >= 5)
            say(f"{wl.key}: diag's peak ≤ HTA's", f"{d.peak_mb:.0f} / {hta.peak_mb:.0f} MB", d.peak_mb <= hta.peak_mb)
        if wl.key == "ingest" and d and (o := _row(wl, "orjson.loads, gc off")) and (r := paired(d, o, "cpu_s")):
            say("ingest: diag ÷ orjson (gc off) CPU ≤ 1", _spread(r), r[2] <= 1)
        if wl.key == "ranks" and d:
            if hta:
                say(f"{wl.title.split()[0]} ranks: diag's peak ≤ HTA's", f"{d.peak_mb:.0f} / {hta.peak_mb:.0f} MB",
                    d.peak_mb <= hta.peak_mb)
            if wl.title.startswith("4096 "):
                say("4096 ranks: ≤ 60 s wall, ≤ 2 GB", f"{d.median('wall_s'):.0f} s, {d.peak_mb / 1e3:.2f} GB",
                    d.median("wall_s") <= 60 and d.peak_mb <= 2000)
    for wl in workloads:   # issue 16's bars on many small files, in wall time
        n = int(wl.title.split()[0]) if wl.key == "small" else 0
        if n in SMALL_BARS_S and all(m.runs for m in wl.rows):
            total = sum(m.median("wall_s") for m in wl.rows)
            say(f"{n} small files: ingest + analyze ≤ {SMALL_BARS_S[n]} s wall", f"{total:.1f} s", total <= SMALL_BARS_S[n])
    grows = {wl.key: r[1] for wl in workloads if wl.key in ("analyze", "big") and (d := _row(wl, "diag analyze"))
             and (h := _row(wl, "HTA parse + breakdown + overlap")) and (r := paired(h, d, "cpu_s"))}
    if len(grows) == 2:
        say("HTA ÷ diag CPU grows with size (control → big)", f"{grows['analyze']:.2f} → {grows['big']:.2f}",
            grows["big"] > grows["analyze"])
    per_mb = {int(wl.title.split()[0]): d.median("cpu_s") / wl.mb
              for wl in workloads if wl.key == "ranks" and (d := _row(wl, "diag analyze"))}
    if 64 in per_mb and (top := max(per_mb)) > 64:
        g = per_mb[top] / per_mb[64]
        say(f"ranks: CPU per MB at {top} ÷ at 64 ≤ 1.1", f"{g:.2f}", g <= 1.1)
    return out


# --------------------------------------------------------------------------- the workloads


def _ingest_cmd(db: Path) -> list[str]:
    """`diag ingest` into a fresh store each run (a second ingest of the same file is a no-op)."""
    code = f"import os, sys; from diag.cli import main; os.path.exists({str(db)!r}) and os.remove({str(db)!r}); sys.exit(main())"
    return [sys.executable, "-c", code, "ingest", "--db", str(db)]


def _tracelens(path: Path) -> Row:
    if importlib.util.find_spec("TraceLens") is None:
        return Row("TraceLens tree + GPU timeline", None, TRACELENS_MISSING)
    return Row("TraceLens tree + GPU timeline", [sys.executable, "-c", TRACELENS_ANALYZE, str(path)])


def _analyze_rows(path: Path, hta: Row | None, model: Path | None = None) -> list[Row]:
    extra = ["--model", str(model)] if model else []
    rows = [Row("diag analyze", [*DIAG, "analyze", str(path), *extra]),
            Row("diag analyze --jobs 1", [*DIAG, "analyze", str(path), "--jobs", "1", *extra])]
    return rows + ([hta] if hta else [])


def bench_help(repeat: int) -> Workload:
    rows = run_side_by_side([Row("python -c pass", [sys.executable, "-c", "pass"]),
                             Row("diag --help", [*DIAG, "--help"])], repeat)
    return Workload("help", "diag --help", 0, "python -c pass", rows)


def bench_analyze(repeat: int) -> Workload:
    hta = Row("HTA parse + breakdown + overlap", [sys.executable, "-c", HTA_ANALYZE, str(CONTROL)])
    rows = run_side_by_side([*_analyze_rows(CONTROL, hta), _tracelens(CONTROL)], repeat)
    mb = _json_mb(CONTROL)
    return Workload("analyze", f"analyze {CONTROL.name}: {mb:.1f} MB of JSON to a printed report", mb, "diag analyze", rows)


def bench_ingest(repeat: int, big: Path, skip_hta: bool, tmp: Path) -> Workload:
    ingest = _ingest_cmd(tmp / "big.duckdb")
    rows = [Row("diag ingest", [*ingest, str(big)]),
            Row("diag ingest --jobs 1", [*ingest, str(big), "--jobs", "1"]),
            Row("orjson.loads, gc off", [sys.executable, "-c", ORJSON_LOADS, str(big)]),
            Row("msgspec.json.decode (untyped), gc off", [sys.executable, "-c", MSGSPEC_DECODE, str(big)]),
            Row("HTA parse", [sys.executable, "-c", HTA_PARSE, str(big)]) if not skip_hta
            else Row("HTA parse", None, "skipped (--skip-hta-big)")]
    mb = big.stat().st_size / 1e6
    return Workload("ingest", f"ingest {big.name}: {mb:.0f} MB of JSON into a store", mb, "diag ingest",
                    run_side_by_side(rows, repeat))


def bench_big(repeat: int, big: Path, skip_hta: bool) -> Workload:
    hta = (Row("HTA parse + breakdown + overlap", [sys.executable, "-c", HTA_ANALYZE, str(big)]) if not skip_hta
           else Row("HTA parse + breakdown + overlap", None, "skipped (--skip-hta-big)"))
    mb = big.stat().st_size / 1e6
    return Workload("big", f"analyze {big.name}: {mb:.0f} MB of JSON to a printed report", mb, "diag analyze",
                    run_side_by_side(_analyze_rows(big, hta), repeat))


def make_ranks(data: Path, n: int) -> Path:
    """DATA/ranks{n}/rank-*.json and model.toml: the `straggler` case laid out on n ranks (bench/scale.py's
    scenario), kept for the next run; the generator's truth.json is left out of the directory
    analyzed."""
    out = data / f"ranks{n}"
    if (out / "complete").exists():
        return out
    from scale import scenario

    from fixtures.generate import generate

    shutil.rmtree(out, ignore_errors=True)
    generate(scenario(n), out)
    (out / "truth.json").unlink()
    (out / "complete").touch()
    return out


def bench_ranks(repeat: int, n: int, data: Path, hta_max: int) -> Workload:
    d = make_ranks(data, n)
    hta = (Row("HTA parse + breakdown + overlap", [sys.executable, "-c", HTA_ANALYZE, str(d)]) if n <= hta_max
           else Row("HTA parse + breakdown + overlap", None, f"skipped (more than --hta-max-ranks {hta_max})"))
    mb = sum(f.stat().st_size for f in d.glob("rank-*.json")) / 1e6
    return Workload("ranks", f"{n} generated ranks: {mb:.0f} MB of JSON to a printed report", mb, "diag analyze",
                    run_side_by_side(_analyze_rows(d, hta, d / "model.toml"), repeat))


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


def bench_small(repeat: int, n: int, tmp: Path) -> Workload:
    d = tmp / f"small{n}"
    write_small_files(d, n)
    db = tmp / "small.duckdb"
    # Interleaved in this order, each round's analyze reads the store its ingest just wrote.
    rows = run_side_by_side([Row("diag ingest", [*_ingest_cmd(db), str(d)]),
                             Row("diag analyze (of the store)", [*DIAG, "analyze", str(db), "--format", "json"])], repeat)
    mb = sum(f.stat().st_size for f in d.iterdir()) / 1e6
    shutil.rmtree(d)
    return Workload("small", f"{n} rank files of 20 kernels each: ingest, then analyze the store", mb, None, rows)


def compile_bytecode() -> None:
    """diag's modules compiled to bytecode once, as `pip install` does, so that no row pays for
    compiling them: 0.14–0.2 s of every `diag analyze` where PYTHONDONTWRITEBYTECODE keeps Python
    from caching it (as in this project's dev shell), while HTA's and the libraries' were compiled
    at their install."""
    for pkg in ("diag", "rules", "tui"):
        spec = importlib.util.find_spec(pkg)
        for where in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(where, quiet=1)


def _json_mb(path: Path) -> float:
    if not path.name.endswith(".gz"):
        return path.stat().st_size / 1e6
    with gzip.open(path) as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 20), b"")) / 1e6


def _counts(text: str) -> list[int]:
    """"2000,10000" → [2000, 10000] (argparse reports the ValueError of a bad count)."""
    return [int(c) for c in text.split(",") if c.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (the ratios' spread is over them)")
    ap.add_argument("--big-mb", type=int, default=100, help="size of the big trace (the issue's runs: 300)")
    ap.add_argument("--skip-hta-big", action="store_true", help="leave HTA out of the big trace's rows (minutes, GBs)")
    ap.add_argument("--ranks", type=_counts, default="8,64", help="comma-separated generated rank counts (issue: 8,64,512,4096)")
    ap.add_argument("--hta-max-ranks", type=int, default=512, help="HTA's row is left out above this many ranks")
    ap.add_argument("--small-files", type=_counts, default="2000", help="comma-separated file counts")
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "diag-e2e",
                    help="where generated ranks are kept between runs")
    ap.add_argument("--json", type=Path, help="also write every run's numbers here")
    ap.add_argument("--hog", type=int, default=0, metavar="N",
                    help="run N busy loops beside the bench (the check that CPU ratios hold under load)")
    args = ap.parse_args(argv)
    chosen = [w.strip() for w in args.only.split(",") if w.strip()]
    if unknown := set(chosen) - set(WORKLOADS):
        ap.error(f"--only: unknown {', '.join(sorted(unknown))} (choose from {', '.join(WORKLOADS)})")
    if {"analyze", "ingest", "big"} & set(chosen) and not CONTROL.exists():
        print(f"{CONTROL} is absent: the analyze, ingest and big workloads need it", file=sys.stderr)
        return 2
    compile_bytecode()
    args.data.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="diag-e2e-"))
    done: list[Workload] = []
    # Busy loops: children of the bench, never of a measured command, so no row counts their CPU.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hog)]
    try:
        big = make_big(CONTROL, args.big_mb, tmp / "big_rank-3.json") if {"ingest", "big"} & set(chosen) else None
        for w in chosen:
            if w == "help":
                new = [bench_help(args.repeat)]
            elif w == "analyze":
                new = [bench_analyze(args.repeat)]
            elif w in ("ingest", "big") and big:
                new = [bench_ingest(args.repeat, big, args.skip_hta_big, tmp) if w == "ingest"
                       else bench_big(args.repeat, big, args.skip_hta_big)]
            elif w == "ranks":
                new = [bench_ranks(args.repeat, n, args.data, args.hta_max_ranks) for n in args.ranks]
            else:
                new = [bench_small(args.repeat, n, tmp) for n in args.small_files]
            for wl in new:
                wl.load_avg = os.getloadavg()[0]
                print(f"done: {wl.title}", file=sys.stderr, flush=True)
            done += new
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(done))
    print("\n" + "\n".join(bars(done)))
    if args.json:
        args.json.write_text(json.dumps(to_json(done, args.repeat, args.hog), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
