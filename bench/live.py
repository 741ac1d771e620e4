"""Live latency: from a rank's trace file landing in the followed directory to the snapshot showing it.

    python bench/live.py [--ranks 8,32,64] [--steps 4]

For each R it generates the fixture generator's `straggler` case at R ranks (fixtures/generate.py)
and lands its files one at a time, in rank order, in a directory that `tui.sources.Live` follows
(renamed into place, as torch.profiler writes a .json), calling `poll()` as `diag live` does.
Timed: the poll that ingests the file, analyzes and publishes the snapshot. Baseline, on the same
files in one run: ingest, then a full analysis with every rank mapped again (what live did
before it kept each file's digest), then the same snapshot. Printed per R: median and worst
seconds per landing for both, their ratio, and the worst latency a user sees — up to one poll
interval (0.4 s by default) before the file is seen, plus the worst processing time; a .json.gz
is written in place and must hold still for one more poll.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from diag.api import analyze_opened
from diag.engine.run import AnalyzeOptions
from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.runtime import store
from fixtures.generate import generate
from tui.snapshot import analyzed
from tui.sources import Live

POLL_S = 0.4   # diag live --poll default


def land(src: Path, directory: Path) -> None:
    """Write under a temporary name, then rename into place (what torch does for a .json)."""
    tmp = directory / f".{src.name}.tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, directory / src.name)


def incremental(files: list[Path], work: Path, opts: AnalyzeOptions) -> list[float]:
    followed = work / "live"
    followed.mkdir()
    live = Live(str(followed), None, opts, IngestOptions())
    times = []
    for f in files:
        land(f, followed)
        t = time.perf_counter()
        snap = live.poll()
        times.append(time.perf_counter() - t)
        assert snap is not None and snap.report is not None, f
    return times


def full(files: list[Path], work: Path, opts: AnalyzeOptions) -> list[float]:
    con = store.connect(None)
    times = []
    for f in files:
        t = time.perf_counter()
        ingest([str(f)], con, IngestOptions())
        a, report = analyze_opened(con, opts)
        analyzed(con, a, report, 1, str(work))
        times.append(time.perf_counter() - t)
    con.close()
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="8,32,64", help="comma-separated rank counts (the generator allows ≤ 64)")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    print(f"{'ranks':>5} {'MB/rank':>8} {'full median/worst s':>20} {'incremental median/worst s':>27} "
          f"{'ratio':>6} {'worst latency .json / .json.gz s':>33}")
    for ranks in (int(r) for r in args.ranks.split(",")):
        work = Path(tempfile.mkdtemp(prefix="diag-live-bench-"))
        generate("straggler", work / "run", world_size=ranks, steps=args.steps)
        files = sorted((work / "run").glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        opts = AnalyzeOptions(model=str(work / "run" / "model.toml"))
        base = full(files, work, opts)
        inc = incremental(files, work, opts)
        mb = statistics.fmean(f.stat().st_size for f in files) / 1e6
        worst = max(inc)
        print(f"{ranks:>5} {mb:>8.2f} {statistics.median(base):>10.2f} / {max(base):<8.2f} "
              f"{statistics.median(inc):>13.2f} / {worst:<11.2f} {statistics.median(base) / statistics.median(inc):>6.1f} "
              f"{POLL_S + worst:>16.2f} / {2 * POLL_S + worst:.2f}")
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
