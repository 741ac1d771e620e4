"""Timeline build time after ingest, as a ratio to the ingest time.

    python bench/timeline.py [--ranks 8] [--repeat 3]

Makes RANKS copies of ../shared/traces' control.json.gz (34.8 MB of JSON, an A100 rank), each
claiming its own rank, ingests them into one DuckDB file, then times the map step as `analyze`
runs it in this process (engine.map_ranks, the next rank's rows read while one is mapped): each
rank's timeline (launch linking, phases, FLOPs, steps), its GPU-state sweep, collective calls
and rows of the per-file tables; and the reduce (calls matched across ranks, clock offsets,
waits): everything `analyze` does before the ledger and the rules, but for writing the rows into
the store. The bar is on that. The map step with the rules' per-rank digests (analyze's whole
map) is timed too and shown below it.
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

    from diag.engine.map_step import map_ranks
    from diag.ingest.options import IngestOptions
    from diag.ingest.pipeline import ingest
    from diag.runtime import store
    from diag.timeline.clocks import clock_offsets
    from diag.timeline.collectives import match, wait_intervals
    from diag.timeline.rank import rank_files
    from diag.timeline.states import with_waits
    from rules import RULES

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

    rules = [r() for r in RULES]

    def build() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        # The map step, without the rules' digests.
        digests = [d for d, _ in map_ranks(con, rank_files(con), [], None)]
        t1 = time.perf_counter()
        # The reduce: calls matched across ranks, clocks, each rank's waits for the last arrival.
        matched = match(c for d in digests for c in d.calls)
        clock_offsets(matched, [d.rank for d in digests])
        waits = wait_intervals(matched)
        none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        for d in digests:
            with_waits(d.states, d.steps.start_ns, d.steps.end_ns, d.waitable, waits.get((d.rank, d.capture_window), none))
        t2 = time.perf_counter()
        # analyze's whole map: with the rules' digests (the part from the trace's device properties, an A100).
        for _ in map_ranks(con, rank_files(con), rules, None):
            pass
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    runs = [build() for _ in range(args.repeat)]
    per_rank, cross, with_rules = (statistics.median(r[i] for r in runs) for i in range(3))
    total = per_rank + cross
    print(json.dumps({"ranks": args.ranks}))
    print(f"{'stage':<34}{'seconds':>9}")
    print(f"{'ingest (' + str(args.ranks) + ' × 34.8 MB)':<34}{ingest_s:>9.2f}")
    print(f"{'per-rank timelines and sweeps':<34}{per_rank:>9.2f}")
    print(f"{'matching, clocks, waits':<34}{cross:>9.2f}")
    print(f"{'timelines total':<34}{total:>9.2f}   ({total / ingest_s:.2f} × ingest; bar: < 1 s)")
    label = "map with the rules' digests"
    print(f"{label:<34}{with_rules:>9.2f}   (the rules add {with_rules - per_rank:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
