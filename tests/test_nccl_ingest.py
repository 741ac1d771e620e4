"""NCCL-side parsers: Flight Recorder (pickle, JSON), NCCL Inspector, NCCL example profiler plugin.

Samples in tests/data/nccl/, and where their format was checked:
- fr_dump_rank3.json: the JSON form as nlohmann::json writes it (compact, keys sorted), with the keys
  of pytorch torch/csrc/distributed/c10d/FlightRecorder.hpp and the layout of `dump_json` in
  FlightRecorderDetail.hpp; compared with a real `_dump_fr_trace_json()` from torch 2.13.
  The pickle form of the same dump is made in `_fr_pickle` the way `dump_dict` differs: tuples for
  process_group, None for undiscovered times, int pg_status, frames.
- fr_torch2.13_gloo_nccl_trace_rank_0: bytes written by torch 2.13's own `_dump_fr_trace()` (gloo, one rank);
  regenerate with the script in `_GLOO_DUMP_SCRIPT`.
- inspector_node-017-pid1639453.json: lines as NVIDIA/nccl ext-profiler/inspector/inspector.cc
  (`inspectorCommInfoDump`) and json.cc write them; values from the Inspector README's examples,
  bandwidths recomputed as `inspectorComputeCollBw` does. Named .json to prove detection by content.
- example_profiler_4242_1.json: events as ext-profiler/example/print_event.cc prints them (current
  version: Stream and datatype quoted), nested as `printEvent` walks them, closed with "{}]" as
  plugin.cc `exampleProfilerFinalize` does.
The real example-profiler dump from pha-Z/nccl lives in ../shared/traces (PROVENANCE.md there).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import NO_TRACES

from diag.ingest.nccl import detect_kind, parse_nccl_file
from diag.ingest.nccl_profiler import loads_lenient
from diag.ingest.nccl_rows import NCCL_OPS_SCHEMA, NcclParse, normalize_collective
from diag.ingest.safe_pickle import load_plain
from diag.runtime.errors import BadInput

DATA = Path(__file__).parent / "data" / "nccl"
FR_JSON = DATA / "fr_dump_rank3.json"
FR_GLOO = DATA / "fr_torch2.13_gloo_nccl_trace_rank_0"
INSPECTOR = DATA / "inspector_node-017-pid1639453.json"
PROFILER = DATA / "example_profiler_4242_1.json"
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
PHA_Z = (
    SHARED_TRACES
    / "pha-Z-nccl"
    / "example_profiler_p2p_trace.extracted_from_cursor_nccl_example_profiler_trace_reconstruction_md.json"
)

_GLOO_DUMP_SCRIPT = """
import os, sys
os.environ["TORCH_FR_BUFFER_SIZE"] = "16"
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29541", rank=0, world_size=1)
x = torch.ones(8, dtype=torch.bfloat16)
dist.all_reduce(x); dist.broadcast(x, 0); dist.barrier()
from torch._C._distributed_c10d import _dump_fr_trace
open(sys.argv[1], "wb").write(_dump_fr_trace())
"""


def _parse(path: Path, rank: int | None = None) -> NcclParse:
    return parse_nccl_file(str(path), path.read_bytes(), rank=rank)


def _facts(parsed: NcclParse) -> tuple[object, ...]:
    return parsed.kind, parsed.rank, parsed.rank_source, parsed.warnings


def _rows(parsed: NcclParse) -> list[dict[str, object]]:
    return [
        {k: v for k, v in row.items() if v is not None and k != "record"} for row in parsed.table.to_pylist()
    ]


def _fr_pickle(dump_json: bytes) -> bytes:
    """The pickle form of a JSON FR dump, as FlightRecorderDetail.hpp `dump_dict` would write it."""
    dump = json.loads(dump_json)
    for entry in dump.get("entries", []):
        entry["process_group"] = tuple(entry["process_group"])
        entry["frames"] = [{"filename": "train.py", "line": 42, "name": "train_step"}]
        for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            entry[key] = entry[key] or None
    for status in dump.get("pg_status", {}).values():
        status.update({k: int(v) for k, v in status.items()})
    del dump["nccl_comm_state"]  # dump_dict adds it only when a comm has state to report
    return pickle.dumps(dump, protocol=2)  # torch's pickle_str writes protocol 2


def test_table_has_exactly_the_nccl_ops_columns_of_schema_sql() -> None:
    sql = (Path(__file__).resolve().parents[1] / "diag" / "sql" / "schema.sql").read_text()
    table = re.search(r"CREATE TABLE IF NOT EXISTS nccl_ops \((.*?)\n\);", sql, re.S)
    assert table is not None
    columns = [
        m.groups() for line in table.group(1).splitlines() if (m := re.match(r"\s*(\w+)\s+(\w+)", line))
    ]
    arrow_of = {"INTEGER": pa.int32(), "BIGINT": pa.int64(), "VARCHAR": pa.string(), "DOUBLE": pa.float64()}
    arrow_of["JSON"] = pa.string()
    assert columns[:2] == [("file_id", "INTEGER"), ("rank", "INTEGER")]  # the store adds both
    assert [(name, arrow_of[sql_type]) for name, sql_type in columns[2:]] == [
        (f.name, f.type) for f in NCCL_OPS_SCHEMA
    ]


KINETO_HEAD = (
    b'{"schemaVersion": 1, "deviceProperties": [], "distributedInfo": {"backend": "nccl", "rank": 0, '
    b'"world_size": 2, "pg_count": 1, "pg_config": [{"pg_name": "0", "pg_desc": "default_pg"}]}, "traceEvents": ['
)


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (FR_JSON.read_bytes(), "flight_recorder_json"),
        (_fr_pickle(FR_JSON.read_bytes()), "flight_recorder_pickle"),
        (FR_GLOO.read_bytes(), "flight_recorder_pickle"),
        (INSPECTOR.read_bytes(), "nccl_inspector"),
        (PROFILER.read_bytes(), "nccl_profiler"),
        (b"[\n{}]\n", "nccl_profiler"),  # a plugin dump with no events
        (KINETO_HEAD, None),  # carries "pg_config" too
        (b'[{"name": "gemm", "cat": "GPU", "ph": "X", "ts": 1, "dur": 2}]', None),  # another Chrome trace
        (pickle.dumps([1, 2, 3], protocol=2), None),
        (b"", None),
    ],
)
def test_detect_kind_reads_content(head: bytes, kind: str | None) -> None:
    assert detect_kind(head[:4096]) == kind


def test_unknown_content_is_bad_input() -> None:
    with pytest.raises(BadInput, match=r"^notes\.txt: not a Flight Recorder dump"):
        parse_nccl_file("notes.txt", b"hello\n")


# Values below were read off fr_dump_rank3.json by hand.
FR_ROWS = [
    {
        "source": "flight_recorder", "record_idx": 0, "pg_name": "2", "pg_desc": "dp", "n_ranks": 2,
        "collective": "allreduce", "seq": 1, "in_nelems": 1048576, "out_nelems": 1048576,
        "msg_bytes": 2 * 1048576, "dtype": "BFloat16", "state": "completed",
        "start_ns": 1717171717000000123, "end_ns": 1717171717001500000, "duration_ns": 1_250_000,
    },
    {
        "source": "flight_recorder", "record_idx": 1, "pg_name": "1", "pg_desc": "tp", "n_ranks": 2,
        "collective": "reducescatter", "seq": 1, "in_nelems": 4096, "out_nelems": 2048,
        "msg_bytes": 4 * 2048, "dtype": "Float", "state": "started", "start_ns": 1717171717002000000,
    },
    {
        "source": "flight_recorder", "record_idx": 2, "pg_name": "1", "pg_desc": "tp", "n_ranks": 2,
        "collective": "send", "p2p_seq": 1, "in_nelems": 256, "out_nelems": 256, "msg_bytes": 1024,
        "dtype": "Float", "state": "scheduled", "start_ns": 1717171717002500000,
    },
    {
        "source": "flight_recorder", "record_idx": 3, "pg_name": "1", "pg_desc": "tp", "n_ranks": 2,
        "collective": "recv", "p2p_seq": 2, "in_nelems": 256, "out_nelems": 256, "msg_bytes": 1024,
        "dtype": "Float", "state": "scheduled", "start_ns": 1717171717002600000,
    },
    {
        "source": "flight_recorder", "record_idx": 4, "pg_name": "0", "pg_desc": "default_pg",
        "n_ranks": 4, "collective": "allgather", "seq": 1, "in_nelems": 128 + 64, "out_nelems": 512 + 256,
        "msg_bytes": 2 * (128 + 64), "dtype": "Half", "state": "completed",
        "start_ns": 1717171717003000000, "end_ns": 1717171717003090000, "duration_ns": 62_500,
    },
]  # fmt: skip


def test_flight_recorder_json_rows() -> None:
    parsed = _parse(FR_JSON)
    assert _facts(parsed) == ("flight_recorder", 3, "content", ())
    assert _rows(parsed) == FR_ROWS
    record = parsed.table.column("record")[0].as_py()
    assert '"time_created_ns":1717171717000000123' in record  # past 2**53: a float would end in ...000


def test_flight_recorder_pickle_without_extension(tmp_path: Path) -> None:
    path = tmp_path / "nccl_trace_rank_3"
    path.write_bytes(_fr_pickle(FR_JSON.read_bytes()))
    parsed = _parse(path)
    assert _facts(parsed) == ("flight_recorder", 3, "content", ())
    assert _rows(parsed) == FR_ROWS
    assert '"frames":[{"filename":"train.py"' in parsed.table.column("record")[0].as_py()


def test_flight_recorder_pickle_written_by_torch() -> None:
    parsed = _parse(FR_GLOO)
    # pg_config {"": {"ranks": "[0]"}}: the only group holds rank 0.
    assert (parsed.rank, parsed.rank_source, parsed.warnings) == (0, "content", ())
    rows = _rows(parsed)
    assert [r["collective"] for r in rows] == ["allreduce", "broadcast", "barrier"]
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert rows[0]["msg_bytes"] == 8 * 2  # ones(8, bfloat16)
    assert rows[0]["start_ns"] == 1796025903766696415
    assert all(r["state"] == "scheduled" and "end_ns" not in r for r in rows)


def _fr_json_without_pg_config() -> bytes:
    return re.sub(rb',"pg_config":\{.*?\}\},', b",", FR_JSON.read_bytes())


def test_flight_recorder_rank_from_file_name_with_warning(tmp_path: Path) -> None:
    path = tmp_path / "nccl_trace_rank_5.json"
    path.write_bytes(_fr_json_without_pg_config())
    parsed = _parse(path)
    assert (parsed.rank, parsed.rank_source) == (5, "filename")
    assert parsed.warnings == ("rank 5 taken from the file name: the dump does not record its own rank",)
    assert parsed.table.column("n_ranks").null_count == 5


def test_flight_recorder_content_rank_beats_file_name(tmp_path: Path) -> None:
    path = tmp_path / "nccl_trace_rank_7"
    path.write_bytes(FR_JSON.read_bytes())
    parsed = _parse(path)
    assert (parsed.rank, parsed.rank_source) == (3, "content")
    assert parsed.warnings == ("the dump's content makes it rank 3, its file name says 7; kept 3",)


def test_flight_recorder_without_any_rank(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_bytes(_fr_json_without_pg_config())
    parsed = _parse(path)
    assert (parsed.rank, parsed.rank_source) == (None, None)
    assert "no rank" in parsed.warnings[0]


def test_rank_given_on_the_command_line_wins() -> None:
    parsed = _parse(FR_JSON, rank=9)
    assert (parsed.rank, parsed.rank_source) == (9, "option")
    assert parsed.warnings == ("rank 9 given overrides rank 3 found in the file (content)",)


class _RunsShell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


class _Evals:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, (f"open({str(self.marker)!r}, 'w')",))


@pytest.mark.parametrize(
    ("payload_class", "protocol", "callable_name"),
    [(_RunsShell, 2, "posix.system"), (_Evals, 5, "builtins.eval")],
)
def test_malicious_pickle_is_refused_and_never_run(
    tmp_path: Path, payload_class: type[_RunsShell | _Evals], protocol: int, callable_name: str
) -> None:
    marker = tmp_path / "ran"
    payload = pickle.dumps(
        {"version": "2.10", "pg_config": {}, "entries": [payload_class(marker)]}, protocol=protocol
    )
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(payload)
    assert detect_kind(payload) == "flight_recorder_pickle"  # so it does reach the unpickler
    with pytest.raises(BadInput) as refused:
        _parse(path)
    assert refused.value.path == str(path)
    assert f"refused to import {callable_name}" in refused.value.reason
    assert not marker.exists()
    # The payload is live: plain pickle runs it.
    pickle.loads(payload)
    assert marker.exists()


def _shared_reference_bomb() -> object:
    # 30 levels of 10 references to the level below: ~300 bytes that stand for 10**30 lists.
    bomb: list[object] = []
    for _ in range(30):
        bomb = [bomb] * 10
    return bomb


def _contains_itself() -> object:
    loop: list[object] = []
    loop.append(loop)
    return loop


def _nested(depth: int) -> object:
    nest: list[object] = []
    for _ in range(depth):
        nest = [nest]
    return nest


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        (_shared_reference_bomb(), "expands to more than"),
        (_contains_itself(), "contains itself"),
        (_nested(100), "nests deeper than 64 levels"),
        ({1, 2}, "pickle holds a set"),  # protocol 4 builds sets without find_class (EMPTY_SET)
    ],
)
def test_pickle_that_is_not_a_plain_tree_is_refused(entries: object, reason: str) -> None:
    payload = pickle.dumps({"version": "2.10", "pg_config": {}, "entries": entries}, protocol=4)
    with pytest.raises(BadInput, match=reason):
        load_plain("dump", payload)


def test_real_dump_shares_frames_and_loads() -> None:
    dump = load_plain(str(FR_GLOO), FR_GLOO.read_bytes())
    assert isinstance(dump, dict)
    entries = dump["entries"]
    # torch pickles each distinct frame once; entries refer to it (BINGET), so the check must allow it.
    assert entries[0]["frames"][1] is entries[1]["frames"][1]


def test_truncated_pickle_is_bad_input(tmp_path: Path) -> None:
    data = _fr_pickle(FR_JSON.read_bytes())
    path = tmp_path / "nccl_trace_rank_3"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInput) as bad:
        _parse(path)
    assert bad.value.one_line().startswith(f"{path}: ")
    assert "pickle" in bad.value.reason


def test_garbled_flight_recorder_json_names_file_and_offset(tmp_path: Path) -> None:
    data = FR_JSON.read_bytes().replace(b'"op_id":2,', b'"op_id":2,,', 1)
    path = tmp_path / "fr.json"
    path.write_bytes(data)
    with pytest.raises(BadInput) as bad:
        _parse(path)
    assert bad.value.path == str(path)
    assert bad.value.offset == data.index(b",,") + 1


def test_inspector_rows() -> None:
    parsed = _parse(INSPECTOR)
    assert _facts(parsed) == ("nccl_inspector", 2, "content", ())
    common = {"source": "nccl_inspector"}
    assert _rows(parsed) == [
        {
            **common, "record_idx": 0, "pg_name": "0x7f8c496ae9f661", "comm_id": "0x7f8c496ae9f661",
            "n_ranks": 8, "collective": "allreduce", "seq": 1407, "msg_bytes": 17179869184,
            "duration_ns": 61_974_000, "algo_bw_gbps": 277.210914, "bus_bw_gbps": 485.119099,
        },
        {   # verbose: span of the kernel events, host µs × 1000
            **common, "record_idx": 1, "pg_name": "0xe62dedaa97644a", "comm_id": "0xe62dedaa97644a",
            "n_ranks": 4, "collective": "reducescatter", "seq": 1231, "msg_bytes": 536870912,
            "start_ns": 1752867229235181000, "end_ns": 1752867229276238000, "duration_ns": 41_057_000,
            "algo_bw_gbps": 52.304933, "bus_bw_gbps": 39.2287, "n_channels": 2,
        },
        {
            **common, "record_idx": 2, "pg_name": "0x7f8c496ae9f661", "comm_id": "0x7f8c496ae9f661",
            "n_ranks": 8, "collective": "allgather", "seq": 1409, "msg_bytes": 268435456,
            "duration_ns": 9_120_000, "algo_bw_gbps": 235.469698, "bus_bw_gbps": 206.035986,
        },
    ]  # fmt: skip


def test_inspector_unfinished_last_line_is_skipped_with_warning(tmp_path: Path) -> None:
    lines = INSPECTOR.read_bytes().splitlines(keepends=True)
    path = tmp_path / "node-017-pid1639453.log"
    path.write_bytes(lines[0] + lines[1] + lines[2][:100])
    parsed = _parse(path)
    assert parsed.table.num_rows == 2
    assert parsed.warnings == ("ignored the unfinished last line (100 bytes, no newline after it)",)


def test_inspector_garbled_line_names_line_and_offset(tmp_path: Path) -> None:
    lines = INSPECTOR.read_bytes().splitlines(keepends=True)
    bad_line = lines[1].replace(b'"coll_sn":1231', b'"coll_sn":12 31', 1)
    path = tmp_path / "node.log"
    path.write_bytes(lines[0] + bad_line + lines[2])
    with pytest.raises(BadInput, match=r"line 2 is not JSON \(Expecting ',' delimiter\)") as bad:
        _parse(path)
    assert bad.value.offset == len(lines[0]) + bad_line.index(b"12 31") + len(b"12 ")


def test_inspector_header_carries_to_lines_without_one(tmp_path: Path) -> None:
    path = tmp_path / "ctx.log"
    path.write_bytes(
        b'{"header":{"id":"0xabc","rank":5,"n_ranks":16,"nnodes":2}}\n'
        b'{"coll_perf":{"coll":"Broadcast","coll_sn":3,"coll_msg_size_bytes":64,"coll_exec_time_us":7}}\n'
    )
    parsed = _parse(path)
    assert _rows(parsed) == [
        {"source": "nccl_inspector", "record_idx": 1, "pg_name": "0xabc", "comm_id": "0xabc",
         "n_ranks": 16, "collective": "broadcast", "seq": 3, "msg_bytes": 64, "duration_ns": 7000},
    ]  # fmt: skip
    assert parsed.warnings == ("1 coll_perf line(s) without a header took the last header seen before them",)


def test_profiler_rows() -> None:
    parsed = _parse(PROFILER)
    assert (parsed.kind, parsed.rank, parsed.rank_source) == ("nccl_profiler", 1, "content")
    common = {"source": "nccl_profiler"}
    assert _rows(parsed) == [
        {   # 12715772615376301750 = 0xb0777fd29824eeb6; 166.001500 µs → 166001.5 ns, a tie: to even
            **common, "record_idx": 4, "pg_name": "0xb0777fd29824eeb6", "comm_id": "0xb0777fd29824eeb6",
            "collective": "allreduce", "seq": 7, "in_nelems": 1048576, "out_nelems": 1048576,
            "msg_bytes": 2 * 1048576, "dtype": "ncclBfloat16", "start_ns": 100_750, "end_ns": 166_002,
            "duration_ns": 65_252, "algorithm": "RING", "protocol": "SIMPLE", "n_channels": 2,
        },
        {   # 2**64 - 1 as CommHash; 230.000500 µs → 230000.5 ns, a tie: to even
            **common, "record_idx": 18, "pg_name": "0xffffffffffffffff", "comm_id": "0xffffffffffffffff",
            "collective": "send", "in_nelems": 4096, "msg_bytes": 4 * 4096, "dtype": "ncclFloat32",
            "start_ns": 200_500, "end_ns": 230_000, "duration_ns": 29_500, "n_channels": 1,
        },
    ]  # fmt: skip
    assert parsed.warnings == (
        "10 span(s) describe parts of operations and are not rows: "
        "PROXY 3, GROUP_API 2, GPU 2, KERNEL_LAUNCH 1, COLL_API 1, P2P_API 1",
    )
    assert '"CommHash":18446744073709551615' in parsed.table.column("record")[1].as_py()


def test_profiler_cut_inside_an_event_is_bad_input(tmp_path: Path) -> None:
    text = PROFILER.read_bytes()
    cut_line = text.index(b'{"name": "Send", "cat": "P2P", "ph": "e"')
    path = tmp_path / "prof.json"
    path.write_bytes(text[: cut_line + 30])
    with pytest.raises(BadInput, match="ends inside an event") as bad:
        _parse(path)
    assert bad.value.offset == cut_line


def test_profiler_garbled_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "prof.json"
    path.write_bytes(PROFILER.read_bytes().replace(b'"ph": "b", "id": 1,', b'"ph": "b" "id": 1,', 1))
    with pytest.raises(BadInput, match=r"not JSON even with bare words quoted") as bad:
        _parse(path)
    assert bad.value.path == str(path)


def test_values_that_do_not_fit_are_left_empty_with_a_warning(tmp_path: Path) -> None:
    # %f prints an infinite time as a bare inf; 2**62 float64 elements are 2**65 bytes.
    path = tmp_path / "prof.json"
    path.write_bytes(
        b'[\n{"name": "Send", "cat": "P2P", "ph": "b", "id": 0, "pid": 1, "tid": 1, "ts": inf, "args": '
        b'{"CommHash": 1, "Rank": 0, "Peer": 1, "Count": 4611686018427387904, "Datatype": "ncclFloat64"}},\n'
        b'{"name": "Send", "cat": "P2P", "ph": "e", "id": 0, "pid": 1, "tid": 1, "ts": 12.000000},\n{}]\n'
    )
    parsed = _parse(path)
    assert _rows(parsed) == [
        {"source": "nccl_profiler", "record_idx": 0, "pg_name": "0x1", "comm_id": "0x1",
         "collective": "send", "in_nelems": 2**62, "dtype": "ncclFloat64", "end_ns": 12_000},
    ]  # fmt: skip
    assert parsed.warnings == (
        "1 record(s) had an unusable 'ts' (wrong type or out of range; left empty)",
        "1 msg_bytes value(s) do not fit int64; left empty",
    )


def test_lenient_loader_quotes_bare_words_and_keeps_big_integers() -> None:
    text = '[{"a": 0x1f, "b": ncclFloat32, "c": -nan, "d": true, "e": null, "f": 18446744073709551615, "g": -1.5e3}]'
    assert loads_lenient("t.json", text) == (
        [{"a": "0x1f", "b": "ncclFloat32", "c": "-nan", "d": True, "e": None, "f": 2**64 - 1, "g": -1500.0}],
        [],
    )


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("all_reduce", "allreduce"), ("AllReduce", "allreduce"), ("allreduce_coalesced", "allreduce"),
        ("_allgather_base", "allgather"), ("all_gather_into_tensor_coalesced", "allgather"),
        ("ALLGATHER_coalesced", "allgather"), ("AllGather", "allgather"),
        ("_reduce_scatter_base", "reducescatter"), ("reduce_scatter_tensor_coalesced", "reducescatter"),
        ("REDUCE_SCATTER_coalesced", "reducescatter"), ("ReduceScatter", "reducescatter"),
        ("broadcast", "broadcast"), ("_broadcast_oop", "broadcast"), ("reduce", "reduce"),
        ("_reduce_oop", "reduce"), ("all_to_all", "alltoall"), ("all_to_all_v_single", "alltoall"),
        ("send", "send"), ("Recv", "recv"), ("all_reduce_barrier", "barrier"), ("barrier", "barrier"),
        ("gather", "gather"), ("coalesced", "coalesced"), ("SendRecv", "sendrecv"),
    ],
)  # fmt: skip
def test_normalize_collective(text: str, name: str) -> None:
    assert normalize_collective(text) == name


def test_real_profiler_dump_from_pha_z() -> None:
    if not PHA_Z.exists():
        pytest.skip(NO_TRACES)
    text = PHA_Z.read_text()
    parsed = _parse(PHA_Z)
    assert parsed.kind == "nccl_profiler"
    # One process drove ranks 0..3 of one communicator, so the file has no single rank.
    assert (parsed.rank, parsed.rank_source) == (None, None)
    assert parsed.warnings == (
        "the dump ends without its closing ']' (cut short between events); read the events before the cut",
        "1 span(s) have no end event: PROXY 1",
        "144 span(s) describe parts of operations and are not rows: "
        "GPU 128, P2P_API 8, KERNEL_LAUNCH 4, PROXY 3, GROUP_API 1",
        "records name 4 different communicator ranks (0, 1, 2, 3); the file's rank is left empty",
    )
    rows = _rows(parsed)
    assert [r["collective"] for r in rows] == ["send", "recv"] * 4
    # Line 12 of the file opens the first Send (element 10) and line 45 closes it:
    #   "ts": 1818542.097656, "args": {"CommHash": 12715772615376301750, "Rank": 0, "Peer": 1,
    #   "Count": 268435456, "Datatype": "ncclFloat32", "nChannels": 16}}  ...  "ts": 1818670.567871
    assert '"ts": 1818542.097656' in text.splitlines()[11] and '"ts": 1818670.567871' in text.splitlines()[44]
    assert rows[0] == {
        "source": "nccl_profiler", "record_idx": 10, "pg_name": "0xb0777fd29824eeb6",
        "comm_id": "0xb0777fd29824eeb6", "collective": "send", "in_nelems": 268435456,
        "msg_bytes": 4 * 268435456, "dtype": "ncclFloat32", "start_ns": 1_818_542_098,
        "end_ns": 1_818_670_568, "duration_ns": 128_470, "n_channels": 16,
    }  # fmt: skip
    assert {r["comm_id"] for r in rows} == {f"0x{12715772615376301750:x}"}
    # The API events print pointers and datatypes bare; the loader quotes them.
    events, _ = loads_lenient(str(PHA_Z), text)
    assert isinstance(events, list)
    assert events[9]["args"] == {
        "count": 268435456,
        "datatype": "ncclFloat32",
        "GraphCaptured": 0,
        "Stream": "0x4142e90",
    }
