"""Scale: ingest and analyze R ranks × M MB of Kineto JSON per rank; time, MB/s per core, peak memory.

    python bench/scale.py [--ranks 8,32,128] [--sizes 16,64,128] [--data DIR] [--executor local|ray] [--path-cost]

Traces are generated once into DIR/r{R}_m{M}/ and reused (a point whose files are all there is
not generated again), so the run is resumable and `--ranks`/`--sizes` choose a subset. Each rank
is the fixture generator's `straggler` case (fixtures/generate.py) for R ranks, its steps repeated
with shifted timestamps and ids until the file reaches M MB (`replicate`).

Each stage runs the real command line (`diag ingest`, then `diag analyze` on the store) as a
child process; its peak memory is the largest summed PSS of that process and all its descendants
(parse workers, Ray's processes), sampled every 50 ms from /proc. PSS splits shared pages among
the processes that map them and counts a mapped trace's resident pages, so it is an upper bound
on what the run needs. Results accumulate in DATA/LABEL.jsonl; `--table` prints them (the table
in docs/scale.md). Growth is seconds per byte ÷ the smallest point's: 1.00 is linear in bytes.

`--path-cost` also runs analyze on the same store with the critical path and the re-timed
what-ifs left out (diag/engine/run.py's two calls replaced by no-ops in the child), so the table shows
what they add: time and peak memory with them ÷ without (issue 18's bar: 1.25 and 1.10).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from fixtures.scenarios import Scenario

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the fixture generator is beside diag/, not installed with it
CASE = "straggler"
BASE_STEPS = 3
# Ids are offset by this much per copy: the base run's External ids, correlations and Seq are all
# far below it (about 2,000 events per step), and 200 copies stay far inside int64.
ID_STRIDE = 10_000_000
_ID_ARGS = ("External id", "external id", "Record function id", "Ev Idx", "correlation", "Sequence number", "Seq")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def step_count(events: list[dict[str, Any]]) -> int:
    """How far a copy renumbers the steps: the span of ProfilerStep numbers in `events`."""
    n = [int(m.group(1)) for e in events if (m := _STEP.match(e.get("name") or ""))]
    return max(n) - min(n) + 1 if n else 0


# Gap between copies, µs: a little host time between one copy's last kernel and the next step.
GAP_US = 50.0
# diag's command line with the critical path and the re-timed what-ifs left out: the analysis as
# it was before them, for --path-cost.
WITHOUT_PATH = ("import sys, diag.engine.run as e; e.critical_paths = lambda con, run: []; "
                "e.retimed = lambda con, run, findings: findings; from diag.cli import main; sys.exit(main())")


# --------------------------------------------------------------------------- generating


def is_once(e: dict[str, Any]) -> bool:
    """Metadata and profiler markers are written once per file, not per copy."""
    return e.get("ph") in ("M", "i") or e.get("cat") == "Trace"


def shift_copy(e: dict[str, Any], dt_us: float, did: int, dstep: int) -> dict[str, Any]:
    """`e` as a later copy writes it: `dt_us` later, its ids `did` higher, its step `dstep` on."""
    out = dict(e)
    if isinstance(e.get("ts"), (int, float)):
        out["ts"] = round(e["ts"] + dt_us, 3)
    if "id" in e:
        out["id"] = e["id"] + did
    args = e.get("args")
    if args:
        a = dict(args)
        for k in _ID_ARGS:
            if k in a:
                a[k] += did
        out["args"] = a
    m = _STEP.match(e.get("name") or "")
    if m:
        out["name"] = f"ProfilerStep#{int(m.group(1)) + dstep}"
    return out


def scenario(ranks: int) -> Scenario:
    """The case at `ranks` ranks. The generator refuses more than 64 ("fixtures stay small"): the
    bench checks the case's other knobs at 64 and lays out as many ranks as it is asked for."""
    from fixtures.scenarios import Scenario, load_case

    class Big(Scenario):
        def validate(self) -> None:
            Scenario.validate(dataclasses.replace(self, world_size=min(self.world_size, 64)))

    s = load_case(CASE, steps=BASE_STEPS)
    return Big(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)} | {"world_size": ranks})


@dataclass(frozen=True)
class _Job:
    src: Path
    dst: Path
    copies: int
    period_us: float
    steps_per_copy: int


