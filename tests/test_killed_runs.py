"""A killed `diag ingest` or `diag analyze` leaves no process and, after the next run at the
latest, no temporary file (issue 15, item 6). The real CLI runs in a subprocess with its own
temporary directory; it is signalled once its helpers (parse workers, a forked half-parser, the
map's pool) are up, mid-work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_diag

from fixtures.generate import generate

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux")

# The real CLI, with a file's split (its second part parsed in a forked child) from 64 kB, not
# 16 MiB, and the analysis map's pool (engine._map_pool) from 2 files, not 512, one file a call.
_CLI = "import sys; from diag.engine import rank_map, run as engine; from diag.ingest import kineto_split; " \
       "kineto_split.SPLIT_BYTES = 1 << 16; engine.POOL_FILES = 2; engine.POOL_MEAN_EVENTS = 1 << 30; " \
       "rank_map.BATCH_FILES = 1; " \
       "from diag.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("killed") / "run"
    generate("healthy", out, world_size=8)
    return out


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, grandchildren), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    out = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(p)
    return out


def leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("diag-"))


def start_and_signal(traces: Path, tmp_path: Path, sig: int, jobs: str | None, helpers: int,
                     command: str = "ingest") -> tuple[set[int], Path]:
    """Start `diag COMMAND` (ingest into a new store, or analyze of `traces`), wait for `helpers`
    processes below it and its run's directory, send `sig`; the helpers seen."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    args = ["ingest", str(traces), "--db", str(tmp_path / "x.duckdb")] if command == "ingest" else \
        ["analyze", str(traces), "--format", "json"]
    args += ["--jobs", jobs] if jobs else []
    proc = subprocess.Popen([sys.executable, "-c", _CLI, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        seen |= descendants(proc.pid)
        if len(seen) >= helpers and any(tmp.glob("diag-run-*/owner")):
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"{command} ended before it could be interrupted: {proc.stderr.read() if proc.stderr else ''}"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    return seen, tmp


def gone(pids: set[int], timeout_s: float = 30) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_workers_end_with_a_killed_ingest(traces: Path, tmp_path: Path, sig: int) -> None:
    # --jobs 2: two spawned workers and multiprocessing's resource tracker.
    seen, tmp = start_and_signal(traces, tmp_path, sig, "2", helpers=2)
    assert not gone(seen), f"still running after {signal.Signals(sig).name}: {sorted(alive(seen))}"
    if sig != signal.SIGKILL:   # a run that could clean up did
        assert leftovers(tmp) == []
    # The next run removes what a run killed outright could not.
    env = {"TMPDIR": str(tmp)}
    assert run_diag("ingest", str(traces / "rank-0.json"), "--db", str(tmp_path / "y.duckdb"), env=env).returncode == 0
    assert leftovers(tmp) == []


def test_a_split_files_child_ends_with_a_killed_ingest(traces: Path, tmp_path: Path) -> None:
    # One small file is parsed in this process, on two cores: its second half in a forked child.
    if (os.cpu_count() or 1) < 2:
        pytest.skip("a file is split only where there are two cores")
    seen, tmp = start_and_signal(traces / "rank-1.json", tmp_path, signal.SIGKILL, None, helpers=1)
    assert not gone(seen)
    env = {"TMPDIR": str(tmp)}
    assert run_diag("ingest", str(traces / "rank-0.json"), "--db", str(tmp_path / "y.duckdb"), env=env).returncode == 0
    assert leftovers(tmp) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_map_pool_ends_with_a_killed_analyze(traces: Path, tmp_path: Path, sig: int) -> None:
    # A store's analysis on two spawned workers, its files exported one per call under the run's directory.
    db = tmp_path / "store.duckdb"
    assert run_diag("ingest", str(traces), "--db", str(db)).returncode == 0
    seen, tmp = start_and_signal(db, tmp_path, sig, "2", helpers=2, command="analyze")
    assert not gone(seen), f"still running after {signal.Signals(sig).name}: {sorted(alive(seen))}"
    if sig != signal.SIGKILL:
        assert leftovers(tmp) == []
    env = {"TMPDIR": str(tmp)}
    assert run_diag("ingest", str(traces / "rank-0.json"), "--db", str(tmp_path / "y.duckdb"), env=env).returncode == 0
    assert leftovers(tmp) == []


def test_a_live_runs_directory_is_left_alone(tmp_path: Path) -> None:
    from diag.runtime.lifetime import run_dir, sweep

    with run_dir(str(tmp_path)) as mine:
        assert sweep(str(tmp_path)) == [] and Path(mine).is_dir()
    assert leftovers(tmp_path) == []
