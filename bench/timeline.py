"""Timeline build time after ingest, as a ratio to the ingest time.

    python bench/timeline.py [--ranks 8] [--repeat 3]

Makes RANKS copies of ../shared/traces' control.json.gz (34.8 MB of JSON, an A100 rank), each
claiming its own rank, ingests them into one DuckDB file, then times the per-rank timelines
(launch linking, phases, FLOPs, steps), the cross-rank collectives and clock offsets, and the
GPU-state sweep — everything `analyze` does before the rules.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTROL = ROOT.parent / "shared/traces/HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not CONTROL.exists():
        print(f"{CONTROL} is absent", file=sys.stderr)
        return 2
    import orjson

    from diag import store
    from diag.collectives import calls_of, clock_offsets, match, wait_intervals
    from diag.ingest.pipeline import IngestOptions, ingest
    from diag.states import rank_states
    from diag.timeline import load_rank, rank_files

    tmp = Path(tempfile.mkdtemp())
    with gzip.open(CONTROL, "rb") as f:
        doc = orjson.loads(f.read())
    for r in range(args.ranks):
        doc["distributedInfo"]["rank"] = r
        (tmp / f"rank-{r}.json").write_bytes(orjson.dumps(doc))
    con = store.connect(tmp / "run.duckdb")
    t = time.perf_counter()
    res = ingest([str(tmp)], con, IngestOptions())
    ingest_s = time.perf_counter() - t
    assert len(res.ingested) == args.ranks, res.errors

    def build() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        tls = [load_rank(con, f) for f in rank_files(con)]
        t1 = time.perf_counter()
        calls = [c for tl in tls for c in calls_of(con, tl)]
        matched = match(calls)
        clock_offsets(matched, [tl.rank for tl in tls])
        t2 = time.perf_counter()
        for tl in tls:
            rank_states(tl, wait_intervals(matched, tl.rank, tl.capture_window))
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2

    runs = [build() for _ in range(args.repeat)]
    per_rank, cross, sweep = (statistics.median(r[i] for r in runs) for i in range(3))
    total = per_rank + cross + sweep
    print(json.dumps({"ranks": args.ranks}))
    print(f"{'stage':<34}{'seconds':>9}")
    print(f"{'ingest (' + str(args.ranks) + ' × 34.8 MB)':<34}{ingest_s:>9.2f}")
    print(f"{'per-rank timelines':<34}{per_rank:>9.2f}")
    print(f"{'collectives, matching, clocks':<34}{cross:>9.2f}")
    print(f"{'GPU-state sweep':<34}{sweep:>9.2f}")
    print(f"{'timelines total':<34}{total:>9.2f}   ({total / ingest_s:.2f} × ingest; bar: < 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
