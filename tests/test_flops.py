"""diag.knowledge.flops against torch.utils.flop_counter.FlopCounterMode.

Each case runs real ops on CPU under torch.profiler (record_shapes=True), reads the exported
Kineto JSON the way ingest does (`Input Dims`, `Input type`, `Concrete Inputs`), and checks that
op_flops on the recorded op equals what FlopCounterMode counts for the same call. The fused
attention ops that only exist on CUDA are checked on meta tensors, which FlopCounterMode counts
through the same formulas.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import NO_TRACES

torch = pytest.importorskip(
    "torch", reason="torch (the `capture` extra) checks FLOPs against FlopCounterMode"
)
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from diag.knowledge.flops import SUPPORTED_OPS, OpFlops, op_flops  # noqa: E402

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
aten = torch.ops.aten


def counted(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as mode:
        fn()
    return int(mode.get_total_flops())


def randn(*shape: int) -> Any:
    return torch.randn(*shape)


def grad(*shape: int) -> Any:
    return torch.randn(*shape, requires_grad=True)


def backward_of(forward: Callable[[], Any]) -> Callable[[], None]:
    """Run the backward only: the forward happens before the returned call."""
    out = forward()
    return lambda: out.sum().backward()


@dataclass(frozen=True)
class Case:
    label: str
    run: Callable[[], object]  # what the profiler records
    ops: tuple[str, ...]  # recorded ops whose FLOPs must equal `reference`
    reference: Callable[[], int]  # FlopCounterMode's count of the same work


def _mm_reference(m: int, k: int, n: int) -> Callable[[], int]:
    return lambda: counted(lambda: torch.mm(randn(m, k), randn(k, n)))


A45, X5 = randn(4, 5), randn(5)
CONV_X, CONV_W = randn(2, 3, 16, 16), randn(8, 3, 3, 3)

CASES = [
    Case("mm", lambda: torch.mm(randn(7, 5), randn(5, 3)), ("aten::mm",), _mm_reference(7, 5, 3)),
    Case(
        "addmm",
        lambda: torch.addmm(randn(3), randn(7, 5), randn(5, 3)),
        ("aten::addmm",),
        _mm_reference(7, 5, 3),
    ),
    Case(
        "bmm",
        lambda: torch.bmm(randn(4, 7, 5), randn(4, 5, 3)),
        ("aten::bmm",),
        lambda: counted(lambda: torch.bmm(randn(4, 7, 5), randn(4, 5, 3))),
    ),
    Case(
        "baddbmm",
        lambda: torch.baddbmm(randn(4, 7, 3), randn(4, 7, 5), randn(4, 5, 3)),
        ("aten::baddbmm",),
        lambda: counted(lambda: torch.bmm(randn(4, 7, 5), randn(4, 5, 3))),
    ),
    Case(
        "matmul folds a 3-D left operand into one mm",
        lambda: torch.matmul(randn(3, 4, 5), randn(5, 6)),
        ("aten::matmul", "aten::mm"),
        lambda: counted(lambda: torch.matmul(randn(3, 4, 5), randn(5, 6))),
    ),
    Case(
        "matmul broadcasts batch dims",
        lambda: torch.matmul(randn(2, 1, 4, 5), randn(3, 5, 6)),
        ("aten::matmul", "aten::bmm"),
        lambda: counted(lambda: torch.matmul(randn(2, 1, 4, 5), randn(3, 5, 6))),
    ),
    # FlopCounterMode has no formula for mv or dot (it counts 0), so 1-D cases compare with the
    # equivalent mm.
    Case(
        "matmul 2-D x 1-D",
        lambda: torch.matmul(A45, X5),
        ("aten::matmul", "aten::mv"),
        _mm_reference(4, 5, 1),
    ),
    Case("matmul 1-D x 1-D", lambda: torch.matmul(X5, X5), ("aten::matmul",), _mm_reference(1, 5, 1)),
    Case(
        "matmul 1-D x 3-D",
        lambda: torch.matmul(X5, randn(3, 5, 6)),
        ("aten::matmul",),
        lambda: counted(lambda: torch.matmul(randn(1, 5), randn(3, 5, 6))),
    ),
    Case("mv", lambda: torch.mv(A45, X5), ("aten::mv",), _mm_reference(4, 5, 1)),
    Case("addmv", lambda: torch.addmv(randn(4), A45, X5), ("aten::addmv",), _mm_reference(4, 5, 1)),
    Case(
        "linear with bias, 3-D input",
        lambda: F.linear(randn(3, 5, 16), randn(32, 16), randn(32)),
        ("aten::linear", "aten::addmm"),
        lambda: counted(lambda: F.linear(randn(3, 5, 16), randn(32, 16), randn(32))),
    ),
    Case(
        "linear without bias",
        lambda: F.linear(randn(6, 16), randn(32, 16)),
        ("aten::linear", "aten::mm"),
        lambda: counted(lambda: F.linear(randn(6, 16), randn(32, 16))),
    ),
]


def _sdpa_math(q: Any, k: Any, v: Any, **kw: Any) -> Any:
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kw)


# Attention: L != S and E != Ev catch a transposed formula. The CPU flash kernel needs E == Ev.
CASES += [
    Case(
        "sdpa, math backend",
        lambda: _sdpa_math(randn(2, 4, 8, 16), randn(2, 4, 10, 16), randn(2, 4, 10, 24)),
        ("aten::scaled_dot_product_attention",),
        lambda: counted(lambda: _sdpa_math(randn(2, 4, 8, 16), randn(2, 4, 10, 16), randn(2, 4, 10, 24))),
    ),
    Case(
        "sdpa, grouped-query",
        lambda: _sdpa_math(randn(2, 8, 8, 16), randn(2, 2, 10, 16), randn(2, 2, 10, 16), enable_gqa=True),
        ("aten::scaled_dot_product_attention",),
        lambda: counted(
            lambda: _sdpa_math(randn(2, 8, 8, 16), randn(2, 2, 10, 16), randn(2, 2, 10, 16), enable_gqa=True)
        ),
    ),
    Case(
        "sdpa, CPU flash kernel",
        lambda: F.scaled_dot_product_attention(randn(2, 4, 8, 16), randn(2, 4, 10, 16), randn(2, 4, 10, 16)),
        ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"),
        lambda: counted(lambda: _sdpa_math(randn(2, 4, 8, 16), randn(2, 4, 10, 16), randn(2, 4, 10, 16))),
    ),
    Case(
        "sdpa backward, CPU flash kernel",
        backward_of(
            lambda: F.scaled_dot_product_attention(grad(2, 4, 8, 16), grad(2, 4, 10, 16), grad(2, 4, 10, 16))
        ),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward",),
        # flop_counter's backward formula, through the CUDA op's meta kernel.
        lambda: counted(
            lambda: aten._scaled_dot_product_flash_attention_backward(
                *_meta(
                    (2, 4, 8, 16), (2, 4, 8, 16), (2, 4, 10, 16), (2, 4, 10, 16), (2, 4, 8, 16), (2, 4, 8)
                ),
                None,
                None,
                8,
                10,
                0.0,
                False,
                *_meta((), ()),
            )
        ),
    ),
]


def _meta(*shapes: tuple[int, ...]) -> list[Any]:
    return [torch.empty(s, device="meta", dtype=torch.float16) for s in shapes]


def _conv(x: tuple[int, ...], w: tuple[int, ...], **kw: Any) -> Callable[[], Any]:
    fn = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(x)]
    return lambda: fn(randn(*x), randn(*w), **kw)


CONV_OPS = ("aten::convolution", "aten::_convolution")
CASES += [
    Case(
        "conv2d, stride 2, padding 1",
        _conv((2, 3, 16, 16), (8, 3, 3, 3), stride=2, padding=1),
        ("aten::conv2d", *CONV_OPS, "aten::mkldnn_convolution"),
        lambda: counted(_conv((2, 3, 16, 16), (8, 3, 3, 3), stride=2, padding=1)),
    ),
    Case(
        "conv1d, dilation 2",
        _conv((2, 4, 20), (6, 4, 3), dilation=2, padding=1),
        ("aten::conv1d", *CONV_OPS, "aten::mkldnn_convolution"),
        lambda: counted(_conv((2, 4, 20), (6, 4, 3), dilation=2, padding=1)),
    ),
    Case(
        "conv3d, anisotropic stride",
        _conv((1, 2, 5, 6, 7), (3, 2, 2, 3, 3), stride=(1, 2, 1)),
        ("aten::conv3d", *CONV_OPS, "aten::slow_conv3d"),
        lambda: counted(_conv((1, 2, 5, 6, 7), (3, 2, 2, 3, 3), stride=(1, 2, 1))),
    ),
    Case(
        "conv2d, groups 2",
        _conv((2, 4, 9, 9), (6, 2, 3, 3), groups=2),
        ("aten::conv2d", *CONV_OPS, "aten::mkldnn_convolution"),
        lambda: counted(_conv((2, 4, 9, 9), (6, 2, 3, 3), groups=2)),
    ),
    # padding="same" is a string argument the profiler does not record: conv2d gives None, and
    # the convolution under it (padding [1, 1]) carries the FLOPs.
    Case(
        "conv2d, padding same",
        _conv((2, 4, 9, 9), (6, 4, 3, 3), padding="same"),
        CONV_OPS,
        lambda: counted(_conv((2, 4, 9, 9), (6, 4, 3, 3), padding="same")),
    ),
    Case(
        "conv_transpose2d, stride 2",
        lambda: F.conv_transpose2d(randn(2, 4, 5, 5), randn(4, 3, 3, 3), stride=2),
        ("aten::conv_transpose2d", *CONV_OPS),
        lambda: counted(lambda: F.conv_transpose2d(randn(2, 4, 5, 5), randn(4, 3, 3, 3), stride=2)),
    ),
    Case(
        "convolution_backward",
        backward_of(lambda: F.conv2d(grad(2, 3, 16, 16), grad(8, 3, 3, 3), stride=2, padding=1)),
        ("aten::convolution_backward",),
        lambda: counted(
            backward_of(lambda: F.conv2d(grad(2, 3, 16, 16), grad(8, 3, 3, 3), stride=2, padding=1))
        ),
    ),
    # Weights only (the input needs no gradient): output_mask [False, True, False].
    Case(
        "convolution_backward, weight grad only",
        backward_of(lambda: F.conv2d(randn(2, 3, 16, 16), grad(8, 3, 3, 3))),
        ("aten::convolution_backward",),
        lambda: counted(backward_of(lambda: F.conv2d(randn(2, 3, 16, 16), grad(8, 3, 3, 3)))),
    ),
]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """label -> the cpu_op events recorded inside that case's record_function range."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for case in CASES:
            with torch.profiler.record_function(case.label):
                case.run()
    path = tmp_path_factory.mktemp("trace") / "cpu.pt.trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    ranges = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "user_annotation"}
    return {label: [e for e in ops if lo <= e["ts"] <= hi] for label, (lo, hi) in ranges.items()}


