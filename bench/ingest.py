"""Ingest speed and memory, side by side: gunzip alone, orjson.loads, HTA's parse, `diag ingest`.

    python bench/ingest.py [TRACE ...] [--big-mb 300] [--repeat 3]

With no TRACE it uses ../shared/traces' control.json.gz (34.8 MB of JSON) and a trace of at least
--big-mb MB made from it by repeating its steps with shifted timestamps. Every method runs on the
same file, in a fresh forked child of this one process (so each peak RSS is that method's own,
read from the child's ru_maxrss; baseline = the child's RSS before it starts), with every
library imported before the fork (no method pays for its imports). Time is the median
of --repeat runs. Prints a table and the ratios the issue sets as the bar: diag ≤ orjson.loads,
≥ 8× faster than HTA, less memory than HTA.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTROL = ROOT.parent / "shared/traces/HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz"


def gunzip(path: Path) -> None:
    with gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb") as f:
        f.read()


def orjson_loads(path: Path) -> None:
    import orjson

    with gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb") as f:
        orjson.loads(f.read())


def hta_parse(path: Path) -> None:
    import logging

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    d = Path(tempfile.mkdtemp())
    os.symlink(path, d / path.name)
    TraceAnalysis(trace_dir=str(d))


def diag_ingest(path: Path) -> None:
    from diag.ingest.options import IngestOptions
    from diag.ingest.pipeline import ingest
    from diag.runtime import store

    d = Path(tempfile.mkdtemp())
    con = store.connect(d / "run.duckdb")
    r = ingest([str(path)], con, IngestOptions())
    assert r.ingested and not r.errors, r.errors
    con.close()
    shutil.rmtree(d)


METHODS: dict[str, Callable[[Path], None]] = {
    "gunzip alone": gunzip,
    "orjson.loads": orjson_loads,
    "HTA TraceAnalysis parse": hta_parse,
    "diag ingest": diag_ingest,
}


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def measure(fn: Callable[[Path], None], path: Path) -> tuple[float, float]:
    """(seconds, peak MB above the child's starting RSS), run in a forked child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        base = _rss_kb()
        t = time.perf_counter()
        fn(path)
        dt = time.perf_counter() - t
        # A process the method forked (diag's second-half parser) counts whole beside it: an
        # upper bound, since the pages they share are counted twice.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        os.write(w, json.dumps([dt, (peak - base) / 1024]).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise RuntimeError(f"{fn.__name__} failed on {path}")
    dt, mb = json.loads(data)
    return dt, mb


def make_big(src: Path, min_mb: int, out: Path) -> Path:
    """Repeat the trace's steps until the file is ≥ min_mb MB, each copy a later stretch of the same
    run: timestamps shifted past the previous copy, ids (External id, correlation, Sequence number,
    flow ids) offset by ID_STRIDE per copy and ProfilerStep#N renumbered after the previous copy's
    steps (bench/scale.py's `shift_copy`), so that the file can be analyzed, not only ingested.
    Metadata, instant markers and the profiler's span are written once, the span stretched over
    every copy. Written one copy at a time."""
    import orjson
    from scale import ID_STRIDE, is_once, shift_copy, step_count

    with gzip.open(src, "rb") if src.name.endswith(".gz") else src.open("rb") as f:
        doc = orjson.loads(f.read())
    events = doc.pop("traceEvents")
    once = [e for e in events if is_once(e)]
    body = [e for e in events if not is_once(e)]
    ts = [e["ts"] + e.get("dur", 0) for e in body if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000
    steps = step_count(body)
    copies = max(1, -(-min_mb * 1_000_000 // len(orjson.dumps(body))))
    for e in once:
        if e.get("cat") == "Trace":
            e["dur"] = copies * span
    with out.open("wb") as f:
        f.write(orjson.dumps(doc)[:-1] + (b',"traceEvents":[' if doc else b'"traceEvents":['))
        f.write(orjson.dumps(once)[1:-1])
        for c in range(copies):
            part = orjson.dumps([shift_copy(e, c * span, c * ID_STRIDE, c * steps) for e in body])[1:-1]
            f.write(b"," + part if once or c else part)
        f.write(b"]}")
    return out


def _in_child(fn: Callable[..., Path], *args: object) -> Path:
    """Run `fn` in a forked child: building the big file parses GBs, and the heap it would leave
    behind, freed but still mapped, is reused by the measuring children without raising their RSS
    (every method's peak read ~30 MB low)."""
    pid = os.fork()
    if pid == 0:
        fn(*args)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"{fn.__name__} failed")
    return Path(str(args[-1]))


def _preload() -> None:
    """Import every method's libraries here, before forking, so that no child's time or memory
    counts an import (HTA's pandas and diag's duckdb/pyarrow alike)."""
    import logging

    import orjson  # noqa: F401

    import diag.ingest.pipeline  # noqa: F401
    import diag.runtime.store  # noqa: F401

    logging.disable(logging.WARNING)
    import hta.trace_analysis  # noqa: F401


def main() -> int:
    _preload()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--big-mb", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-hta-big", action="store_true", help="HTA on the big file takes minutes and GBs")
    args = ap.parse_args()
    files = list(args.traces)
    tmp = Path(tempfile.mkdtemp())
    if not files:
        if not CONTROL.exists():
            print(f"no trace given and {CONTROL} is absent", file=sys.stderr)
            return 2
        files = [CONTROL, _in_child(make_big, CONTROL, args.big_mb, tmp / "big_rank-3.json")]
    for path in files:
        if path.name.endswith(".gz"):
            with gzip.open(path) as f:    # counted in pieces: no file-sized buffer left in the heap
                size = sum(len(b) for b in iter(lambda: f.read(1 << 20), b""))
        else:
            size = path.stat().st_size
        print(f"\n{path.name}: {size / 1e6:.1f} MB of JSON")
        print(f"{'method':<26}{'time s':>9}{'peak MB':>10}{'× orjson':>10}")
        res: dict[str, tuple[float, float]] = {}
        for name, fn in METHODS.items():
            if name.startswith("HTA") and args.skip_hta_big and size > 100e6:
                continue
            runs = [measure(fn, path) for _ in range(args.repeat)]
            res[name] = (statistics.median(r[0] for r in runs), max(r[1] for r in runs))
        base = res["orjson.loads"][0]
        for name, (t, mb) in res.items():
            print(f"{name:<26}{t:>9.2f}{mb:>10.0f}{t / base:>10.2f}")
        d, o = res["diag ingest"], res["orjson.loads"]
        print(f"diag / orjson time: {d[0] / o[0]:.2f} (bar ≤ 1.0)")
        if "HTA TraceAnalysis parse" in res:
            h = res["HTA TraceAnalysis parse"]
            print(f"HTA / diag time: {h[0] / d[0]:.1f}× (bar ≥ 8×); diag / HTA peak memory: {d[1] / h[1]:.2f} (bar < 1)")
    shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
