"""Where one file's ingest spends its CPU, stage by stage, in one process: the profile behind the
ingest and analyze rows of bench/e2e.py.

    python bench/stages.py TRACE [--chunk-bytes N] [--db PATH]

Each stage is timed in CPU seconds of this process (time.process_time: every thread, DuckDB's
too), as the command runs it with `--jobs 1`: without pandas and with Arrow on the system allocator
(diag/cli.py's settings), the collector off during the parse as kineto_split does. The stages:
the imports an ingest needs; the read and hash (diag/ingest/source.py); the document's head,
which validates the whole document once (kineto_decode._decode_head); then per chunk of events
the piece's copy, msgspec's typed decode, the raw `args` decode, the tabulation into Arrow tables
(kineto_tabulate._tabulate) and the freeing of the chunk's objects; then DuckDB: the store's
start, the inserts (chunk by chunk, as the command's writer batches them) and the commit with its
checkpoint. The sum is near the whole process's CPU less the interpreter's start; bench/e2e.py
measures that whole process. cProfile distorts the Python-heavy stages (the tabulation most),
which is why this times stages instead.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

_START = time.process_time()   # the imports stage counts from here (the interpreter's start is before)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diag.runtime.no_pandas import keep_pandas_out  # noqa: E402

keep_pandas_out()
from diag.runtime.arrow_memory import use_system_allocator  # noqa: E402

use_system_allocator()


def stages(path: str, chunk_bytes: int, db: str) -> dict[str, float]:
    """CPU seconds per stage of ingesting `path` into a new store at `db`."""
    cpu = time.process_time
    out: dict[str, float] = {}
    import diag.ingest.pipeline  # noqa: F401  (what `diag ingest` imports)
    from diag.ingest import kineto_decode as kd
    from diag.ingest import kineto_split as ks
    from diag.ingest import kineto_tabulate as kt
    from diag.ingest.source import read_source
    from diag.runtime import store
    out["imports"] = cpu() - _START

    t = cpu()
    data = read_source(path, 2**62).data
    out["read + hash"] = cpu() - t
    t = cpu()
    head, _, _ = kd._decode_head(path, data, False)
    out["head (whole document validated)"] = cpu() - t

    pos, end = ks._span(data, head.traceEvents)
    mv, bad, chunks = memoryview(data), Counter[str](), []
    parse: dict[str, float] = {}
    last = cpu()

    def lap(stage: str) -> None:
        nonlocal last
        now = cpu()
        parse[stage] = parse.get(stage, 0.0) + now - last
        last = now

    gc.disable()
    while pos < end:
        cut, nxt = ks._cut(mv, pos, end, chunk_bytes)
        last = cpu()
        piece = ks._piece(mv, pos, cut)
        lap("piece copied")
        evs = kd._typed_events(piece, bad)
        lap("typed decode (msgspec)")
        raws = [r.args for r in kd._raw_args_decoder.decode(piece)]
        lap("raw args decode (msgspec)")
        tables, _ = kt._tabulate(evs, raws, bad)
        lap("tabulate (Arrow tables)")
        del evs, raws, piece
        lap("objects freed")
        chunks.append(tables)
        pos = nxt
    gc.enable()
    out.update(parse)

    t = cpu()
    con = store.connect(db)
    out["store opened"] = cpu() - t
    t = cpu()
    con.execute("BEGIN TRANSACTION")
    for tables in chunks:
        for name, table in tables.items():
            if table.num_rows:
                store.insert_from(con, f"INSERT INTO {name} (file_id, {', '.join(table.schema.names)}) "
                                       "SELECT 1, * FROM _incoming", table)
    out["inserts"] = cpu() - t
    t = cpu()
    con.execute("SET checkpoint_threshold = '0B'")   # the last file's commit checkpoints (store.FileWriter)
    con.execute("COMMIT")
    con.close()
    out["commit + checkpoint"] = cpu() - t
    return out


def main() -> None:
    from diag.ingest.kineto_split import DEFAULT_CHUNK_BYTES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES)
    ap.add_argument("--db", help="the store to write (default: a temporary file, removed)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or os.path.join(tmp, "stages.duckdb")
        got = stages(args.trace, args.chunk_bytes, db)
    mb = os.path.getsize(args.trace) / 1e6
    for name, s in got.items():
        print(f"{name:36} {s:6.3f} s")
    total = sum(got.values())
    print(f"{'total':36} {total:6.3f} s   ({mb:.1f} MB: {mb / total:.0f} MB per CPU second)")


if __name__ == "__main__":
    main()
