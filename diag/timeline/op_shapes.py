"""FLOPs and bytes of each GPU kernel from the CPU op that launched it: the op's input shapes
(`Input Dims`, `Input type`, `Concrete Inputs`), a convolution's output from the op that consumes
it when the trace lacks stride and padding, and each kernel's signature (op and shapes) for the
rules that group kernels by it (diag/knowledge/flops.py holds the arithmetic)."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from diag.knowledge import flops as flops_mod
from diag.timeline.columns import _ATTENTION, _GEMM, _OTHER, I64, _ints, _valid, numpy_of
from diag.timeline.nesting import distinct

# Up to this many launching ops, each one's shapes are worked out on its own (_op_flops is cached):
# finding the distinct ones first (_signatures: five columns encoded) cost a rank of 20 kernels
# more than it saved, 0.5 of its ~4.5 ms map.
_FEW_OPS = 64


@functools.cache
def _conv_forward() -> pa.Array:
    """The forward convolution ops' names, made at first use: an array built at import would have
    pyarrow look for pandas before diag/runtime/no_pandas.py's guard is in place."""
    return pa.array(sorted(flops_mod.CONV_FORWARD_OPS))


def _kernel_shapes(
    ops: pa.Table, op_idx: I64, kclass: npt.NDArray[np.intp], dur: I64
) -> tuple[npt.NDArray[np.float64], list[Any], list[str | None], list[float | None], list[float | None]]:
    """FLOPs, GEMM m_n_k, dtype, bytes and the profiler's FLOPs per activity, from its launching
    op's shapes. A matmul kernel gets its op's FLOPs, split over the op's matmul kernels in
    proportion to their durations (split-K GEMMs launch more than one). Another compute kernel
    gets the bytes its op must move at least: its tensor inputs read once and an output the size
    of the largest input written once (norms, elementwise, optimizer updates), split evenly over
    the op's such kernels. Each distinct (name, shapes) of the launching ops is worked out once:
    the control trace's 6.9k launching ops per rank have 455."""
    n = len(op_idx)
    flops = np.zeros(n, np.float64)
    mnk, dtype, nbytes, tflops = (np.full(n, None, dtype=object) for _ in range(4))
    matmul = (op_idx >= 0) & ((kclass == _GEMM) | (kclass == _ATTENTION))
    other = (op_idx >= 0) & (kclass == _OTHER)
    used = distinct(op_idx[matmul | other])
    if len(used):
        # Only a forward convolution (or torch 1.x's weight gradient) among the launching ops has a
        # partner's shape to look up.
        conv = pc.any(pc.is_in(ops.column("name").take(used), _conv_forward())).as_py() or \
            pc.any(pc.equal(ops.column("name").take(used), flops_mod.CONV_WEIGHT_GRAD)).as_py()
        ops = ops.append_column("conv_out", _conv_outputs(ops) if conv else pa.nulls(ops.num_rows, pa.string()))
        sig, one = _signatures(ops, used) if len(used) > _FEW_OPS else (np.arange(len(used)), np.arange(len(used)))
        rep = {c: ops.column(c).take(used[one]).to_pylist() for c in ("name", "dims", "types", "concrete", "conv_out")}
        shapes = [_shape_flops(*r) for r in zip(rep["name"], rep["dims"], rep["types"], rep["concrete"],
                                                 rep["conv_out"], strict=True)]
        group = np.searchsorted(used, op_idx)   # each activity's op among `used` (where it has one)

        a = np.nonzero(matmul)[0]
        total = np.zeros(len(used), np.int64)
        np.add.at(total, group[a], dur[a])
        count = np.bincount(group[a], minlength=len(used))
        a = a[np.array([f is not None for f in shapes], bool)[sig[group[a]]]]
        g = group[a]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(total[g] > 0, dur[a] / total[g], 1.0 / count[g])
        s = sig[g]
        flops[a] = np.array([f.flops if f is not None else 0.0 for f in shapes], np.float64)[s] * share
        moved = [f.bytes_moved if f is not None else None for f in shapes]
        m = np.array([x is not None for x in moved], bool)[s]
        nbytes[a[m]] = np.array([x or 0.0 for x in moved], np.float64)[s[m]] * share[m]
        mnk[a] = _objects([f.m_n_k if f is not None else None for f in shapes])[s]
        dtype[a] = _objects([f.dtype if f is not None else None for f in shapes])[s]
        tflops[a] = np.array(ops.column("trace_flops").take(op_idx[a]).to_pylist(), dtype=object)

        b = np.nonzero(other)[0]
        count = np.bincount(group[b], minlength=len(used))
        tensor = [_tensor_bytes(dims, types) for dims, types in zip(rep["dims"], rep["types"], strict=True)]
        b = b[np.array([bool(t) for t in tensor], bool)[sig[group[b]]]]
        nbytes[b] = np.array([t or 0.0 for t in tensor], np.float64)[sig[group[b]]] / count[group[b]]
    return flops, mnk.tolist(), dtype.tolist(), nbytes.tolist(), tflops.tolist()


