"""Timeline build time after ingest, as a ratio to the ingest time.

    python bench/timeline.py [--ranks 8] [--repeat 3]

Makes RANKS copies of ../shared/traces' control.json.gz (34.8 MB of JSON, an A100 rank), each
claiming its own rank, ingests them into one DuckDB file, then times the map step (each rank's
timeline: launch linking, phases, FLOPs, steps; its GPU-state sweep and collective calls) and
the reduce (calls matched across ranks, clock offsets, waits) — everything `analyze` does before
the ledger and the rules.
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
    import numpy as np
    import orjson

    from diag import store
    from diag.collectives import clock_offsets, match, wait_intervals
    from diag.digest import digest_rank
    from diag.ingest.pipeline import IngestOptions, ingest
    from diag.states import with_waits
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

    def build() -> tuple[float, float]:
        t0 = time.perf_counter()
        # The map step: each rank's timeline, GPU-state sweep and collective calls.
        digests = [digest_rank(con, load_rank(con, f))[0] for f in rank_files(con)]
        t1 = time.perf_counter()
        # The reduce: calls matched across ranks, clocks, each rank's waits for the last arrival.
        matched = match(c for d in digests for c in d.calls)
        clock_offsets(matched, [d.rank for d in digests])
        waits = wait_intervals(matched)
        none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        for d in digests:
            with_waits(d.states, d.steps.start_ns, d.steps.end_ns, d.waitable, waits.get((d.rank, d.capture_window), none))
        return t1 - t0, time.perf_counter() - t1

    runs = [build() for _ in range(args.repeat)]
    per_rank, cross = (statistics.median(r[i] for r in runs) for i in range(2))
    total = per_rank + cross
    print(json.dumps({"ranks": args.ranks}))
    print(f"{'stage':<34}{'seconds':>9}")
    print(f"{'ingest (' + str(args.ranks) + ' × 34.8 MB)':<34}{ingest_s:>9.2f}")
    print(f"{'per-rank timelines and sweeps':<34}{per_rank:>9.2f}")
    print(f"{'matching, clocks, waits':<34}{cross:>9.2f}")
    print(f"{'timelines total':<34}{total:>9.2f}   ({total / ingest_s:.2f} × ingest; bar: < 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
