"""Every report diag writes for the shared traces and the generated cases, hashed: the check that a
change meant to keep behaviour (a move, a split, a speed-up) kept every byte of every report.

    python scripts/report_hashes.py --out before.tsv         # on the old tree
    python scripts/report_hashes.py --out after.tsv --compare before.tsv

Each input is analyzed by the installed `diag` as a whole process, in every text format (json,
text, markdown), with no flags; a row is `input<TAB>format<TAB>exit code<TAB>sha256 of stdout`. The
generated cases are written once into `--cases-dir` (default: a temporary directory) with their
default seeds, so two runs see the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
FORMATS = ("json", "text", "markdown")
TRACE_SUFFIXES = (".json", ".json.gz")


def shared_inputs() -> list[Path]:
    return sorted(p for p in SHARED.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def case_inputs(cases_dir: Path) -> list[Path]:
    from fixtures.generate import generate

    out = []
    for case in sorted(p.name for p in (ROOT / "fixtures" / "cases").iterdir() if (p / "case.yml").exists()):
        target = cases_dir / case
        if not target.exists():
            generate(case, target)
        out.append(target)
    return out


def one(path: Path, fmt: str) -> tuple[str, str, int, str]:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "diag.cli", "analyze", str(path), "--format", fmt, "--db", f"{tmp}/run.duckdb"],
                              capture_output=True, env=env, stdin=subprocess.DEVNULL, cwd=tmp)
    return str(path), fmt, proc.returncode, hashlib.sha256(proc.stdout).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="TSV of input, format, exit code, hash")
    ap.add_argument("--compare", type=Path, help="a TSV written before: print every row that differs, exit 1 if any")
    ap.add_argument("--cases-dir", type=Path, help="where the generated cases are written (kept between runs)")
    ap.add_argument("--jobs", type=int, default=2, help="analyses at once")
    args = ap.parse_args()
    cases_dir = args.cases_dir or Path(tempfile.mkdtemp(prefix="diag-cases-"))
    cases_dir.mkdir(parents=True, exist_ok=True)
    inputs = shared_inputs() + case_inputs(cases_dir)
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda job: one(*job), [(p, f) for p in inputs for f in FORMATS]))
    root = str(cases_dir)
    lines = sorted(f"{p.replace(root, '<cases>')}\t{f}\t{rc}\t{h}" for p, f, rc, h in rows)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} reports of {len(inputs)} inputs hashed into {args.out}", file=sys.stderr)
    if args.compare is None:
        return 0
    before = set(args.compare.read_text().splitlines())
    changed = [line for line in lines if line not in before]
    for line in changed:
        print("differs:", line)
    print(f"{len(changed)} of {len(lines)} reports differ", file=sys.stderr)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
