"""Reading hostile or changing input within bounded memory and disk (issue 15, items 7 and 8).

Each check runs its read in a fresh subprocess: a SIGBUS or a memory peak is that process's own,
measured from its RSS after imports to its peak (VmHWM).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from isal import isal_zlib

from diag.ingest import source
from diag.ingest.safe_pickle import MAX_ELEMENTS, load_plain
from diag.runtime.errors import BadInput

MB = 1024**2

_MEASURE = """
import json, os, sys
from diag.runtime.errors import BadInput
from diag.ingest import source, flight_recorder

def status_mb(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key)) / 1024

def written():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))

base, wrote = status_mb("VmRSS:"), written()
try:
    result = {"ok": repr(run())}
except BadInput as e:
    result = {"error": e.one_line()}
# VmHWM, not ru_maxrss: the latter keeps the peak of the forked parent's memory before the exec.
result["peak_mb"] = status_mb("VmHWM:") - base
result["written"] = written() - wrote
print(json.dumps(result))
"""


def measured(body: str, tmp_path: Path) -> dict[str, object]:
    """Run `def run(): ...` (BODY) in a fresh process: its result or BadInput line, its peak RSS
    above its start (MB) and the bytes it wrote (to any file, the temporary directory included)."""
    if not Path("/proc/self/io").exists():
        pytest.skip("needs Linux /proc (RSS and bytes written)")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", body + _MEASURE], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def gzip_bomb(path: Path, byte: bytes, size: int) -> Path:
    """`size` bytes of `byte`, gzipped (a few hundred kB per GB), written without holding them."""
    c = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)
    block = byte * (16 * MB)
    with path.open("wb") as f:
        for _ in range(size // len(block)):
            f.write(c.compress(block))
        f.write(c.flush())
    return path


# ---------------------------------------------------------------------------- item 7: no SIGBUS

def test_a_file_truncated_after_it_was_read_does_not_kill_the_process(tmp_path: Path) -> None:
    # Past the in-memory size the file used to be memory-mapped: cut short, its next page was a SIGBUS.
    path = tmp_path / "rank-0.json"
    path.write_bytes(b'{"traceEvents": [' + b" " * (2 * MB) + b"]}")
    body = f"""
def run():
    source.IN_MEMORY_BYTES = 4096
    src = source.read_source({str(path)!r})
    os.truncate({str(path)!r}, 0)
    return bytes(src.data[-2:])
"""
    out = measured(body, tmp_path)
    assert out["ok"] == repr(b"]}")


def test_a_file_that_shrinks_while_read_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.json"
    path.write_bytes(b"x" * (MB + 10))
    # stat saw more than is there by the time it is read: a writer truncated it in between.
    with path.open("rb") as f, pytest.raises(BadInput) as e:
        source._read_plain(str(path), f, 2 * MB)
    line = e.value.one_line()
    assert line.startswith(f"{path}: the file shrank while it was read ({MB + 10} of {2 * MB} bytes)"), line


# ------------------------------------------------------------------------- item 8: resource caps

def test_default_cap_is_4_gib_or_a_quarter_of_memory() -> None:
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert min(4 * 1024**3, ram // 4) == source.DEFAULT_MAX_BYTES


def test_a_gzip_bomb_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "rank-0.json.gz", b"\0", 512 * MB)
    out = measured(f"def run():\n    return source.read_source({str(bomb)!r}, max_bytes=256 * {MB})\n", tmp_path)
    assert "decompresses to more than the 268435456 byte cap" in str(out["error"])
    # It used to inflate the first 256 MB into a temporary file before the refusal (8.2 GB of a 10 GiB bomb).
    assert isinstance(out["written"], int) and out["written"] < MB, out
    assert isinstance(out["peak_mb"], float) and out["peak_mb"] < source.IN_MEMORY_BYTES / MB + 48, out


def test_a_bomb_whose_trailer_lies_is_refused_having_stored_at_most_the_cap(tmp_path: Path) -> None:
    """The trailer's size (ISIZE) is taken as a hint: one that understates a bomb has it inflated
    into that much memory, no more, before the counting pass refuses it at the cap."""
    bomb = gzip_bomb(tmp_path / "rank-0.json.gz", b"\0", 512 * MB)
    with bomb.open("r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write((200 * MB).to_bytes(4, "little"))
    out = measured(f"def run():\n    return source.read_source({str(bomb)!r}, max_bytes=256 * {MB})\n", tmp_path)
    assert "decompresses to more than the 268435456 byte cap" in str(out["error"])
    assert isinstance(out["peak_mb"], float) and out["peak_mb"] < 256, out


def test_a_whitespace_bomb_costs_one_times_its_size(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "rank-0.json.gz", b" ", 256 * MB)
    out = measured(f"def run():\n    return source.read_source({str(bomb)!r})\n", tmp_path)
    assert str(out["error"]).endswith("empty trace (only whitespace) (at byte 0)")
    # It peaked at twice the decompressed size: a full copy of it to strip.
    assert isinstance(out["peak_mb"], float) and out["peak_mb"] < 256 * 1.25, out


def test_a_pickle_of_a_huge_list_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    dump = tmp_path / "nccl_trace_rank_0"
    dump.write_bytes(pickle.dumps({"version": "2.10", "entries": [0] * 20_000_000}, protocol=4))
    assert dump.stat().st_size > 30 * MB
    body = f"""
def run():
    return flight_recorder.parse_pickle({str(dump)!r}, open({str(dump)!r}, "rb").read())
"""
    out = measured(body, tmp_path)
    assert f"more than the {MAX_ELEMENTS} a Flight Recorder dump can hold" in str(out["error"])
    # The 40 MB pickle's 20 M-element list is 160 MB of pointers; walking it once peaked at 1.9 GB.
    assert isinstance(out["peak_mb"], float) and out["peak_mb"] < 400, out


def test_element_cap_on_every_container(tmp_path: Path) -> None:
    nested = pickle.dumps({"entries": [{"frames": [0] * (MAX_ELEMENTS + 1)}]})
    with pytest.raises(BadInput, match="list of 1000001 elements"):
        load_plain("dump", nested)
    # Shared references still count once per copy.
    shared = [0] * 1000
    assert isinstance(load_plain("dump", pickle.dumps([shared] * 10)), list)
    with pytest.raises(BadInput, match="expands to more than"):
        load_plain("dump", pickle.dumps([[shared] * 1000] * 1000))
