"""FLOPs of an aten op from the shapes the profiler recorded (`record_shapes=True`).

Conventions are torch.utils.flop_counter's (torch 2.13), so a trace and FlopCounterMode agree:

- a GEMM is 2*M*N*K (multiply and add; bias and alpha/beta are not counted);
- attention forward is two batched GEMMs, 4*B*H*L*S*E for E = Ev (QK^T and PV); backward is
  five, 2*B*H*L*S*(3E + 2Ev) = 2.5x forward (it recomputes QK^T, then dP, dV, dQ, dK);
- a convolution is 2*N*Cout*(Cin/groups)*prod(kernel)*prod(output spatial) (input spatial for a
  transposed one); its backward is that again for each gradient asked for (output_mask). The
  output size comes from stride/padding/dilation in `Concrete Inputs`, else from the matching
  backward op's grad_output (timeline.py pairs them by autograd sequence number).

Three deliberate differences from flop_counter: `_flash_attention_*` and
`_efficient_attention_*` take (B, L, H, E) tensors, which flop_counter reads as (B, H, L, E);
flop_counter's grad-weight count for a grouped convolution is `groups` times too large; and a
causal mask (is_causal, or the efficient kernels' custom_mask_type 1 or 2, read from `Concrete
Inputs`) halves square attention (L = S), the kernels skipping the masked blocks, as
FlashAttention's own benchmarks count it (flash-attn benchmarks/benchmark_flash_attention.py,
`flops / 2 if causal`). flop_counter counts the masked half too; without Concrete Inputs the mask
is unknown and attention is counted whole, as flop_counter does.

Backward ops carry their own shapes. The autograd engine runs the backward as ordinary ops
(aten::mm, aten::convolution_backward, aten::_flash_attention_backward ...) that record their own
`Input Dims`; those are what this module counts. Autograd nodes (AddmmBackward0) record only the
incoming gradient and give None.

Count an op tree once: take the innermost op for which `op_flops` is not None. aten::linear
contains aten::addmm, aten::_scaled_dot_product_flash_attention contains
aten::_flash_attention_forward, and each gives the same FLOPs. Both levels are handled because
traces differ in what they record below a composite op.

Input: `Input Dims` (a list with one entry per argument: a shape for a tensor, [] otherwise),
`Input type` ("c10::BFloat16", "float", "Scalar", "" ...) and, for convolutions, `Concrete Inputs`
(scalar and list arguments as text: "[2, 2]", "False"). Anything malformed gives None, never an
exception: real traces have [] for optional tensors, nested lists for tensor lists, and nulls.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

import msgspec
from msgspec.structs import replace

from diag.knowledge.hardware import dtype_from_trace

OpKind = Literal["gemm", "attention", "conv"]

# Bytes per element, for arithmetic intensity.
_ELEMENT_BYTES = {"fp64": 8.0, "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5}


class OpFlops(msgspec.Struct, frozen=True):
    flops: float
    kind: OpKind
    m_n_k: tuple[int, int, int] | None  # GEMM rows, cols, inner dim (per batch); None for attention/conv
    dtype: str | None  # of the first operand (hardware.py dtype keys)
    bytes_moved: float | None  # operands read + results written, once each; None if a dtype is unknown
    batch: int = 1  # GEMMs of that m_n_k in the op (bmm, broadcast matmul)


Shape = tuple[int, ...]


class _Args(msgspec.Struct, frozen=True):
    """One op's recorded arguments, read defensively."""

    dims: Sequence[Any]
    types: Sequence[Any]
    concrete: Sequence[Any]
    output: Sequence[Any] | None = None  # a forward convolution's output shape, from its backward

    def shape(self, i: int) -> Shape | None:
        if i >= len(self.dims):
            return None
        dims = self.dims[i]
        if not isinstance(dims, list) or not all(type(d) is int and d >= 0 for d in dims):
            return None
        return tuple(dims)

    def tensor(self, i: int, rank: int | None = None) -> Shape | None:
        """The shape of argument i if it is a tensor (of that rank); [] means absent or a scalar."""
        shape = self.shape(i)
        if shape is None or (rank is None and not shape) or (rank is not None and len(shape) != rank):
            return None
        return shape

    def dtype(self, i: int) -> str | None:
        if i < len(self.types) and isinstance(self.types[i], str):
            return dtype_from_trace(self.types[i])
        return None

    def nbytes(self, i: int, shape: Shape | None = None) -> float | None:
        """Bytes of tensor argument i (or of `shape` in argument i's dtype)."""
        size = self.element_bytes(i)
        dims = shape if shape is not None else self.shape(i)
        return None if size is None or dims is None else size * math.prod(dims)

    def element_bytes(self, i: int) -> float | None:
        dtype = self.dtype(i)
        return _ELEMENT_BYTES.get(dtype) if dtype else None

    def value(self, i: int) -> Any:
        """Argument i from `Concrete Inputs`: bool, int, float, list or str; None when absent."""
        if i >= len(self.concrete) or not isinstance(self.concrete[i], str) or not self.concrete[i].strip():
            return None
        text = self.concrete[i].strip()
        try:
            return json.loads(text.replace("True", "true").replace("False", "false"))
        except ValueError:
            return text.strip("'\"")


