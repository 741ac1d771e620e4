"""Every file is its own unit (issue 15, item 2): a file that cannot be read is one
`diag: warning:` naming it (escaped), and the files after it are still ingested and analyzed;
exit 0 when a trace made it in, 2 when none did. In live mode the same file never stops a poll."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
from helpers import run_diag

from diag.engine.run import AnalyzeOptions
from diag.ingest.options import IngestOptions
from fixtures.generate import generate
from fixtures.scenarios import Scenario
from tui.sources import Live

DATA = Path(__file__).parent / "data" / "nccl"
DEEP = 10**6
HEADER = '{"header":{"id":"0x1","rank":0,"n_ranks":2},"coll_perf":{"coll":"AllReduce","coll_sn":%s}}\n'
# Each breaks a parser a different way; `name` is bytes, so one of them need not be UTF-8.
BAD = {
    b"deep-pid1.log": '{"header":' + "[" * DEEP + "]" * DEEP + "}\n",
    b"digits-pid2.log": HEADER % ("9" * 5000),
    b"profiler_1_0.json": '[\n{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 0, "args": '
                          + "[" * DEEP + "]" * DEEP + "}\n",
    b"flight_trace_rank_0.json": '{"comm_lib_version": "2.21", "entries": [{"collective_seq_id": '
                                 + "7" * 5000 + "}]}",
}
NOT_UTF8 = b"node-\xff-pid9.log"   # a good Inspector log under a name that is not UTF-8


def _run_dir(tmp_path: Path, bad: bool = True, good: bool = True) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    if good:
        generate(Scenario(name="units", world_size=2, steps=2, layers=2), d)
        with open(os.path.join(os.fsencode(d), NOT_UTF8), "wb") as f:
            f.write((DATA / "inspector_node-017-pid1639453.json").read_bytes())
    if bad:
        for name, text in BAD.items():
            with open(os.path.join(os.fsencode(d), name), "w") as f:
                f.write(text)
    return d


def _warnings(stderr: str) -> list[str]:
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("diag: warning:")]


def test_bad_files_are_warnings_and_the_others_go_in(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    db = tmp_path / "x.duckdb"
    r = run_diag("ingest", str(d), "--db", str(db))
    warned = _warnings(r.stderr)
    assert r.returncode == 0, r.stderr
    assert sorted(w.split(": ")[2].rsplit("/", 1)[1] for w in warned) == sorted(n.decode() for n in BAD)
    assert any("nested too deeply" in w for w in warned) and any("5000" in w or "4300" in w for w in warned)
    con = duckdb.connect(str(db), read_only=True)
    paths = dict(con.execute("SELECT kind, list(path ORDER BY path) FROM trace_files GROUP BY kind").fetchall())
    con.close()
    assert len(paths["kineto"]) == 2
    # The name that is not UTF-8 is stored, and printed, with its odd byte escaped.
    assert [Path(p).name for p in paths["nccl_inspector"]] == ["node-\\xff-pid9.log"]
    assert "node-\\xff-pid9.log\trank=2" in r.stdout


def test_analyze_a_directory_with_bad_files(tmp_path: Path) -> None:
    d = _run_dir(tmp_path)
    r = run_diag("analyze", str(d), "--format", "json")
    assert r.returncode == 0 and len(_warnings(r.stderr)) == len(BAD), r.stderr
    assert '"world_size": 2' in r.stdout


def test_exit_2_when_no_file_made_it_in(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, good=False)
    r = run_diag("ingest", str(d), "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("diag: ")]) == len(BAD)


def test_live_polls_go_on_past_a_bad_file(tmp_path: Path) -> None:
    """The bad files land first; the traces after them are still ingested, poll after poll."""
    d = _run_dir(tmp_path, good=False)
    with open(os.path.join(os.fsencode(d), b"bad-\xff-pid4.log"), "w") as f:   # shown escaped, as it waits
        f.write(BAD[b"digits-pid2.log"])
    live = Live(str(d), None, AnalyzeOptions(), IngestOptions())
    for _ in range(2):   # a .log must hold still one poll before it is read
        live.poll()
    generate(Scenario(name="units", world_size=2, steps=2, layers=2), d)
    snap = None
    for _ in range(3):
        snap = live.poll() or snap
    assert snap is not None and snap.live is not None and snap.live.files == 2
    assert {Path(p.path).name for p in snap.live.pending} == {n.decode() for n in BAD} | {"bad-\\xff-pid4.log"}