def _flops_of(event: dict[str, Any]) -> OpFlops | None:
    args = event.get("args", {})
    return op_flops(
        event["name"], args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs")
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_recorded_op_matches_flop_counter(case: Case, recorded: dict[str, list[dict[str, Any]]]) -> None:
    reference = case.reference()
    assert reference > 0
    for op in case.ops:
        events = [e for e in recorded[case.label] if e["name"] == op]
        assert events, f"{op} not recorded; recorded: {sorted({e['name'] for e in recorded[case.label]})}"
        result = _flops_of(events[0])
        assert result is not None, f"{op} {events[0]['args'].get('Input Dims')}"
        assert result.flops == reference, op


def test_padding_same_is_not_recorded_on_conv2d(recorded: dict[str, list[dict[str, Any]]]) -> None:
    conv2d = next(e for e in recorded["conv2d, padding same"] if e["name"] == "aten::conv2d")
    assert _flops_of(conv2d) is None


def test_grouped_conv_backward_counts_each_gradient_as_the_forward(
    recorded: dict[str, list[dict[str, Any]]],
) -> None:
    """flop_counter counts grouped grad_weight `groups` times too large (it multiplies the input's
    full channel count by the output's); each gradient of a convolution costs its forward."""
    forward = counted(_conv((2, 4, 9, 9), (6, 2, 3, 3), groups=2))
    dims = [[2, 6, 7, 7], [2, 4, 9, 9], [6, 2, 3, 3], [], [], [], [], [], [], [], []]
    concrete = [
        "",
        "",
        "",
        "[0]",
        "[1, 1]",
        "[0, 0]",
        "[1, 1]",
        "False",
        "[0, 0]",
        "2",
        "[True, True, False]",
    ]
    result = op_flops("aten::convolution_backward", dims, ["float"] * 3, concrete)
    assert result is not None and result.flops == 2 * forward


# --- fused attention ops that exist only on CUDA: shapes as the profiler records them -----------


def _blhe(b: int, h: int, s: int, e: int) -> list[int]:
    return [b, s, h, e]


@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (8, 2)])
def test_cuda_attention_forward_ops(hq: int, hkv: int) -> None:
    b, lq, sk, e = 2, 8, 10, 16
    q, k, v = _meta((b, hq, lq, e), (b, hkv, sk, e), (b, hkv, sk, e))
    reference = counted(lambda: aten._scaled_dot_product_flash_attention(q, k, v))
    assert reference == counted(lambda: aten._scaled_dot_product_efficient_attention(q, k, v, None, True))
    assert reference == counted(lambda: aten._scaled_dot_product_cudnn_attention(q, k, v, None, True))
    types = ["c10::BFloat16"] * 3
    bhle = [[b, hq, lq, e], [b, hkv, sk, e], [b, hkv, sk, e]]
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    ):
        result = op_flops(f"aten::{name}", [*bhle, [], [], []], types)
        assert result is not None and result.flops == reference and result.kind == "attention"
    # The kernels under them take (B, L, H, E); flop_counter reads those as (B, H, L, E).
    blhe = [_blhe(b, hq, lq, e), _blhe(b, hkv, sk, e), _blhe(b, hkv, sk, e)]
    for name in ("_flash_attention_forward", "_efficient_attention_forward"):
        result = op_flops(f"aten::{name}", [*blhe, [], [], [], [], []], types)
        assert result is not None and result.flops == reference, name