def _sum_bytes(*parts: float | None) -> float | None:
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def _gemm(
    args: _Args, m: int, n: int, k: int, batch: int, reads: Sequence[int], out_bytes_from: int = 0
) -> OpFlops:
    """A (batched) GEMM: reads the tensor arguments `reads`, writes batch*m*n elements."""
    out_size = args.element_bytes(out_bytes_from)
    written = None if out_size is None else out_size * batch * m * n
    return OpFlops(
        flops=2.0 * batch * m * n * k,
        kind="gemm",
        m_n_k=(m, n, k),
        dtype=args.dtype(reads[0]),
        bytes_moved=_sum_bytes(*(args.nbytes(i) for i in reads), written),
        batch=batch,
    )


def _mm(args: _Args, a: int = 0, b: int = 1, extra_reads: tuple[int, ...] = ()) -> OpFlops | None:
    sa, sb = args.tensor(a, 2), args.tensor(b, 2)
    if sa is None or sb is None or sa[1] != sb[0]:
        return None
    return _gemm(args, sa[0], sb[1], sa[1], 1, (a, b, *extra_reads), out_bytes_from=a)


def _bmm(args: _Args, a: int = 0, b: int = 1, extra_reads: tuple[int, ...] = ()) -> OpFlops | None:
    sa, sb = args.tensor(a, 3), args.tensor(b, 3)
    if sa is None or sb is None or sa[0] != sb[0] or sa[2] != sb[1]:
        return None
    return _gemm(args, sa[1], sb[2], sa[2], sa[0], (a, b, *extra_reads), out_bytes_from=a)


def _mv(args: _Args, mat: int, vec: int, extra_reads: tuple[int, ...] = ()) -> OpFlops | None:
    sm, sv = args.tensor(mat, 2), args.tensor(vec, 1)
    if sm is None or sv is None or sm[1] != sv[0]:
        return None
    return _gemm(args, sm[0], 1, sm[1], 1, (mat, vec, *extra_reads), out_bytes_from=mat)


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    """numpy broadcasting of two batch shapes."""
    out = []
    for x, y in zip(
        reversed((1,) * (len(b) - len(a)) + a), reversed((1,) * (len(a) - len(b)) + b), strict=True
    ):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


def _matmul(args: _Args) -> OpFlops | None:
    """torch.matmul: 1-D operands gain a dimension; a 2-D right operand folds the left one's
    batch into its rows (one GEMM, as torch does); otherwise batch dims broadcast."""
    sa, sb = args.tensor(0), args.tensor(1)
    if sa is None or sb is None:
        return None
    a = (1, *sa) if len(sa) == 1 else sa
    b = (*sb, 1) if len(sb) == 1 else sb
    if a[-1] != b[-2]:
        return None
    m, k, n = a[-2], a[-1], b[-1]
    if len(b) == 2:
        return _gemm(args, math.prod(a[:-1]), n, k, 1, (0, 1))
    batch = _broadcast(a[:-2], b[:-2])
    if batch is None:
        return None
    return _gemm(args, m, n, k, math.prod(batch), (0, 1))


def _linear(args: _Args) -> OpFlops | None:
    """aten::linear(input [..., K], weight [N, K], bias [N]?)."""
    sx, sw = args.tensor(0), args.tensor(1, 2)
    if sx is None or sw is None or sx[-1] != sw[1]:
        return None
    bias = (2,) if args.tensor(2) is not None else ()
    return _gemm(args, math.prod(sx[:-1]), sw[0], sw[1], 1, (0, 1, *bias))


