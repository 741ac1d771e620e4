"""Fuzz `diag analyze` as whole processes: N damaged or hostile cases over Kineto and the three
NCCL-side formats (fixtures/fuzz.py), each run as `python -m diag.cli analyze DIR [options]` with a
10 s limit, and counted by exit code, traceback and hang; every exit-0 JSON report is checked by the
gate's validator. Failing cases are kept under --keep for replay.

    nice python scripts/fuzz.py [--cases 5000] [--jobs 2] [--seed 40] [--keep /tmp/fuzz-failures]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
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
    """(format, outcome): 'exit N', 'traceback', 'invalid report', 'hang' (60 s), 'slow' (over 10 s,
    under 60 s when run again)."""
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
    try:
        p = subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S, cwd=work)
        outcome = f"exit {p.returncode}"
        if b"Traceback (most recent call last)" in p.stderr:
            outcome = "traceback"
        elif p.returncode == 0 and options[-2:] == ["--format", "json"]:
            try:
                check_report(json.loads(p.stdout), str(directory))
            except (BadInput, ValueError) as e:
                outcome = "invalid report"
                p = subprocess.CompletedProcess(argv, 0, p.stdout, str(e).encode())
        if outcome == "traceback" or p.returncode not in ALLOWED or outcome == "invalid report":
            _keep(keep, case, directory, argv, p.stderr)
    except subprocess.TimeoutExpired:
        # Past 10 s on a shared machine may be the machine: run it again with 6× the time; only a
        # case that still does not end is a hang.
        try:
            subprocess.run(argv, capture_output=True, timeout=6 * TIMEOUT_S, cwd=work)
            outcome = "slow"
        except subprocess.TimeoutExpired:
            outcome = "hang"
        _keep(keep, case, directory, argv, outcome.encode())
    shutil.rmtree(directory, ignore_errors=True)
    return fmt, outcome


def _keep(keep: Path, case: int, directory: Path, argv: list[str], stderr: bytes) -> None:
    dest = keep / f"case-{case}"
    shutil.copytree(directory, dest, dirs_exist_ok=True)
    (dest / "argv.json").write_text(json.dumps(argv))
    (dest / "stderr.txt").write_bytes(stderr[-4000:])


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
    with tempfile.TemporaryDirectory() as work, ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_case, c, args.seed, Path(work), keep)
                   for c in range(args.first, args.first + args.cases)]
        for i, f in enumerate(futures, 1):
            counts[f.result()] += 1
            if i % 250 == 0:
                print(f"{i} cases, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    outcomes = Counter[str]()
    for (fmt, outcome), n in sorted(counts.items()):
        print(f"{fmt:16} {outcome:16} {n}")
        outcomes[outcome] += n
    print(f"all: {dict(sorted(outcomes.items()))} in {time.monotonic() - t0:.0f} s; failures kept in {keep}")
    bad = sum(n for o, n in outcomes.items() if o in ("traceback", "hang", "invalid report")
              or o.startswith("exit ") and int(o.split()[1]) not in ALLOWED)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
