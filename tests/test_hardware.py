"""diag.knowledge.hardware and diag.knowledge.links: the figures DESIGN.md fixes, part identification, bus factors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import NO_TRACES

from diag.knowledge import hardware
from diag.knowledge.hardware import (
    PARTS,
    dense_peak_tflops,
    dtype_from_trace,
    identify,
    ridge_flop_per_byte,
    sparse_peak_matches,
    sparse_peak_tflops,
)
from diag.knowledge.links import LINKS, bus_factor, normalize_collective

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


@pytest.mark.parametrize(
    ("key", "dtype", "tflops"),
    [
        # DESIGN.md: "Dense peaks, TFLOP/s: H100 SXM (and H200) bf16/fp16 989, fp8 1979, tf32 495;
        # H100 PCIe bf16 756; H100 NVL bf16 835; A100 bf16 312."
        ("h100-sxm", "bf16", 989),
        ("h100-sxm", "fp16", 989),
        ("h100-sxm", "fp8", 1979),
        ("h100-sxm", "tf32", 495),
        ("h200", "bf16", 989),
        ("h200", "fp16", 989),
        ("h200", "fp8", 1979),
        ("h200", "tf32", 495),
        ("h800", "bf16", 989),
        ("gh200", "bf16", 989),
        ("h100-pcie", "bf16", 756),
        ("h100-nvl", "bf16", 835),
        ("a100", "bf16", 312),
        ("a100-40gb", "bf16", 312),
        ("a100-80gb", "bf16", 312),
        ("a100-80gb-pcie", "bf16", 312),
        ("v100", "fp16", 125),
        ("b200", "bf16", 2250),
        ("h100-sxm", "fp32", 67),
        ("a100", "fp32", 19.5),
        ("a100", "int8", 624),
    ],
)
def test_dense_peaks_are_designs_figures(key: str, dtype: str, tflops: float) -> None:
    assert dense_peak_tflops(PARTS[key], dtype) == tflops


@pytest.mark.parametrize(
    ("key", "hbm_gbps", "nvlink_gbps", "sms"),
    [
        ("h100-sxm", 3350, 450, 132),
        ("h100-pcie", 2000, 300, 114),
        ("h100-nvl", 3900, 300, 132),
        ("h200", 4800, 450, 132),
        ("a100-80gb", 2039, 300, 108),
        ("a100-40gb", 1555, 300, 108),
        ("b200", 8000, 900, 148),
        ("v100", 900, 150, 80),
    ],
)
def test_memory_and_link_figures(key: str, hbm_gbps: float, nvlink_gbps: float, sms: int) -> None:
    part = PARTS[key]
    assert (part.hbm_gbps, part.nvlink_gbps, part.sms) == (hbm_gbps, nvlink_gbps, sms)


def test_every_cli_name_is_a_part_with_a_cited_source() -> None:
    assert {
        "h100-sxm",
        "h100-pcie",
        "h100-nvl",
        "h200",
        "h800",
        "gh200",
        "a100",
        "a100-40gb",
        "a100-80gb",
        "b200",
        "v100",
    } <= set(PARTS)
    for key, part in PARTS.items():
        assert part.key == key or hardware.ALIASES[key] == part.key
        assert "datasheet" in part.source or "brief" in part.source or "whitepaper" in part.source
        assert part.dense_tflops and all(v > 0 for v in part.dense_tflops.values())


@pytest.mark.parametrize(
    ("typed", "key", "noted"),
    [
        ("h100-sxm", "h100-sxm", False),
        (" H100-SXM ", "h100-sxm", False),
        ("H100 SXM", "h100-sxm", False),          # the datasheet name
        ("h100_pcie", "h100-pcie", False),
        ("NVIDIA H100 80GB HBM3", "h100-sxm", False),   # deviceProperties.name of an SXM H100
        ("NVIDIA H100 PCIe", "h100-pcie", False),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb", False),
        ("h100", "h100-sxm", True),               # SXM, PCIe and NVL share the short name
        ("H100", "h100-sxm", True),
        ("NVIDIA H100", "h100-sxm", True),
        ("a100", "a100-80gb", True),
        ("h200", "h200", False),                  # a key, though an NVL part shares the prefix
    ],
)
def test_resolve_part_takes_what_people_type(typed: str, key: str, noted: bool) -> None:
    found = hardware.resolve_part(typed)
    assert found.part is PARTS[key]
    assert (found.note is not None) == noted
    assert found.note is None or found.part.name in found.note


def test_resolve_part_names_the_candidates_or_the_valid_names() -> None:
    with pytest.raises(ValueError, match="gh200, gh200-144gb"):
        hardware.resolve_part("NVIDIA GH200 480GB")      # memory alone tells the two apart
    with pytest.raises(ValueError, match="unknown GPU 'h1000'") as error:
        hardware.resolve_part("h1000")
    assert "a100-40gb" in str(error.value) and "h100-sxm" in str(error.value)


def test_every_part_resolves_by_its_key_and_its_name() -> None:
    """Data-driven: a part added to the table resolves without code."""
    for part in set(PARTS.values()):
        assert hardware.resolve_part(part.key).part is part
        assert hardware.resolve_part(part.name).part is part
        assert hardware.resolve_part(part.key.upper()).part is part


def test_a_dtype_the_part_lacks_is_an_error_not_a_neighbours_figure() -> None:
    with pytest.raises(ValueError, match="no bf16 peak"):
        dense_peak_tflops(PARTS["v100"], "bf16")
    with pytest.raises(ValueError, match="no fp8 peak"):
        dense_peak_tflops(PARTS["a100"], "fp8")


def test_sparse_is_twice_dense_for_tensor_dtypes_only() -> None:
    h100 = PARTS["h100-sxm"]
    assert sparse_peak_tflops(h100, "bf16") == 2 * 989
    assert sparse_peak_tflops(h100, "fp8") == 2 * 1979
    assert sparse_peak_tflops(h100, "fp32") is None  # CUDA cores: no structured sparsity
    assert sparse_peak_tflops(PARTS["v100"], "fp16") is None  # Volta has none
    assert sparse_peak_tflops(PARTS["a100"], "fp8") is None


@pytest.mark.parametrize(
    ("datasheet_sparse_figure", "dtype", "key"),
    [
        # The figures datasheets print "with sparsity" (MFU007's wrong denominators).
        (1979, "bf16", "h100-sxm"),
        (1979, "fp16", "h200"),
        (3958, "fp8", "h100-sxm"),
        (989, "tf32", "h100-sxm"),
        (1513, "bf16", "h100-pcie"),
        (1671, "bf16", "h100-nvl"),
        (624, "bf16", "a100-80gb"),
        (4500, "bf16", "b200"),
    ],
)
def test_sparse_peak_matches_finds_datasheet_sparse_figures(
    datasheet_sparse_figure: float, dtype: str, key: str
) -> None:
    matches = sparse_peak_matches(datasheet_sparse_figure)
    assert (PARTS[key], dtype) in matches


def test_sparse_peak_matches_ignores_dense_figures_for_the_runs_dtype() -> None:
    assert sparse_peak_matches(989, dtype="bf16") == []  # 989 is H100 bf16 dense (and tf32 sparse)
    assert sparse_peak_matches(1979, dtype="fp8") == []  # fp8 dense: a correct peak for an fp8 run
    assert sparse_peak_matches(312, dtype="bf16") == []
    assert sparse_peak_matches(1000) == []


def test_ridge_point() -> None:
    # DESIGN.md: "ridge point ~ peak / HBM bandwidth ~ 300 FLOP/byte" on H100.
    assert ridge_flop_per_byte(PARTS["h100-sxm"], "bf16") == pytest.approx(295.2, abs=0.1)
    assert ridge_flop_per_byte(PARTS["a100-80gb"], "bf16") == pytest.approx(153.0, abs=0.1)


@pytest.mark.parametrize(
    ("props", "key"),
    [
        # Real deviceProperties, from ../shared/traces (see test_identify_real_traces).
        ({"name": "NVIDIA H100", "numSms": 132, "totalGlobalMem": 102085492736}, "h100-nvl"),
        ({"name": "NVIDIA A100-PG509-200", "numSms": 108, "totalGlobalMem": 42297524224}, "a100-40gb"),
        ({"name": "NVIDIA A100-SXM4-80GB", "numSms": 108, "totalGlobalMem": 84990623744}, "a100-80gb"),
        ({"name": "Tesla V100-SXM2-32GB", "numSms": 80, "totalGlobalMem": 34089730048}, "v100"),
        ({"name": "Tesla V100-SXM2-16GB", "numSms": 80, "totalGlobalMem": 16945512448}, "v100"),
        # Names as the driver reports them on other parts.
        ({"name": "NVIDIA H100 80GB HBM3", "numSms": 132, "totalGlobalMem": 85031714816}, "h100-sxm"),
        ({"name": "NVIDIA H100 PCIe", "numSms": 114, "totalGlobalMem": 85029158912}, "h100-pcie"),
        ({"name": "NVIDIA H100 NVL", "numSms": 132, "totalGlobalMem": 100485857280}, "h100-nvl"),
        ({"name": "NVIDIA H200", "numSms": 132, "totalGlobalMem": 150754820096}, "h200"),
        ({"name": "NVIDIA H200 NVL", "numSms": 132, "totalGlobalMem": 150754820096}, "h200-nvl"),
        ({"name": "NVIDIA H800", "numSms": 132, "totalGlobalMem": 85021163520}, "h800"),
        ({"name": "NVIDIA GH200 480GB", "numSms": 132, "totalGlobalMem": 102005473280}, "gh200"),
        ({"name": "NVIDIA GH200 144G HBM3e", "numSms": 132, "totalGlobalMem": 153163808768}, "gh200-144gb"),
        ({"name": "NVIDIA A100 80GB PCIe", "numSms": 108, "totalGlobalMem": 85097971712}, "a100-80gb-pcie"),
        ({"name": "NVIDIA A100-SXM4-40GB", "numSms": 108, "totalGlobalMem": 42505273344}, "a100-40gb"),
        ({"name": "NVIDIA B200", "numSms": 148, "totalGlobalMem": 191476826112}, "b200"),
        # Parts added for issue 13: every V100 variant, Ampere/Ada inference parts, H20, GB200, AMD.
        ({"name": "Tesla V100-PCIE-32GB", "numSms": 80, "totalGlobalMem": 34089730048}, "v100-pcie"),
        ({"name": "Tesla V100-PCIE-16GB", "numSms": 80, "totalGlobalMem": 16945512448}, "v100-pcie"),
        ({"name": "Tesla V100S-PCIE-32GB", "numSms": 80, "totalGlobalMem": 34089730048}, "v100s-pcie"),
        ({"name": "Tesla V100-DGXS-32GB", "numSms": 80, "totalGlobalMem": 34089730048}, "v100-dgxs"),
        ({"name": "Tesla V100-DGXS-16GB", "numSms": 80, "totalGlobalMem": 16945512448}, "v100-dgxs-16gb"),
        ({"name": "NVIDIA A100-PCIE-40GB", "numSms": 108, "totalGlobalMem": 42505273344}, "a100-40gb"),
        ({"name": "NVIDIA A10", "numSms": 72, "totalGlobalMem": 23836033024}, "a10"),
        ({"name": "NVIDIA L4", "numSms": 58, "totalGlobalMem": 23580639232}, "l4"),
        ({"name": "NVIDIA L40S", "numSms": 142, "totalGlobalMem": 47697362944}, "l40s"),
        ({"name": "NVIDIA H20", "numSms": 78, "totalGlobalMem": 102005473280}, "h20"),
        ({"name": "NVIDIA GB200", "numSms": 152, "totalGlobalMem": 199495335936}, "gb200"),
        ({"name": "AMD Instinct MI300X", "numSms": 304, "totalGlobalMem": 206141652992}, "mi300x"),
        ({"name": "AMD Radeon Graphics", "numSms": 304, "totalGlobalMem": 206141652992}, "mi300x"),
        ({"name": "AMD Radeon Graphics", "numSms": 304, "totalGlobalMem": 274877906944}, "mi325x"),
        ({"name": "AMD Instinct MI355X", "numSms": 256, "totalGlobalMem": 309237645312}, "mi355x"),
        ({"name": "AMD Radeon Graphics", "numSms": 110, "totalGlobalMem": 68702699520}, "mi250x"),
        # Real deviceProperties from ../shared/traces: the HTA MI250 capture, the param RTX 2080 Ti
        # captures and the HTA Quadro GP100 capture.
        ({"name": "AMD Radeon Graphics", "numSms": 104, "totalGlobalMem": 68702699520}, "mi250"),
        ({"name": "NVIDIA GeForce RTX 2080 Ti", "numSms": 68, "totalGlobalMem": 11554586624}, "rtx-2080-ti"),
        ({"name": "Quadro GP100", "numSms": 56, "totalGlobalMem": 17069309952}, "quadro-gp100"),
        # The name alone when it is unambiguous.
        ({"name": "NVIDIA H100 80GB HBM3"}, "h100-sxm"),
    ],
)
def test_identify(props: dict[str, Any], key: str) -> None:
    found = identify(props)
    assert found is not None and found.part is PARTS[key]
    assert props["name"] in found.reason


@pytest.mark.parametrize(
    "props",
    [
        {"name": "AMD Radeon Graphics", "numSms": 228, "totalGlobalMem": 137438953472},  # MI300A: not listed
        {"name": "AMD Radeon Graphics", "numSms": 304},  # MI300X or MI325X: memory must say
        {"name": "NVIDIA A10G", "numSms": 80},  # the AWS part: other peaks than the A10
        {"name": "Tesla V100-SXM3-32GB", "numSms": 80},  # DGX-2's V100 at higher clocks: not listed
        {"name": "NVIDIA H100"},  # SXM, PCIe or NVL: nothing says which
        {"name": "NVIDIA H100", "numSms": 132},  # SXM or NVL
        {"name": "NVIDIA H100", "numSms": 100, "totalGlobalMem": 85031714816},  # no such variant
        {"name": "NVIDIA H100 PCIe", "numSms": 132},  # contradicts itself
        {"name": "NVIDIA H800 PCIe", "numSms": 114},  # not listed: no borrowing H100 PCIe's figures
        {"name": "NVIDIA GB200", "numSms": 148},  # a GB200 reports 152 SMs, not the B200's 148
        {"name": "NVIDIA GH200", "numSms": 132, "totalGlobalMem": 120e9},  # neither 96 nor 144 GB
        {"numSms": 132},
        {"name": None},
        {},
    ],
)
def test_identify_never_falls_back(props: dict[str, Any]) -> None:
    assert identify(props) is None


@pytest.mark.parametrize(
    ("relpath", "key"),
    [
        ("kineto/docs/traces/after_fix_trace.json", "h100-nvl"),
        (
            "HolisticTraceAnalysis/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
            "a100-40gb",
        ),
        ("HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz", "a100-80gb"),
        (
            "HolisticTraceAnalysis/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
            "v100",
        ),
        ("HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "mi250"),
        ("HolisticTraceAnalysis/tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz", "quadro-gp100"),
        ("HolisticTraceAnalysis/tests/data/trace_diff/test/test.json.gz", "v100"),
        ("param/et_replay/tests/inputs/resnet_kineto.json.gz", "rtx-2080-ti"),
    ],
)
def test_identify_real_traces(relpath: str, key: str | None) -> None:
    path = TRACES / relpath
    if not path.exists():
        pytest.skip(NO_TRACES)
    # Kineto writes deviceProperties at the top of the file: read the head, not the whole trace.
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        head = f.read(1 << 16)
    start = head.index("[", head.index('"deviceProperties"'))
    props = json.JSONDecoder().raw_decode(head, start)[0][0]
    found = identify(props)
    assert (found.part if found else None) is (PARTS[key] if key else None)


_ROWS = sorted(set(PARTS.values()), key=lambda p: p.key)


@pytest.mark.parametrize("part", _ROWS, ids=[p.key for p in _ROWS])
def test_every_part_row_is_identified_from_its_example(part: hardware.Part) -> None:
    """Each row's example name, with its SM count and memory, identifies that row and no other."""
    found = identify({"name": part.example, "numSms": part.sms, "totalGlobalMem": part.mem_gib * 2**30 * 0.97})
    assert found is not None and found.part is part
    assert part.source and part.dense_tflops
    assert all(v > 0 for v in part.dense_tflops.values())
    assert part.default_dtype in part.dense_tflops


