"""Convolution FLOPs (issue 13 class 8), derived by hand: from stride/padding/dilation where the
trace records them (Concrete Inputs), else from the output size the matching backward op gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from diag.ingest.options import IngestOptions
from diag.ingest.pipeline import ingest
from diag.knowledge.flops import CONV_FORWARD_OPS, op_flops
from diag.runtime import store
from diag.timeline.op_shapes import _conv_outputs
from diag.timeline.rank import rank_files, read_rank

# A cuDNN forward convolution as a CUDA trace records it: aten::cudnn_convolution(self, weight,
# padding, stride, dilation, groups, benchmark, deterministic, allow_tf32).
CUDNN_DIMS = [[32, 64, 56, 56], [128, 64, 3, 3], [], [], [], [], [], [], []]
CUDNN_TYPES = ["c10::Half", "c10::Half", "ScalarList", "ScalarList", "ScalarList", "Int", "Scalar", "Scalar", "Scalar"]
CUDNN_CONCRETE = ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"]


def test_cudnn_convolution_by_hand() -> None:
    # Hout = Wout = floor((56 + 2·1 − 1·(3−1) − 1) / 2) + 1 = 28;
    # FLOPs = 2 · N · Cout · Hout · Wout · (Cin/groups) · kh · kw = 2 · 32 · 128 · 28 · 28 · 64 · 3 · 3.
    op = op_flops("aten::cudnn_convolution", CUDNN_DIMS, CUDNN_TYPES, CUDNN_CONCRETE)
    assert op is not None and op.kind == "conv" and op.dtype == "fp16"
    assert op.flops == 2 * 32 * 128 * 28 * 28 * 64 * 3 * 3 == 3_699_376_128


def test_grouped_convolution_by_hand() -> None:
    # Depthwise-style, groups 4: weight (Cout 8, Cin/groups 2, 3, 3); padding 1, stride 1 keep 10×10.
    concrete = ["", "", "[1, 1]", "[1, 1]", "[1, 1]", "4", "False", "False", "True"]
    op = op_flops("aten::cudnn_convolution", [[2, 8, 10, 10], [8, 2, 3, 3]], ["float", "float"], concrete)
    assert op is not None and op.flops == 2 * 2 * 8 * 10 * 10 * 2 * 3 * 3


def test_without_concrete_inputs_the_output_comes_from_the_given_shape() -> None:
    dims = CUDNN_DIMS[:2]
    assert op_flops("aten::cudnn_convolution", dims, CUDNN_TYPES) is None   # stride unknown
    op = op_flops("aten::cudnn_convolution", dims, CUDNN_TYPES, None, [32, 128, 28, 28])
    assert op is not None and op.flops == 2 * 32 * 128 * 28 * 28 * 64 * 3 * 3
    # A shape that does not fit the input and weight (batch or channels differ) is not used.
    assert op_flops("aten::cudnn_convolution", dims, CUDNN_TYPES, None, [16, 128, 28, 28]) is None
    assert op_flops("aten::cudnn_convolution", dims, CUDNN_TYPES, None, [32, 64, 28, 28]) is None


def test_forward_output_from_the_matching_backward_op(tmp_path: Path) -> None:
    """A real torch.profiler capture of conv2d forward and backward, with Concrete Inputs taken
    out (as traces before torch 2.1 record): the forward conv ops get their output shape from the
    aten::convolution_backward whose autograd node has their sequence number."""
    x = torch.randn(2, 3, 16, 16)
    w = torch.randn(8, 3, 3, 3, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        F.conv2d(x, w, stride=2, padding=1).sum().backward()
    path = tmp_path / "rank-0.pt.trace.json"
    prof.export_chrome_trace(str(path))
    trace: dict[str, Any] = json.loads(path.read_text())
    for e in trace["traceEvents"]:
        e.get("args", {}).pop("Concrete Inputs", None)
    path.write_text(json.dumps(trace))

    con = store.connect(None)
    ingest([str(path)], con, IngestOptions(jobs=1))
    ops = read_rank(con, rank_files(con)[0]).ops
    out = _conv_outputs(ops).to_pylist()
    rows = ops.to_pylist()
    forward = [i for i, r in enumerate(rows) if r["name"] in CONV_FORWARD_OPS]
    assert forward
    # Hout = Wout = floor((16 + 2 − 2 − 1) / 2) + 1 = 8: grad_output is (2, 8, 8, 8).
    assert {out[i] for i in forward} == {"[2, 8, 8, 8]"}
    counted = {rows[i]["name"]: op_flops(rows[i]["name"], json.loads(rows[i]["dims"]), json.loads(rows[i]["types"]),
                                         None, json.loads(out[i] or "null")) for i in forward}
    # The innermost op (mkldnn_convolution on CPU, cudnn_convolution on CUDA) is never transposed,
    # so its FLOPs follow: 2 · N · Cout · Hout · Wout · Cin · kh · kw = 2 · 2 · 8 · 8 · 8 · 3 · 3 · 3.
    # aten::convolution records `transposed` only in Concrete Inputs: without them it stays unknown.
    known = [op.flops for op in counted.values() if op is not None]
    assert known and set(known) == {2 * 2 * 8 * 8 * 8 * 3 * 3 * 3} == {55_296}, counted
    assert counted.get("aten::convolution") is None
    # Ops that are not forward convolutions get nothing.
    assert all(out[i] is None for i, r in enumerate(rows) if r["name"] == "aten::convolution_backward")


def _op(name: str, ts: float, dur: float, dims: list[Any], seq: int | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"External id": int(ts), "Input Dims": dims, "Input type": ["float"] * len(dims)}
    if seq is not None:
        args["Sequence number"] = seq
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": "5555", "ts": ts, "dur": dur, "args": args}


def test_torch_1x_backward_halves_and_the_forward_they_pair_with(tmp_path: Path) -> None:
    """A torch 1.9-era ResNet conv as its trace records it: no Concrete Inputs; the forward
    aten::cudnn_convolution and the autograd node share sequence number 7; the backward runs as
    aten::cudnn_convolution_backward > _input and _weight, whose weight_size/self_size are lists
    with no dims. The forward's output comes from grad_output, backward_weight's weight from the
    forward; every op's FLOPs then follow by hand (stride 2, padding 1: 32 → 16)."""
    x, w, g = [8, 3, 32, 32], [16, 3, 3, 3], [8, 16, 16, 16]
    events = [
        _op("aten::conv2d", 0, 100, [x, w, [], [], [], [], []], seq=7),
        _op("aten::cudnn_convolution", 10, 80, [x, w, [], [], [], [], [], [], []], seq=7),
        _op("autograd::engine::evaluate_function: CudnnConvolutionBackward", 1000, 300, [], seq=7),
        _op("CudnnConvolutionBackward", 1010, 280, [[]], seq=7),
        _op("aten::cudnn_convolution_backward", 1020, 260, [x, g, w, [], [], [], [], [], [], [], []]),
        _op("aten::cudnn_convolution_backward_input", 1030, 100, [[], g, w, [], [], [], [], [], [], []]),
        _op("aten::cudnn_convolution_backward_weight", 1150, 100, [[], g, x, [], [], [], [], [], [], []]),
    ]
    path = tmp_path / "rank-0.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    con = store.connect(None)
    ingest([str(path)], con, IngestOptions(jobs=1))
    ops = read_rank(con, rank_files(con)[0]).ops
    out = dict(zip(ops.column("name").to_pylist(), _conv_outputs(ops).to_pylist(), strict=True))
    assert out["aten::cudnn_convolution"] == "[8, 16, 16, 16]"      # grad_output of the backward
    assert out["aten::cudnn_convolution_backward_weight"] == "[16, 3, 3, 3]"   # the forward's weight
    assert out["aten::cudnn_convolution_backward_input"] is None
    # 2 · N · Cout · Hout · Wout · Cin · kh · kw = 2 · 8 · 16 · 16 · 16 · 3 · 3 · 3, once per op.
    each = 2 * 8 * 16 * 16 * 16 * 3 * 3 * 3
    rows = {r["name"]: r for r in ops.to_pylist()}
    for name in ("aten::cudnn_convolution", "aten::cudnn_convolution_backward_input",
                 "aten::cudnn_convolution_backward_weight"):
        op = op_flops(name, json.loads(rows[name]["dims"]), json.loads(rows[name]["types"]), None,
                      json.loads(out[name] or "null"))
        assert op is not None and op.flops == each == 1_769_472, name
    # Without its forward's weight, backward_weight cannot be counted.
    assert op_flops("aten::cudnn_convolution_backward_weight", [[], g, x], ["float"] * 3) is None


