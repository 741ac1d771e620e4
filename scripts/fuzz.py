"""Fuzz `diag analyze` as whole processes: N damaged or hostile cases over Kineto and the three
NCCL-side formats (fixtures/fuzz.py), each run as `python -m diag.cli analyze DIR [options]` with a
10 s limit (of CPU; wall time is said beside: a busy machine stretches it), counted by exit code,
traceback and hang; every exit-0 JSON report is checked by the gate's validator. Failing cases are
kept under --keep for replay.

    nice python scripts/fuzz.py [--cases 5000] [--jobs 2] [--seed 40] [--keep /tmp/fuzz-failures]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diag.outputs.gate import check_report  # noqa: E402
from diag.runtime.errors import BadInput  # noqa: E402
from fixtures.fuzz import FORMATS, hostile_options, mutate, samples, write_case  # noqa: E402

TIMEOUT_S = 10
# Exit codes a case may end with: ok, gate failed (never from analyze), bad input.
ALLOWED = {0, 2}


def run_case(case: int, seed: int, work: Path, keep: Path) -> tuple[str, str]:
    """(format, outcome): 'exit N', 'traceback', 'invalid report' or 'hang', with '(over 10 s of
    wall)' when it ended past TIMEOUT_S of wall time (on a busy machine)."""
    rng = random.Random(seed * 1_000_003 + case)
    by_format = samples()
    fmt = FORMATS[case % len(FORMATS)] if by_format["kineto"] else FORMATS[1 + case % 3]
    s = rng.choice(by_format[fmt])
    kineto = by_format["kineto"][0].data if by_format["kineto"] else None
    directory = write_case(work / f"case-{case}", s, mutate(rng, s), kineto)
    options = hostile_options(rng) if rng.random() < 0.3 else []
    if "--format" not in options and rng.random() < 0.7:
        options += ["--format", "json"]
    argv = [sys.executable, "-m", "diag.cli", "analyze", str(directory), *options]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work)
    ended, wall_s = _wait(p)
    stdout, stderr = p.communicate()
    if not ended:
        outcome = "hang"
    elif b"Traceback (most recent call last)" in stderr:
        outcome = "traceback"
    else:
        outcome = f"exit {p.returncode}"
        if p.returncode == 0 and options[-2:] == ["--format", "json"]:
            try:
                check_report(json.loads(stdout), str(directory))
            except (BadInput, ValueError) as e:
                outcome, stderr = "invalid report", str(e).encode()
    if outcome in ("hang", "traceback", "invalid report") or p.returncode not in ALLOWED:
        _keep(keep, case, directory, argv, stderr)
    if ended and wall_s > TIMEOUT_S:
        outcome += f" (over {TIMEOUT_S} s of wall)"
    shutil.rmtree(directory, ignore_errors=True)
    return fmt, outcome


def _wait(p: subprocess.Popen[bytes]) -> tuple[bool, float]:
    """(ended, wall seconds): a case may use TIMEOUT_S of CPU (its process tree's), or 12× that of
    wall: on a machine shared with others (a load of 10 on 2 cores) wall time says little. A case
    past either is killed, a hang."""
    t0 = time.monotonic()
    while p.poll() is None:
        wall_s = time.monotonic() - t0
        if _tree_cpu_s(p.pid) > TIMEOUT_S or wall_s > 12 * TIMEOUT_S:
            for pid in reversed(_tree(p.pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            p.wait()
            return False, wall_s
        time.sleep(0.2)
    return True, time.monotonic() - t0


def _tree(pid: int) -> list[int]:
    """pid and its descendants, parents first (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in glob.glob(f"/proc/{p}/task/*/children"):
            with contextlib.suppress(OSError), open(task) as f:
                todo.extend(int(c) for c in f.read().split())
    return out


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds used by pid's process tree, children it waited for included."""
    ticks = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            ticks += sum(int(x) for x in fields[11:15])   # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _keep(keep: Path, case: int, directory: Path, argv: list[str], stderr: bytes) -> None:
    dest = keep / f"case-{case}"
    shutil.copytree(directory, dest, dirs_exist_ok=True)
    (dest / "argv.json").write_text(json.dumps(argv))
    (dest / "stderr.txt").write_bytes(stderr[-4000:])


def _totals(counts: Counter[tuple[str, str]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for (_, outcome), n in counts.items():
        out[outcome] += n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--first", type=int, default=0, help="the first case number (to resume or replay)")
    ap.add_argument("--keep", default=str(Path(tempfile.gettempdir()) / "diag-fuzz-failures"))
    args = ap.parse_args()
    keep = Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    counts: Counter[tuple[str, str]] = Counter()
    t0 = time.monotonic()
    # SIGTERM ends the run early with the counts so far (a shared machine's time runs out).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    with tempfile.TemporaryDirectory() as work, ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_case, c, args.seed, Path(work), keep)
                   for c in range(args.first, args.first + args.cases)]
        try:
            for i, f in enumerate(futures, 1):
                counts[f.result()] += 1
                if i % 50 == 0:
                    print(f"{i} cases, {time.monotonic() - t0:.0f} s: {dict(_totals(counts))}", file=sys.stderr,
                          flush=True)
        except (KeyboardInterrupt, SystemExit):
            for f in futures:
                f.cancel()
            print(f"stopped after {sum(counts.values())} cases", flush=True)
    for (fmt, outcome), n in sorted(counts.items()):
        print(f"{fmt:16} {outcome:16} {n}")
    outcomes = _totals(counts)
    print(f"all: {dict(sorted(outcomes.items()))} in {time.monotonic() - t0:.0f} s; failures kept in {keep}")
    bad = sum(n for o, n in outcomes.items() if o.split(" (")[0] in ("traceback", "hang", "invalid report")
              or o.startswith("exit ") and int(o.split()[1]) not in ALLOWED)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