def test_dense_peaks_of_the_added_parts() -> None:
    # Datasheet figures, dense (sparse / 2 where the sheet prints "with sparsity").
    assert dense_peak_tflops(PARTS["l40s"], "fp8") == 733.0       # 1,466 with sparsity / 2
    assert dense_peak_tflops(PARTS["l4"], "bf16") == 121.0        # 242 with sparsity / 2
    assert dense_peak_tflops(PARTS["gb200"], "fp4") == 10000.0    # 1,440 PF / 72 GPUs / 2
    assert dense_peak_tflops(PARTS["mi300x"], "bf16") == 1307.4
    assert dense_peak_tflops(PARTS["mi355x"], "fp4") == 10066.4
    assert dense_peak_tflops(PARTS["v100-pcie"], "fp16") == 112.0
    # DGX Station: 500 TFLOPS / 4 GPUs (32 GB), 480 / 4 (16 GB); the 32 GB part's FP32 is the SXM2's.
    assert dense_peak_tflops(PARTS["v100-dgxs"], "fp16") == 500 / 4
    assert dense_peak_tflops(PARTS["v100-dgxs"], "fp32") == dense_peak_tflops(PARTS["v100"], "fp32") == 15.7
    assert (dense_peak_tflops(PARTS["v100-dgxs-16gb"], "fp16"), dense_peak_tflops(PARTS["v100-dgxs-16gb"], "fp32")) \
        == (480 / 4, 60 / 4)
    assert dense_peak_tflops(PARTS["rtx-2080-ti"], "fp16") == 53.8  # FP32 accumulate
    assert "bf16" not in PARTS["v100"].dense_tflops
    # Nothing recorded: V100 runs are taken to be fp16 (tensor cores), Pascal ones fp32.
    assert (hardware.default_dtype(PARTS["v100"]), hardware.default_dtype(PARTS["quadro-gp100"])) == (
        "fp16", "fp32")


