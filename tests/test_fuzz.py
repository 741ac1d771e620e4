"""Random mutations of real files of every format diag reads (issue 15, "Tests"): whatever the
damage, a file's ingest ends in its rows, its warnings or one BadInput, never another exception.

Kineto traces (small ones from ../shared/traces), Flight Recorder JSON and pickle, NCCL Inspector
NDJSON and the NCCL profiler plugin's JSON (tests/data/nccl), each mutated with a fixed seed:
bytes flipped, spans cut, repeated or swapped, hostile tokens put in (huge or negative numbers,
NaN, deep nesting, other types), the end cut off, the result gzipped and the gzip damaged. Each
case runs the parse of one file in this process, as a worker does (parse_file.parse_into).
"""

from __future__ import annotations

import gzip
import random
import traceback
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import NO_TRACES, TRACES

from diag.ingest.options import IngestOptions, Skipped
from diag.ingest.parse_file import parse_into
from diag.runtime.errors import BadInput

SEED = 15
CASES = 3000
DATA = Path(__file__).parent / "data" / "nccl"
# Small real Kineto traces: a CUDA training step, a ROCm one, a Triton one.
KINETO = ("kineto/docs/traces/after_fix_trace.json",
          "HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
          "HolisticTraceAnalysis/tests/data/triton_example/triton_example.json.gz")
TOKENS = (b"null", b"-1", b"1e400", b"-9223372036854775809", b"18446744073709551616", b"NaN", b"Infinity",
          b'"x"', b"[]", b"{}", b"true", b"0.5", b"[" * 200, b"{" * 50, b'"\\ud800"', b"\xff\xfe", b"\x00",
          b"9" * 5000, b'"ph": "X"', b'"ts": -5', b'"dur": -1', b"\n", b",", b"]", b"}")


def samples() -> list[tuple[str, bytes]]:
    """(file name, decompressed content) of every sample there is."""
    out = [(p.name, p.read_bytes()) for p in sorted(DATA.iterdir())]
    for rel in KINETO:
        p = TRACES / rel
        if p.exists():
            data = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
            out.append(("rank-3.json", data))
    return out


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to three random edits."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        i = rng.randrange(len(b) + 1)
        j = min(len(b), i + rng.randint(1, 64))
        if op == 0 and b:                        # flip bytes
            for k in range(i, j):
                b[k] = rng.randrange(256)
        elif op == 1:                            # cut a span
            del b[i:j]
        elif op == 2:                            # repeat a span
            b[i:i] = b[i:j] * rng.randint(1, 50)
        elif op == 3:                            # a hostile token in place of a span
            b[i:j] = rng.choice(TOKENS)
        elif op == 4:                            # the end cut off (a killed writer)
            del b[i:]
        elif op == 5:                            # two spans swapped
            k = rng.randrange(len(b) + 1)
            lo, hi = sorted((i, k))
            b[lo:hi] = b[lo:hi][::-1] if rng.random() < 0.5 else b[lo:hi]
        else:                                    # a number's digits replaced by a long run
            b[i:i] = str(rng.choice((10**30, -(2**63), 2**64, 0))).encode()
    out = bytes(b)
    if rng.random() < 0.15:                      # gzipped, and sometimes the gzip damaged
        out = gzip.compress(out, 1)
        if rng.random() < 0.5 and len(out) > 20:
            out = out[: rng.randrange(10, len(out))]
    return out


class _Rows:
    """A sink that only counts (the store is not what is fuzzed here)."""

    def __init__(self) -> None:
        self.rank: int | None = None
        self.file_id = -1
        self.rows = 0

    def add(self, tables: dict[str, pa.Table]) -> None:
        self.rows += sum(t.num_rows for t in tables.values())

    def split(self, ranks: list[int]) -> None:
        pass   # a merged file's ranks: nothing to number here

    def flush(self) -> None:
        pass   # nothing buffered


def test_no_exception_escapes_a_files_ingest(tmp_path: Path) -> None:
    files = samples()
    if not any(name == "rank-3.json" for name, _ in files):
        pytest.skip(NO_TRACES)
    rng = random.Random(SEED)
    escaped: list[str] = []
    outcomes = {"rows": 0, "bad input": 0, "skipped": 0}
    for case in range(CASES):
        name, data = files[case % len(files)]
        mutated = mutate(rng, data)
        path = tmp_path / (name + (".gz" if mutated[:2] == b"\x1f\x8b" and name.endswith(".json") else ""))
        path.write_bytes(mutated)
        opts = IngestOptions(salvage=case % 3 == 0)
        try:
            out = parse_into(str(path), frozenset(), opts, True, _Rows())
            outcomes["skipped" if isinstance(out, Skipped) else "rows"] += 1
        except BadInput as e:
            assert "\n" not in e.one_line()
            outcomes["bad input"] += 1
        except Exception:
            escaped.append(f"case {case} ({name}): {traceback.format_exc(limit=-3)}")
        path.unlink()
    assert not escaped, f"{len(escaped)} of {CASES} escaped; first:\n" + "\n".join(escaped[:3])
    # The mutations must leave some files readable and break others, or they test nothing.
    assert outcomes["rows"] > CASES // 10 and outcomes["bad input"] > CASES // 10, outcomes