def test_an_inference_conv_takes_its_output_from_the_op_that_consumes_it(tmp_path: Path) -> None:
    """No backward, no Concrete Inputs (a torch 1.x inference capture): the output is the input of
    the next op that takes a tensor of the conv's batch and channels (here the batch norm)."""
    x, w = [8, 3, 32, 32], [16, 3, 3, 3]
    events = [
        _op("aten::conv2d", 0, 100, [x, w, [], [], [], [], []]),
        _op("aten::cudnn_convolution", 10, 80, [x, w, [], [], [], [], [], [], []]),
        _op("aten::relu", 120, 10, [[8, 3, 32, 32]]),                    # not its batch and channels
        _op("aten::batch_norm", 140, 20, [[8, 16, 16, 16], [16], [16], [16], [16], [], [], [], []]),
        _op("aten::conv2d", 200, 100, [[8, 16, 16, 16], [32, 16, 3, 3], [], [], [], [], []]),
        _op("aten::add", 320, 10, [[8, 32, 40, 40], [8, 32, 40, 40], []]),   # larger than any padding allows
    ]
    path = tmp_path / "rank-0.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    con = store.connect(None)
    ingest([str(path)], con, IngestOptions(jobs=1))
    ops = read_rank(con, rank_files(con)[0]).ops
    got = [(r["name"], r["ts"], o) for r, o in zip(ops.to_pylist(), _conv_outputs(ops).to_pylist(), strict=True)
           if r["name"] in CONV_FORWARD_OPS]
    assert [o for _, _, o in got] == ["[8, 16, 16, 16]", "[8, 16, 16, 16]", None], got
    rows = [r for r in ops.to_pylist() if r["name"] == "aten::cudnn_convolution"]
    op = op_flops("aten::cudnn_convolution", json.loads(rows[0]["dims"]), json.loads(rows[0]["types"]), None,
                  [8, 16, 16, 16])
    assert op is not None and op.flops == 2 * 8 * 16 * 16 * 16 * 3 * 3 * 3