def _scaled_mm(args: _Args) -> OpFlops | None:
    """aten::_scaled_mm(a, b, scale_a, scale_b, ...): an FP8 GEMM. It writes out_dtype (bf16 in
    practice, 2 bytes), not the fp8 of its operands."""
    op = _mm(args)
    if op is None or op.m_n_k is None:
        return None
    m, n, _ = op.m_n_k
    read = _sum_bytes(args.nbytes(0), args.nbytes(1))
    return replace(op, bytes_moved=None if read is None else read + 2.0 * m * n)


# --- attention -------------------------------------------------------------------------------


def _attention(
    args: _Args,
    *,
    backward: bool,
    heads_second: bool,
    causal: int,
    cu_seqlens: int | None = None,
    mask_type: bool = False,
) -> OpFlops | None:
    """Scaled-dot-product attention. Tensors q, k, v start at argument 0 (forward) or 1
    (backward, after grad_out).

    `heads_second`: (..., H, L, E) layout of the public and _scaled_dot_product_* ops, any
    leading batch dims; otherwise (B, L, H, E) of _flash_attention_* / _efficient_attention_*.
    `cu_seqlens`: argument index of cumulative sequence lengths. When that tensor is present the
    batch is packed varlen, q (T, H, E) or (1, T, H, E) holding n sequences of unknown lengths;
    FLOPs are then counted as n equal sequences of T/n, a lower bound of sum(L_i * S_i).
    `causal`: argument index of is_causal (of custom_mask_type where `mask_type`: 1 and 2 are the
    causal masks of the efficient kernels).
    """
    first = 1 if backward else 0
    q, k, v = (args.tensor(first + i) for i in range(3))
    if q is None or k is None or v is None or len(q) != len(k) or len(q) != len(v) or len(q) < 3:
        return None
    seqs = args.tensor(cu_seqlens, 1) if cu_seqlens is not None else None
    if heads_second:
        batch, seq_q, e, seq_k, ev = math.prod(q[:-2]), q[-2], q[-1], k[-2], v[-1]
        consistent = k[-1] == e and v[-2] == seq_k
    else:
        # (B, L, H, E); packed varlen, and only it, drops B: (T, H, E), or fixes it at 1.
        batch, seq_q, e, seq_k, ev = math.prod(q[:-3]) * q[-2], q[-3], q[-1], k[-3], v[-1]
        consistent = k[-1] == e and v[-3] == seq_k and (len(q) == 4 or seqs is not None)
    if not consistent:
        return None
    per_seq = 1.0
    if seqs is not None and seqs[0] > 1:
        per_seq = 1.0 / (seqs[0] - 1)  # n sequences of T/n: sum L_i*S_i = T*S/n
    pairs = batch * seq_q * seq_k * per_seq  # query-key pairs
    mask = args.value(causal)
    if seq_q == seq_k and (mask in (1, 2) if mask_type else mask is True):
        pairs /= 2  # the masked upper triangle is skipped
    flops = 2.0 * pairs * ((3 * e + 2 * ev) if backward else (e + ev))
    out = (*q[:-1], ev)
    # Forward reads q, k, v and writes out; backward reads q, k, v, out, grad_out and writes
    # dq, dk, dv: twice the forward's traffic.
    moved = _sum_bytes(
        args.nbytes(first), args.nbytes(first + 1), args.nbytes(first + 2), args.nbytes(first, out)
    )
    return OpFlops(
        flops=flops,
        kind="attention",
        m_n_k=None,
        dtype=args.dtype(first),
        bytes_moved=None if moved is None else moved * (2 if backward else 1),
    )


# --- convolution -----------------------------------------------------------------------------


class _ConvLayout(msgspec.Struct, frozen=True):
    """Where an op keeps stride, padding, dilation and `transposed` (an index, or a constant)."""

    stride: int | None
    padding: int | None
    dilation: int | None
    transposed: int | bool


def _ints(value: Any, n: int, default: int) -> tuple[int, ...] | None:
    """A per-spatial-dim argument: [2, 2], [2] (broadcast), 2, or absent (the default)."""
    if value is None:
        return (default,) * n
    if type(value) is int:
        return (value,) * n
    if isinstance(value, list) and all(type(v) is int for v in value):
        if len(value) == n:
            return tuple(value)
        if len(value) == 1:
            return (value[0],) * n
    return None


