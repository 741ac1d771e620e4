"""Peak memory of `diag analyze` where the event count, not the bytes, is large (issue 40, item 11).

    python bench/memory.py [--events 28_800_000] [--fr-entries 999_999] [--data /tmp/diag-memory]

1. A Kineto trace of EVENTS tiny kernels (~75 bytes of JSON each: 28.8 M make 2.15 GB), in steps
   of STEP_KERNELS, written by a streaming writer (never held in memory), then `diag analyze` of it.
2. A Flight Recorder pickle of FR_ENTRIES entries of 10 fields each (999,999 make ~146 MB), beside a
   small Kineto trace, then `diag analyze` of the two.

Each is the real command line as a child process; its peak is the largest summed PSS of it and its
descendants (parse workers, a forked half), sampled every 50 ms (bench/scale.py's `measure`), with
its wall and CPU seconds. Files are written once and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import ROOT, measure  # noqa: E402

STEP_KERNELS = 100_000
# deviceProperties as torch writes them for an H100 SXM (../shared/traces hold real ones).
DEVICE = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85024112640, "computeMajor": 9,
          "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
          "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
          "sharedMemPerMultiprocessor": 233472, "numSms": 132, "sharedMemPerBlockOptin": 232448}


def write_tiny_trace(path: Path, events: int) -> None:
    """EVENTS kernels of 1 µs, 1 µs apart, named k0..k63, with a ProfilerStep#N span on the CPU
    (and its launch of the step's first kernel) every STEP_KERNELS kernels."""
    head = {"schemaVersion": 1, "deviceProperties": [DEVICE],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}}
    t0 = 1_700_000_000_000
    with open(path, "w") as f:
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        for step_first in range(0, events, STEP_KERNELS):
            n = min(STEP_KERNELS, events - step_first)
            ts = t0 + 2 * step_first
            f.write(f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{step_first // STEP_KERNELS}",'
                    f'"pid":1,"tid":1,"ts":{ts},"dur":{2 * n}}},\n'
                    f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":{ts},'
                    f'"dur":1,"args":{{"correlation":{step_first + 1}}}}},\n')
            f.write("".join(f'{{"ph":"X","cat":"kernel","name":"k{i % 64}","pid":0,"tid":7,"ts":{ts + 2 * (i - step_first)},'
                            f'"dur":1,"args":{{"correlation":{i + 1}}}}},\n' if i == step_first else
                            f'{{"ph":"X","cat":"kernel","name":"k{i % 64}","pid":0,"tid":7,"ts":{ts + 2 * (i - step_first)},"dur":1}},\n'
                            for i in range(step_first, step_first + n)))
        f.write('{"ph":"i","name":"end","pid":1,"tid":1,"ts":0,"s":"t"}\n]}\n')


def write_fr_pickle(path: Path, entries: int) -> None:
    """A Flight Recorder dump of ENTRIES all-reduces, 10 fields each, as torch pickles it."""
    dump = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}},
            "pg_status": {}, "comm_lib_version": "2.21.5",
            "entries": [{"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": i + 1,
                         "profiling_name": "nccl:all_reduce", "time_created_ns": 1_700_000_000_000_000_000 + 1000 * i,
                         "input_sizes": [[1024]], "input_dtypes": ["BFloat16"], "state": "completed",
                         "duration_ms": 0.01} for i in range(entries)]}
    with open(path, "wb") as f:
        pickle.dump(dump, f, protocol=4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=28_800_000)
    ap.add_argument("--fr-entries", type=int, default=999_999)
    ap.add_argument("--data", default="/tmp/diag-memory")
    ap.add_argument("--only", choices=("kineto", "fr"))
    args = ap.parse_args()
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "diag.cli", "analyze"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if args.only != "fr":
        trace = data / f"tiny-{args.events}" / "rank-0.json"
        if not trace.exists():
            trace.parent.mkdir(exist_ok=True)
            write_tiny_trace(trace.with_suffix(".tmp"), args.events)
            trace.with_suffix(".tmp").rename(trace)
        s = measure([*cmd, str(trace.parent), "--format", "json"], env)
        print(f"analyze {args.events:,} tiny events ({trace.stat().st_size / 1e9:.2f} GB): peak {s.peak_bytes / 1e9:.2f} GB, "
              f"{s.wall_s:.1f} s wall, {s.cpu_s:.1f} s CPU", flush=True)
    if args.only != "kineto":
        fr = data / f"fr-{args.fr_entries}"
        dump = fr / "nccl_trace_rank_0"
        if not dump.exists():
            fr.mkdir(exist_ok=True)
            write_fr_pickle(dump, args.fr_entries)
            write_tiny_trace(fr / "rank-0.json", 1000)   # NCCL-side dumps alone are not analyzed
        s = measure([*cmd, str(fr), "--format", "json"], env)
        print(f"analyze a Flight Recorder pickle of {args.fr_entries:,} entries ({dump.stat().st_size / 1e6:.0f} MB): "
              f"peak {s.peak_bytes / 1e9:.2f} GB, {s.wall_s:.1f} s wall, {s.cpu_s:.1f} s CPU", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