def replicate(job: _Job) -> int:
    """Write `job.copies` copies of the source's events, each shifted by a period in time, by
    ID_STRIDE in ids and by the copy's steps in ProfilerStep numbers. Streams one copy at a time."""
    doc = orjson.loads(job.src.read_bytes())
    events = doc.pop("traceEvents")
    once = [e for e in events if is_once(e)]
    body = [e for e in events if not is_once(e)]
    for e in once:
        if e.get("cat") == "Trace":
            e["dur"] = round(job.copies * job.period_us, 3)
    tmp = job.dst.with_suffix(".tmp")
    with tmp.open("wb") as f:
        f.write(orjson.dumps(doc)[:-1] + b',"traceEvents":[')
        f.write(orjson.dumps(once)[1:-1])
        for c in range(job.copies):
            part = orjson.dumps([shift_copy(e, c * job.period_us, c * ID_STRIDE, c * job.steps_per_copy) for e in body])
            f.write(b"," + part[1:-1])
        f.write(b"]}")
    tmp.rename(job.dst)
    return job.dst.stat().st_size


def generate_point(data: Path, ranks: int, mb: int, jobs: int) -> Path:
    """DATA/r{ranks}_m{mb}/rank-*.json, each about `mb` MB (10⁶ bytes); kept if already complete."""
    out = data / f"r{ranks}_m{mb}"
    files = [out / f"rank-{r}.json" for r in range(ranks)]
    if all(f.exists() for f in files):
        return out
    base = data / f"base_r{ranks}"
    if not (base / "truth.json").exists():   # written last: the base run is complete
        from fixtures.generate import generate

        generate(scenario(ranks), base)
    srcs = [base / f"rank-{r}.json" for r in range(ranks)]
    lo, hi, body_bytes = math.inf, -math.inf, 0
    for s in srcs:
        evs = [e for e in orjson.loads(s.read_bytes())["traceEvents"] if not is_once(e)]
        lo = min(lo, min(e["ts"] for e in evs))
        hi = max(hi, max(e["ts"] + e.get("dur", 0) for e in evs))
        body_bytes = max(body_bytes, len(orjson.dumps(evs)))
    period = round(hi - lo + GAP_US, 3)           # the same on every rank: collectives stay aligned
    copies = max(1, round(mb * 1e6 / body_bytes))
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(base / "model.toml", out / "model.toml")
    todo = [_Job(s, f, copies, period, BASE_STEPS) for s, f in zip(srcs, files, strict=True) if not f.exists()]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(replicate, todo))
    return out


# --------------------------------------------------------------------------- measuring


def _tree(root: int) -> list[int]:
    """`root` and every process descended from it (Ray's raylet and workers included: a Ray
    started by the command is its child)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


def _pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (libraries, a mapped trace) split among their users."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass(frozen=True)
class Stage:
    wall_s: float
    cpu_s: float          # user + system of the command and all its reaped descendants
    peak_bytes: int       # the largest summed PSS of the process tree, sampled every 50 ms
    user_s: float = 0.0   # cpu_s's two parts (0 in results written before they were kept)
    sys_s: float = 0.0


def measure(cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> Stage:
    """Run `cmd` to its exit. CPU time is the child's own resource usage from wait4: its user and
    system seconds plus those of every descendant it (or one of its descendants) waited for —
    parse workers, pools, a forked half — and nothing of any other process on the machine, which is
    why it holds where wall time does not when the machine is shared. A descendant left running
    after the command exits (a daemon) is not counted."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:      # a file, not a pipe: nothing blocks while we wait
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        peak = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, sum(_pss_bytes(p) for p in _tree(proc.pid)))
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join()
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {tail}")
    return Stage(wall, usage.ru_utime + usage.ru_stime, peak, usage.ru_utime, usage.ru_stime)


@dataclass(frozen=True)
class Point:
    ranks: int
    mb_per_rank: int
    executor: str
    bytes: int
    gen_s: float
    ingest: Stage
    analyze: Stage | None
    db_bytes: int
    load_avg: float       # the machine's 1-minute load when the point finished: other work skews wall time
    analyze_no_path: Stage | None = None   # --path-cost: analyze without the critical path and its what-ifs


def run_point(data: Path, ranks: int, mb: int, executor: str, jobs: int | None, analyze: bool,
              path_cost: bool = False) -> Point:
    t = time.perf_counter()
    d = generate_point(data, ranks, mb, jobs or os.cpu_count() or 1)
    gen = time.perf_counter() - t
    size = sum(f.stat().st_size for f in d.glob("rank-*.json"))
    work = Path(tempfile.mkdtemp(prefix="diag-scale-", dir=data))
    db = work / "run.duckdb"
    diag = [sys.executable, "-m", "diag.cli"]
    extra = ["--executor", executor] + (["--jobs", str(jobs)] if jobs else [])
    try:
        ing = measure([*diag, "ingest", str(d), "--db", str(db), *extra])
        db_bytes = db.stat().st_size
        args = ["analyze", str(db), "--model", str(d / "model.toml"), "--format", "json", "--out", str(work / "report.json")]
        ana = measure([*diag, *args]) if analyze else None
        bare = measure([sys.executable, "-c", WITHOUT_PATH, *args]) if analyze and path_cost else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Point(ranks, mb, executor, size, gen, ing, ana, db_bytes, os.getloadavg()[0], bare)