def _conv_out_spatial(args: _Args, layout: _ConvLayout, x: Shape, w: Shape) -> Shape | None:
    """Output spatial dims: floor((in + 2p - d(k-1) - 1) / s) + 1, per dim."""
    n = len(x) - 2
    if layout.stride is None or layout.padding is None:
        return None  # nothing recorded where these live
    stride_value = args.value(layout.stride)
    padding_value = args.value(layout.padding)
    if stride_value is None or padding_value is None:
        return None  # a trace without Concrete Inputs: the stride is unknown
    dilation = _ints(args.value(layout.dilation) if layout.dilation is not None else None, n, 1)
    stride = _ints(stride_value, n, 1)
    if padding_value == "same":
        return x[2:]
    padding = _ints(0 if padding_value == "valid" else padding_value, n, 0)
    if stride is None or padding is None or dilation is None or 0 in stride:
        return None
    out = tuple(
        (i + 2 * p - d * (kk - 1) - 1) // s + 1
        for i, p, d, kk, s in zip(x[2:], padding, dilation, w[2:], stride, strict=True)
    )
    return out if all(o > 0 for o in out) else None


def _recorded_out_spatial(args: _Args, x: Shape, w: Shape) -> Shape | None:
    """Output spatial dims from the output shape the caller found (the matching backward op's
    grad_output), when it fits the input and weight: (N, Cout, *spatial)."""
    out = args.output
    if not isinstance(out, list) or len(out) != len(x) or not all(type(d) is int and d > 0 for d in out):
        return None
    return tuple(out[2:]) if out[0] == x[0] and out[1] == w[0] else None


def _conv_macs(x: Shape, w: Shape, conv_spatial: Shape) -> int:
    """Multiply-adds: batch x spatial positions x kernel x w[0] x w[1] (w[1] is per group)."""
    return x[0] * math.prod(conv_spatial) * math.prod(w[2:]) * w[0] * w[1]


def _is_transposed(args: _Args, layout: _ConvLayout) -> bool | None:
    if isinstance(layout.transposed, bool):
        return layout.transposed
    value = args.value(layout.transposed)
    return value if isinstance(value, bool) else None


def _conv(args: _Args, layout: _ConvLayout) -> OpFlops | None:
    x, w = args.tensor(0), args.tensor(1)
    if x is None or w is None or len(x) < 3 or len(w) != len(x):
        return None
    transposed = _is_transposed(args, layout)
    if transposed is None:
        return None
    if transposed:
        # flop_counter: a transposed convolution visits every *input* position.
        return OpFlops(2.0 * _conv_macs(x, w, x[2:]), "conv", None, args.dtype(0), None)
    out_spatial = _conv_out_spatial(args, layout, x, w) or _recorded_out_spatial(args, x, w)
    if out_spatial is None:
        return None
    out = (x[0], w[0], *out_spatial)
    bias = (args.nbytes(2),) if args.tensor(2, 1) is not None else ()
    moved = _sum_bytes(args.nbytes(0), args.nbytes(1), *bias, args.nbytes(0, out))
    return OpFlops(2.0 * _conv_macs(x, w, out_spatial), "conv", None, args.dtype(0), moved)


def _conv_backward(args: _Args) -> OpFlops | None:
    """aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    dilation, transposed, output_padding, groups, output_mask).

    Each gradient asked for costs the forward's FLOPs. The forward's output shape is grad_output's,
    so no stride is needed. Without Concrete Inputs: not transposed, and both grad_input and
    grad_weight are assumed (a first layer, which needs no grad_input, is then over-counted by one
    forward)."""
    grad_out, x, w = args.tensor(0), args.tensor(1), args.tensor(2)
    if grad_out is None or x is None or w is None or not len(grad_out) == len(x) == len(w) >= 3:
        return None
    transposed = args.value(7) is True
    mask = args.value(10)
    wanted = mask[:2] if isinstance(mask, list) and len(mask) >= 2 else [True, True]
    forward_macs = _conv_macs(x, w, x[2:] if transposed else grad_out[2:])
    n_grads = sum(1 for m in wanted if m is True)
    # Reads grad_output, input, weight; writes grad_input (input's size), grad_weight (weight's).
    moved = _sum_bytes(
        args.nbytes(0),
        args.nbytes(1),
        args.nbytes(2),
        args.nbytes(1) if wanted[0] is True else 0.0,
        args.nbytes(2) if wanted[1] is True else 0.0,
    )
    return OpFlops(2.0 * forward_macs * n_grads, "conv", None, args.dtype(0), moved)