def test_cuda_attention_backward_ops() -> None:
    b, h, lq, sk, e = 2, 4, 8, 10, 16
    go, q, k, v, out = _meta((b, h, lq, e), (b, h, lq, e), (b, h, sk, e), (b, h, sk, e), (b, h, lq, e))
    lse = torch.empty((b, h, lq), device="meta")
    seed, offset = _meta((), ())
    reference = counted(
        lambda: aten._scaled_dot_product_flash_attention_backward(
            go, q, k, v, out, lse, None, None, lq, sk, 0.0, False, seed, offset
        )
    )
    assert reference == counted(
        lambda: aten._scaled_dot_product_efficient_attention_backward(
            go, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False]
        )
    )
    assert reference == 10 * b * h * lq * sk * e  # 2.5x the forward's 4*B*H*L*S*E
    types = ["c10::BFloat16"] * 5 + ["float"]
    bhle = [[b, h, lq, e], [b, h, lq, e], [b, h, sk, e], [b, h, sk, e], [b, h, lq, e], [b, h, lq]]
    for name in (
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
    ):
        result = op_flops(f"aten::{name}", [*bhle, [], []], types)
        assert result is not None and result.flops == reference, name
    blhe = [
        _blhe(b, h, lq, e),
        _blhe(b, h, lq, e),
        _blhe(b, h, sk, e),
        _blhe(b, h, sk, e),
        _blhe(b, h, lq, e),
        [b, h, lq],
    ]
    for name in ("_flash_attention_backward", "_efficient_attention_backward"):
        result = op_flops(f"aten::{name}", [*blhe, [], [], [], []], types)
        assert result is not None and result.flops == reference, name