def _objects(values: list[Any]) -> npt.NDArray[np.object_]:
    """A 1-d object array of `values`, tuples kept whole (np.array would make them a dimension)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _signatures(ops: pa.Table, rows: I64) -> tuple[I64, I64]:
    """For ops `rows`: each one's index among the distinct (name, input dims, input types,
    concrete inputs) they have, and a position in `rows` of one op of each."""
    sig = np.zeros(len(rows), np.int64)
    for c in ("name", "dims", "types", "concrete", "conv_out"):
        codes = ops.column(c).take(rows).combine_chunks().dictionary_encode(null_encoding="encode").indices
        code = np.asarray(codes, np.int64)
        # Both below len(rows): the product stays far inside int64.
        _, sig = np.unique(sig * (int(code.max()) + 1) + code, return_inverse=True)
    sig = sig.astype(np.int64)
    one = np.zeros(int(sig.max()) + 1, np.int64)
    one[sig] = np.arange(len(sig))   # whichever op of a signature lands: they are all alike
    return sig, one


def _shape_flops(name: str | None, dims: str | None, types: str | None, concrete: str | None,
                 conv_out: str | None) -> flops_mod.OpFlops | None:
    if dims is None or (name or "").removesuffix("_") not in flops_mod.SUPPORTED_OPS:
        return None
    return _op_flops(name or "", dims, types, concrete, conv_out)


# How far back, among ops that carry a sequence number, to look for the one enclosing an op: the
# autograd node or the outer forward op sits right before it (conv2d > convolution > cudnn_convolution).
_SEQ_LOOKBACK = 16


# The backward ops of a convolution and where their grad_output is: torch 2's
# convolution_backward(grad_output, input, weight, ...); torch 1.x's cudnn_convolution_backward(self,
# grad_output, weight, ...) and its _input/_weight halves (grad_output second in each).
_GRAD_OUTPUT_AT = {
    "aten::convolution_backward": 0, "aten::cudnn_convolution_backward": 1,
    "aten::cudnn_convolution_backward_input": 1, flops_mod.CONV_WEIGHT_GRAD: 1,
}


def _conv_outputs(ops: pa.Table) -> pa.Array:
    """Per op, the shape its FLOPs need from its partner op, as JSON text, else null. A forward
    convolution with shapes (its stride unknown where `Concrete Inputs` are off or, before torch
    2.1, not recorded): its output shape, from
    the grad_output of a backward op (_GRAD_OUTPUT_AT) whose autograd node has the same sequence
    number as the forward op around it. torch 1.x's cudnn_convolution_backward_weight: its weight's
    shape, from the forward convolution of the same sequence number."""
    name, dims = ops.column("name"), ops.column("dims")
    conv = numpy_of(pc.is_in(name, _conv_forward()).fill_null(False), bool) & _valid(dims)
    # Every forward convolution, not only those with no `Concrete Inputs`: with the recording of
    # concrete inputs off (torch >= 2.1's knob), torch 2.11 still writes the scalars and leaves the
    # stride and padding lists "" (a real H200 capture). flops.py takes stride/padding when they are
    # there and this output only when they are not.
    fwd = conv
    bwd = numpy_of(pc.is_in(name, pa.array(sorted(_GRAD_OUTPUT_AT))).fill_null(False), bool) & _valid(dims)
    wgrad = numpy_of(pc.equal(name, flops_mod.CONV_WEIGHT_GRAD).fill_null(False), bool) & _valid(dims)
    out: list[str | None] = [None] * ops.num_rows
    if not fwd.any() and not wgrad.any():
        return pa.array(out, pa.string())
    seq_of = _enclosing_seq(ops, np.nonzero(conv | bwd)[0])
    grad_out: dict[int, str] = {}
    weight: dict[int, str] = {}
    for i in np.nonzero(bwd)[0].tolist():
        parsed = json.loads(dims[i].as_py())
        at = _GRAD_OUTPUT_AT[name[i].as_py()]
        if i in seq_of and isinstance(parsed, list) and len(parsed) > at and parsed[at]:
            grad_out.setdefault(seq_of[i], json.dumps(parsed[at]))
    for i in np.nonzero(conv)[0].tolist():
        parsed = json.loads(dims[i].as_py())
        if i in seq_of and isinstance(parsed, list) and len(parsed) > 1 and parsed[1]:
            weight.setdefault(seq_of[i], json.dumps(parsed[1]))
    for i in np.nonzero(fwd)[0].tolist():
        out[i] = grad_out.get(seq_of.get(i, -1)) or _consumer_input(ops, i)
    for i in np.nonzero(wgrad)[0].tolist():
        out[i] = weight.get(seq_of.get(i, -1))
    return pa.array(out, pa.string())


# How many ops after a forward convolution, on its thread, to look at for the one that takes its
# output: the bias add, batch norm or activation comes next (ResNet: conv → batch_norm → relu_).
_CONSUMER_LOOKAHEAD = 16


def _consumer_input(ops: pa.Table, i: int) -> str | None:
    """A forward convolution's output shape with no backward to give it (an inference capture):
    the first input of the first op on its thread that starts after it ends and takes a tensor of
    the output's batch and channels, `len(input)` dims, each spatial size at most input + kernel − 1
    (the most padding can add). JSON text, or None."""
    tid, ts, end = (ops.column(k) for k in ("tid", "ts", "end"))
    dims = json.loads(ops.column("dims")[i].as_py())
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    x, w = dims[0], dims[1]
    if not (isinstance(x, list) and isinstance(w, list) and len(x) == len(w) >= 3):
        return None
    me, done = tid[i].as_py(), end[i].as_py()
    seen = 0
    for j in range(i + 1, ops.num_rows):
        if tid[j].as_py() != me or seen >= _CONSUMER_LOOKAHEAD:
            return None
        if ts[j].as_py() < done:
            continue   # inside the convolution (its own ops)
        seen += 1
        text = ops.column("dims")[j].as_py()
        first = json.loads(text)[0] if text else None
        if isinstance(first, list) and len(first) == len(x) and first[:2] == [x[0], w[0]] and all(
                type(o) is int and 1 <= o <= xi + k - 1 for o, xi, k in zip(first[2:], x[2:], w[2:], strict=True)):
            return json.dumps(first)
    return None


def _enclosing_seq(ops: pa.Table, rows: I64) -> dict[int, int]:
    """For ops `rows`: the sequence number of the innermost op on the same thread that encloses
    each (itself included) and carries one. Ops are ordered (tid, ts, longest first), so an op's
    ancestors come before it."""
    tid, ts, end = (_ints(ops.column(k)) for k in ("tid", "ts", "end"))
    seq = _ints(ops.column("seq"))
    carriers = np.nonzero(_valid(ops.column("seq")))[0]
    found: dict[int, int] = {}
    for i, p in zip(rows.tolist(), (np.searchsorted(carriers, rows, side="right") - 1).tolist(), strict=True):
        for j in range(p, max(p - _SEQ_LOOKBACK, -1), -1):
            c = carriers[j]
            if tid[c] != tid[i]:
                break
            if ts[c] <= ts[i] and end[c] >= end[i]:
                found[i] = int(seq[c])
                break
    return found


# Bytes per element of the `Input type` strings record_shapes writes.
_ELEM_BYTES = {
    "float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "int": 4, "long int": 8, "long": 8,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "bool": 1, "unsigned char": 1, "signed char": 1,
}


@functools.lru_cache(maxsize=65536)
def _op_flops(name: str, dims_text: str, types_text: str | None, concrete_text: str | None,
              out_text: str | None = None) -> flops_mod.OpFlops | None:
    # Cached: a step repeats the same few shapes thousands of times.
    try:
        dims = json.loads(dims_text)
        types = json.loads(types_text) if types_text else None
        concrete = json.loads(concrete_text) if concrete_text else None
        output = json.loads(out_text) if out_text else None
    except (TypeError, ValueError):
        return None
    return flops_mod.op_flops(name, dims, types, concrete, output)


@functools.lru_cache(maxsize=65536)
def _tensor_bytes(dims_text: str | None, types_text: str | None) -> float | None:
    # Cached: a step repeats the same few shapes thousands of times.
    if not dims_text or not types_text:
        return None
    try:
        dims, types = json.loads(dims_text), json.loads(types_text)
    except ValueError:
        return None
    if not isinstance(dims, list) or not isinstance(types, list):   # `Input Dims`: 5, not [[5]]
        return None
    sizes = []
    for d, t in zip(dims, types, strict=False):  # malformed records: take what pairs up
        size = _ELEM_BYTES.get(t) if isinstance(t, str) else None
        if size and isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            sizes.append(float(math.prod(d)) * size)
    return sum(sizes) + max(sizes) if sizes else None


def innermost_counted(thread: I64, ts: I64, end: I64, matmul: npt.NDArray[np.bool_],
                      flops: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """On a host timeline (a CPU-only run) every op of a tree is an activity: aten::conv2d >
    convolution > _convolution > mkldnn_convolution, aten::linear > addmm. Each tree is counted once,
    at its innermost op with FLOPs (flops.py's rule); the matmul-class ops that enclose one such op
    on their thread are returned, to be counted as other ops (their own time outside it is not a
    matmul's). An enclosing op with no FLOPs-bearing op inside stays a matmul of unknown FLOPs."""
    outer = np.zeros(len(ts), bool)
    idx = np.nonzero(matmul)[0]
    # Parents first: by thread, start, and the longer of two spans that start together.
    order = idx[np.lexsort((idx, -end[idx], ts[idx], thread[idx]))]
    open_: list[int] = []
    for i in order.tolist():
        while open_ and (thread[open_[-1]] != thread[i] or end[open_[-1]] < end[i] or ts[open_[-1]] > ts[i]):
            open_.pop()
        if flops[i] > 0:
            outer[open_] = True
        open_.append(i)
    return outer