def _conv_grad(args: _Args, weight: int | None) -> OpFlops | None:
    """torch 1.x's cudnn_convolution_backward_input(self_size, grad_output, weight, padding, stride,
    dilation, groups, ...) and cudnn_convolution_backward_weight(weight_size, grad_output, self,
    ...): one gradient each, the forward's FLOPs, 2·N·Cout·(Cin/groups)·prod(kernel)·prod(output
    spatial), N and the output from grad_output. No stride is needed. The weight's shape is argument
    `weight`, or for backward_weight (its weight_size is a list: the trace records no dims for it)
    the `output` the caller found: the forward op's weight (timeline/rank.py pairs them)."""
    grad_out = args.tensor(1)
    w = args.tensor(weight) if weight is not None else (
        tuple(args.output) if isinstance(args.output, list) and all(type(d) is int and d > 0 for d in args.output)
        else None)
    if grad_out is None or w is None or len(grad_out) != len(w) or len(w) < 3 or grad_out[1] != w[0]:
        return None
    x = args.tensor(2) if weight is None else None
    if x is not None and (len(x) != len(w) or x[0] != grad_out[0] or x[1] % w[1]):
        return None   # the input does not fit the weight found for it
    return OpFlops(2.0 * _conv_macs(grad_out, w, grad_out[2:]), "conv", None, args.dtype(1), None)


# --- the table -------------------------------------------------------------------------------

_HANDLERS: dict[str, Callable[[_Args], OpFlops | None]] = {
    "mm": _mm,
    "addmm": partial(_mm, a=1, b=2, extra_reads=(0,)),  # (bias, mat1, mat2, beta, alpha)
    "bmm": _bmm,
    "baddbmm": partial(_bmm, a=1, b=2, extra_reads=(0,)),
    "matmul": _matmul,
    "linear": _linear,
    "mv": partial(_mv, mat=0, vec=1),
    "addmv": partial(_mv, mat=1, vec=2, extra_reads=(0,)),  # (self, mat, vec, beta, alpha)
    "_scaled_mm": _scaled_mm,
    # (B, H, L, E) layout: the public op and the _scaled_dot_product_* ops under it, and
    # _cudnn_attention_* below the cuDNN one (torch >= 2.9). The third value is is_causal's index,
    # the fourth the cumulative sequence lengths' (torch 2.13 native_functions.yaml).
    **{
        name: partial(_attention, backward=backward, heads_second=True, causal=causal, cu_seqlens=seqs)
        for name, backward, causal, seqs in (
            ("scaled_dot_product_attention", False, 5, None),
            ("_scaled_dot_product_flash_attention", False, 4, None),
            ("_scaled_dot_product_efficient_attention", False, 6, None),
            ("_scaled_dot_product_cudnn_attention", False, 6, None),
            ("_scaled_dot_product_flash_attention_for_cpu", False, 4, None),
            ("_cudnn_attention_forward", False, 10, 4),
            ("_scaled_dot_product_flash_attention_backward", True, 11, None),
            ("_scaled_dot_product_efficient_attention_backward", True, 11, None),
            ("_scaled_dot_product_cudnn_attention_backward", True, 14, None),
            ("_scaled_dot_product_flash_attention_for_cpu_backward", True, 7, None),
            ("_cudnn_attention_backward", True, 14, 9),
        )
    },
    # (B, L, H, E) layout. Forward (query, key, value, cum_seq_q, ...); backward
    # (grad_out, query, key, value, out, logsumexp, cum_seq_q, ...).
    "_flash_attention_forward": partial(
        _attention, backward=False, heads_second=False, causal=8, cu_seqlens=3
    ),
    "_flash_attention_backward": partial(
        _attention, backward=True, heads_second=False, causal=11, cu_seqlens=6
    ),
    # Forward (query, key, value, bias, cu_seqlens_q, ...); backward
    # (grad_out, query, key, value, bias, out, cu_seqlens_q, ...). The mask is custom_mask_type.
    "_efficient_attention_forward": partial(
        _attention, backward=False, heads_second=False, causal=9, cu_seqlens=4, mask_type=True
    ),
    "_efficient_attention_backward": partial(
        _attention, backward=True, heads_second=False, causal=14, cu_seqlens=6, mask_type=True
    ),
    "convolution_backward": _conv_backward,
    "cudnn_convolution_backward_input": partial(_conv_grad, weight=2),
    "cudnn_convolution_backward_weight": partial(_conv_grad, weight=None),
}