def test_varlen_flash_attention_counts_equal_sequences() -> None:
    """Packed (T, H, E) with cum_seq_q of n+1 entries: n sequences of T/n (exact when equal)."""
    total, h, e, n = 24, 4, 16, 3
    q = _meta((total, h, e))[0]
    cum = torch.empty(n + 1, dtype=torch.int32, device="meta")
    reference = counted(
        lambda: aten._flash_attention_forward(q, q, q, cum, cum, total // n, total // n, 0.0, False, False)
    )
    dims = [[total, h, e]] * 3 + [[n + 1], [n + 1], [], []]
    result = op_flops("aten::_flash_attention_forward", dims, ["c10::BFloat16"] * 3 + ["int", "int"])
    assert result is not None and result.flops == reference


def test_scaled_mm_is_an_fp8_gemm() -> None:
    a = torch.empty(16, 32, device="meta", dtype=torch.float8_e4m3fn)
    b = torch.empty(64, 32, device="meta", dtype=torch.float8_e4m3fn).t()
    one = torch.ones((), device="meta")
    reference = counted(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    result = op_flops(
        "aten::_scaled_mm", [[16, 32], [32, 64], [], []], ["c10::Float8_e4m3fn"] * 2 + ["float"] * 2
    )
    assert result is not None and result.flops == reference
    assert result.dtype == "fp8" and result.m_n_k == (16, 64, 32)
    assert result.bytes_moved == 16 * 32 + 32 * 64 + 2 * 16 * 64  # bf16 out


# --- what the results carry ---------------------------------------------------------------------


def test_gemm_dims_dtype_and_bytes() -> None:
    result = op_flops(
        "aten::addmm", [[4096], [8, 1024], [1024, 4096], [], []], ["c10::BFloat16"] * 3 + ["Scalar"] * 2
    )
    assert result == OpFlops(
        flops=2.0 * 8 * 4096 * 1024,
        kind="gemm",
        m_n_k=(8, 4096, 1024),
        dtype="bf16",
        bytes_moved=2.0 * (4096 + 8 * 1024 + 1024 * 4096 + 8 * 4096),
    )
    bmm = op_flops("aten::bmm", [[32, 128, 64], [32, 64, 128]], ["c10::Half"] * 2)
    assert bmm is not None and (bmm.m_n_k, bmm.batch) == ((128, 128, 64), 32)
    unknown_dtype = op_flops("aten::mm", [[2, 3], [3, 4]], ["unsigned char", "unsigned char"])
    assert unknown_dtype is not None and unknown_dtype.bytes_moved is None and unknown_dtype.dtype is None
    inplace = op_flops("aten::addmm_", [[8, 4096], [8, 1024], [1024, 4096], [], []], None)
    assert inplace is not None and inplace.flops == 2.0 * 8 * 4096 * 1024


@pytest.mark.parametrize(
    ("name", "dims"),
    [
        ("aten::mm", [[7, 5], [4, 3]]),  # inner dims differ
        ("aten::mm", [[7, 5]]),
        ("aten::mm", [[], []]),
        ("aten::mm", [[7, 5], [[5, 3]]]),  # a tensor list where a tensor belongs
        ("aten::mm", [[7, True], [5, 3]]),
        ("aten::mm", [[7, -5], [-5, 3]]),
        ("aten::mm", [["7", 5], [5, 3]]),
        ("aten::bmm", [[2, 7, 5], [3, 5, 3]]),
        ("aten::matmul", [[2, 4, 5], [3, 5, 6]]),  # batch dims do not broadcast
        ("aten::linear", [[3, 16], [32, 8]]),
        ("aten::scaled_dot_product_attention", [[2, 4, 8, 16], [2, 4, 10, 8], [2, 4, 10, 16]]),
        ("aten::_flash_attention_forward", [[2, 8, 4], [2, 10, 4], [2, 10, 4]]),
        (
            "aten::convolution",
            [[2, 3, 16, 16], [8, 3, 3, 3], [], [], [], [], [], [], []],
        ),  # no Concrete Inputs
        ("aten::convolution_backward", [[2, 8, 8], [2, 3, 16, 16], [8, 3, 3, 3]]),
        ("AddmmBackward0", [[15, 32]]),  # an autograd node: its aten::mm children carry the FLOPs
        ("aten::add", [[3, 4], [3, 4], []]),
        ("fb::convex_sum", [[2048, 2], [2, 1]]),
        ("aten::mm", None),
        ("aten::mm", "[[7, 5], [5, 3]]"),
    ],
)
def test_malformed_or_unsupported_gives_none(name: str, dims: Any) -> None:
    assert op_flops(name, dims, None) is None


def test_never_raises_on_arbitrary_input() -> None:
    rng = random.Random(0)
    atoms: list[Any] = [0, 1, 3, 16, -1, True, None, "", "x", 2.5, [], {}, "[1, 1]", "True"]

    def junk(depth: int = 0) -> Any:
        if depth > 2 or rng.random() < 0.4:
            return rng.choice(atoms)
        return [junk(depth + 1) for _ in range(rng.randint(0, 5))]

    for _ in range(200):
        for name in sorted(SUPPORTED_OPS):
            dims = [junk() for _ in range(rng.randint(0, 12))]
            types = [rng.choice(["float", "c10::BFloat16", "", None, 3]) for _ in range(rng.randint(0, 12))]
            concrete = [
                junk() if rng.random() < 0.5 else rng.choice(["[2, 2]", "False", "", "same"])
                for _ in range(12)
            ]
            result = op_flops(name, dims, types, concrete)
            assert result is None or result.flops >= 0


def test_real_traces() -> None:
    """Shapes recorded on real GPUs: known GEMMs come out right, and nothing raises."""
    files = {
        "backward_thread": TRACES / "HolisticTraceAnalysis/tests/data/call_stack/backward_thread.json",
        "amd": TRACES
        / "HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        "sampled": TRACES / "HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz",
    }
    if not all(p.exists() for p in files.values()):
        pytest.skip(NO_TRACES)
    found: dict[tuple[str, str], list[float]] = {}
    for key, path in files.items():
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        for e in events:
            args = e.get("args") or {}
            if e.get("cat") in ("cpu_op", "Operator") and "Input Dims" in args:
                result = op_flops(
                    e["name"], args["Input Dims"], args.get("Input type"), args.get("Concrete Inputs")
                )
                if result is not None:
                    found.setdefault((key, e["name"]), []).append(result.flops)
    assert 2.0 * 2048 * 2048 * 256 in found[("backward_thread", "aten::mm")]
    assert 2.0 * 5 * 128 * 128 in found[("amd", "aten::addmm")]  # addmm [[128], [5, 128], [128, 128]]
    assert found[("amd", "aten::linear")] and found[("sampled", "aten::bmm")]