# --------------------------------------------------------------------------- reporting


def _growth(s: Stage, b: Stage, p: Point, base: Point) -> str:
    """Seconds per byte ÷ the base point's, wall / CPU: 1.00 is linear in bytes."""
    scale = base.bytes / p.bytes
    return f"{s.wall_s / b.wall_s * scale:.2f} / {s.cpu_s / b.cpu_s * scale:.2f}"


def _stage(s: Stage | None, b: Stage | None, p: Point, base: Point) -> list[str]:
    if s is None or b is None:
        return ["—"] * 4
    return [f"{s.wall_s:.0f}", f"{p.bytes / 1e6 / s.cpu_s:.1f}", f"{s.peak_bytes / 1e9:.2f}", _growth(s, b, p, base)]


HEADER = ["ranks", "MB/rank", "GB", "gen s",
          "ingest s", "ingest MB/s/core", "ingest peak GB", "ingest growth wall/cpu",
          "analyze s", "analyze MB/s/core", "analyze peak GB", "analyze growth wall/cpu", "load"]
# --path-cost: analyze without the critical path, and with ÷ without.
PATH_HEADER = ["no-path analyze s", "no-path peak GB", "path × time wall/cpu", "path × peak"]


def table(points: list[Point]) -> str:
    """Markdown, smallest point first. MB/s/core = MB ÷ the stage's CPU seconds; peak = summed PSS
    of the stage's processes; growth = seconds per byte ÷ the smallest point's (1.00 = linear)."""
    pts = sorted(points, key=lambda p: (p.bytes, p.ranks))
    if not pts:
        return ""
    base = pts[0]
    header = HEADER + (PATH_HEADER if any(p.analyze_no_path for p in pts) else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in pts:
        row = [f"{p.ranks}", f"{p.mb_per_rank}", f"{p.bytes / 1e9:.2f}", f"{p.gen_s:.0f}",
               *_stage(p.ingest, base.ingest, p, base), *_stage(p.analyze, base.analyze, p, base), f"{p.load_avg:.1f}"]
        if len(header) > len(HEADER):
            row += _path_cost(p.analyze, p.analyze_no_path)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _path_cost(with_path: Stage | None, without: Stage | None) -> list[str]:
    if with_path is None or without is None:
        return ["—"] * len(PATH_HEADER)
    return [f"{without.wall_s:.1f}", f"{without.peak_bytes / 1e9:.3f}",
            f"{with_path.wall_s / without.wall_s:.2f} / {with_path.cpu_s / without.cpu_s:.2f}",
            f"{with_path.peak_bytes / without.peak_bytes:.2f}"]


def _load_results(path: Path) -> list[Point]:
    out = []
    if path.exists():
        for line in path.read_bytes().splitlines():
            d = orjson.loads(line)
            d["ingest"] = Stage(**d["ingest"])
            d["analyze"] = Stage(**d["analyze"]) if d["analyze"] else None
            d["analyze_no_path"] = Stage(**d["analyze_no_path"]) if d.get("analyze_no_path") else None
            out.append(Point(**d))
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=_ints, default=[8, 32, 128], help="comma-separated rank counts")
    ap.add_argument("--sizes", type=_ints, default=[16, 64, 128], help="comma-separated MB per rank")
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "diag-scale",
                    help="where traces are generated and kept between runs")
    ap.add_argument("--executor", choices=("local", "ray"), default="local")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--no-analyze", action="store_true", help="ingest only")
    ap.add_argument("--label", default="results",
                    help="results accumulate in DATA/LABEL.jsonl; the table shows that file's points")
    ap.add_argument("--table", action="store_true", help="print the table of the results kept and exit")
    ap.add_argument("--clean", action="store_true", help="delete each point's traces after measuring it")
    ap.add_argument("--path-cost", action="store_true",
                    help="also analyze without the critical path and its what-ifs (time and memory ratios)")
    a = ap.parse_args(argv)
    a.data.mkdir(parents=True, exist_ok=True)
    results = a.data / f"{a.label}.jsonl"
    if not a.table:
        for ranks in a.ranks:
            for mb in a.sizes:
                p = run_point(a.data, ranks, mb, a.executor, a.jobs, not a.no_analyze, a.path_cost)
                with results.open("ab") as f:
                    f.write(orjson.dumps(p) + b"\n")
                print(f"{ranks} ranks × {mb} MB: ingest {p.ingest.wall_s:.0f} s, "
                      f"analyze {p.analyze.wall_s if p.analyze else 0:.0f} s", flush=True)
                if a.clean:
                    shutil.rmtree(a.data / f"r{ranks}_m{mb}", ignore_errors=True)
    print(table(_load_results(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