@pytest.mark.parametrize(
    ("input_type", "dtype"),
    [
        ("c10::BFloat16", "bf16"),
        ("c10::Half", "fp16"),
        ("float", "fp32"),
        ("double", "fp64"),
        ("c10::Float8_e4m3fn", "fp8"),
        ("c10::Float8_e5m2", "fp8"),
        ("signed char", "int8"),
        ("unsigned char", None),
        ("Scalar", None),
        ("", None),
        ("long", None),
    ],
)
def test_dtype_from_trace(input_type: str, dtype: str | None) -> None:
    assert dtype_from_trace(input_type) == dtype


def test_links_are_designs_figures() -> None:
    # DESIGN.md: "Links, one direction per GPU: HBM3 3,350 GB/s; NVLink 450 GB/s; IB NDR 50 GB/s; PCIe Gen5 64 GB/s."
    assert {k: link.gbps for k, link in LINKS.items()} == {
        "hbm3": 3350,
        "nvlink4": 450,
        "ib-ndr": 50,
        "pcie5": 64,
    }
    assert LINKS["hbm3"].gbps == hardware.PARTS["h100-sxm"].hbm_gbps
    assert LINKS["nvlink4"].gbps == hardware.PARTS["h100-sxm"].nvlink_gbps


@pytest.mark.parametrize(
    ("collective", "n", "factor"),
    [
        ("allreduce", 8, 2 * 7 / 8),
        ("allgather", 8, 7 / 8),
        ("reducescatter", 8, 7 / 8),
        ("alltoall", 4, 3 / 4),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("sendrecv", 2, 1.0),
        ("allreduce", 1, 0.0),  # one rank moves nothing
        # c10d's "Collective name" spellings normalize to the same collectives.
        ("all_reduce", 1024, 2 * 1023 / 1024),
        ("_allgather_base", 4, 3 / 4),
        ("all_gather_into_tensor_coalesced", 4, 3 / 4),
        ("_reduce_scatter_base", 4, 3 / 4),
        ("all_to_all", 4, 3 / 4),
        ("send", 2, 1.0),
        ("recv", 2, 1.0),
    ],
)
def test_bus_factor(collective: str, n: int, factor: float) -> None:
    assert bus_factor(collective, n) == pytest.approx(factor)


def test_bus_factor_refuses_what_it_cannot_know() -> None:
    with pytest.raises(ValueError, match="barrier"):
        bus_factor("barrier", 8)
    with pytest.raises(ValueError, match="n=0"):
        bus_factor("allreduce", 0)
    assert normalize_collective("barrier") is None
    assert normalize_collective("ReduceScatter") == "reducescatter"
    assert normalize_collective("reduce") == "reduce"