_CONV_LAYOUTS = {
    # (input, weight, bias, stride, padding, dilation, groups)
    "conv1d": _ConvLayout(3, 4, 5, False),
    "conv2d": _ConvLayout(3, 4, 5, False),
    "conv3d": _ConvLayout(3, 4, 5, False),
    # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...)
    "convolution": _ConvLayout(3, 4, 5, 6),
    "_convolution": _ConvLayout(3, 4, 5, 6),
    "convolution_overrideable": _ConvLayout(3, 4, 5, 6),
    # (self, weight, padding, stride, dilation, groups, ...): no bias argument
    "cudnn_convolution": _ConvLayout(3, 2, 4, False),
    # (self, weight, bias, padding, stride, dilation, groups)
    "mkldnn_convolution": _ConvLayout(4, 3, 5, False),
    "miopen_convolution": _ConvLayout(4, 3, 5, False),
    # (self, weight, kernel_size, bias, stride, padding[, dilation]): CPU fallbacks
    "_slow_conv2d_forward": _ConvLayout(4, 5, None, False),
    "slow_conv3d": _ConvLayout(4, 5, None, False),
    "slow_conv3d_forward": _ConvLayout(4, 5, None, False),
    "slow_conv_dilated2d": _ConvLayout(4, 5, 6, False),
    "slow_conv_dilated3d": _ConvLayout(4, 5, 6, False),
    # transposed: FLOPs need only the input's shape
    "conv_transpose1d": _ConvLayout(None, None, None, True),
    "conv_transpose2d": _ConvLayout(None, None, None, True),
    "conv_transpose3d": _ConvLayout(None, None, None, True),
    "cudnn_convolution_transpose": _ConvLayout(None, None, None, True),
}
_HANDLERS.update({name: partial(_conv, layout=layout) for name, layout in _CONV_LAYOUTS.items()})

# Forward convolutions, whose output size needs stride/padding/dilation (or the backward's grad_output).
CONV_FORWARD_OPS: frozenset[str] = frozenset(
    f"aten::{name}" for name, layout in _CONV_LAYOUTS.items() if layout.transposed is not True
)

# torch 1.x's weight gradient, whose weight shape comes from its forward op (timeline/rank.py).
CONV_WEIGHT_GRAD = "aten::cudnn_convolution_backward_weight"

# Every op op_flops knows (their in-place variants, aten::addmm_ ..., count too).
SUPPORTED_OPS: frozenset[str] = frozenset(f"aten::{name}" for name in _HANDLERS)


def op_flops(
    name: str,
    input_dims: list[Any] | None,
    input_types: list[Any] | None = None,
    concrete_inputs: list[Any] | None = None,
    output_dims: list[Any] | None = None,
) -> OpFlops | None:
    """FLOPs of one recorded op, or None if it is not a matmul, attention or convolution op, or
    its arguments are missing or malformed. `concrete_inputs` (args["Concrete Inputs"]) is needed
    only for a forward convolution's stride, padding and dilation; without them (traces before
    torch 2.1 record none), `output_dims`, the output shape the matching backward op's
    grad_output gives, stands in for them. For CONV_WEIGHT_GRAD, `output_dims` is the weight's
    shape, from its forward op."""
    if not isinstance(name, str) or not isinstance(input_dims, list):
        return None
    bare = name.removeprefix("aten::")
    # In-place variants (aten::addmm_, aten::addmv_) count as their functional op.
    handler = _HANDLERS.get(bare) or _HANDLERS.get(bare.removesuffix("_"))
    if handler is None:
        return None
    args = _Args(
        dims=input_dims,
        types=input_types if isinstance(input_types, list) else [],
        concrete=concrete_inputs if isinstance(concrete_inputs, list) else [],
        output=output_dims,
    )
    return handler(args)
