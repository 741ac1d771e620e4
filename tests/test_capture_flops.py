"""FLOPs and MFU from real torch.profiler captures (issue 36), each checked against a count made by
hand from the model's layer shapes, never from diag's code. CPU captures made here:

- a small convnet's training step (conv2d with stride and padding, batch norm, linear), with
  `Concrete Inputs` and with them turned off (torch 2.x then records the key with its lists blank:
  no stride, padding or output_mask);
- an attention block's inference step (linear, scaled_dot_product_attention, bmm) taken right after a
  warm-up step, under a schedule of three cycles (three files of one process: three capture windows).

A CPU capture has no GPU and so no peak: diag shows the FLOPs per step and says why MFU is absent;
given --peak-tflops, MFU = model FLOPs per step ÷ (step time × peak), derived here from the trace's
own ProfilerStep span.

And GPU captures of the same convnet and of a larger attention block on an H200, recorded once
(tests/data/gpu_captures/h200_fp32/README.md says how): the convnet's step with and without Concrete Inputs, and
the attention block's step right after an unsynchronized warm-up step whose kernels were still queued.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from diag.api import analyze_path
from diag.engine.run import AnalyzeOptions
from diag.outputs.report import render_markdown, render_text, to_json
from diag.outputs.report_types import to_typed
from diag.runtime.durations import flop_count, percent

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
CAPTURES = Path(__file__).parent / "data" / "gpu_captures" / "h200_fp32"

CAPTURE = textwrap.dedent(
    """
    import sys, torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    out, case = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    if case == "convnet-blank":
        torch._C._profiler._set_record_concrete_inputs_enabled_val(False)
    if case.startswith("convnet"):
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, stride=1, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 16, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        cycles = dict(wait=0, warmup=1, active=1, repeat=1)
        handler = lambda p: p.export_chrome_trace(out + "/convnet.pt.trace.json")
    else:
        qkv, proj = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)
        x = torch.randn(2, 16, 32)

        @torch.no_grad()
        def step():
            q, k, v = (t.reshape(2, 16, 4, 8).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 16, 32)
            torch.bmm(proj(a), x.transpose(1, 2)).sum()
        cycles = dict(wait=1, warmup=1, active=1, repeat=3)
        handler = tensorboard_trace_handler(out)
    step()   # the warm-up step, before the profiler starts
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(**cycles),
                 on_trace_ready=handler) as prof:
        for _ in range(sum(cycles[k] for k in ("wait", "warmup", "active")) * cycles["repeat"]):
            step()
            prof.step()
    """
)

# The convnet by hand: FLOPs of a convolution are 2 · N · Cout · Hout · Wout · Cin · kh · kw, with
# Hout = floor((H + 2·padding − kh) / stride) + 1; of a linear layer 2 · rows · out · in.
N = 8
CONV1 = 2 * N * 8 * 16 * 16 * 3 * 3 * 3        # 3 → 8 channels, 32×32 at stride 2, padding 1: 16×16
CONV2 = 2 * N * 16 * 16 * 16 * 8 * 3 * 3       # 8 → 16 channels, 16×16 at stride 1, padding 1: 16×16
LINEAR = 2 * N * 10 * (16 * 16 * 16)
FORWARD = CONV1 + CONV2 + LINEAR               # 6,258,688
# The backward: a gradient for the input and one for the weight of each layer, each the forward's
# FLOPs, but the first convolution's input needs none: its backward is one forward's worth.
BACKWARD = CONV1 + 2 * CONV2 + 2 * LINEAR

# The attention block by hand, B 2, L 16, model width 32, 4 heads of 8.
ROWS = 2 * 16
ATTENTION_FORWARD = (2 * ROWS * 96 * 32               # qkv projection
                     + 4 * 2 * 4 * 16 * 16 * 8        # QKᵀ and PV: 4 · B · H · L · S · E
                     + 2 * ROWS * 32 * 32             # output projection
                     + 2 * 2 * 16 * 16 * 32)          # bmm [2,16,32] × [2,32,16]

PEAK_TFLOPS = 0.05


def _capture(tmp_path: Path, case: str) -> Path:
    out = tmp_path / case
    out.mkdir()
    subprocess.run([sys.executable, "-c", CAPTURE, str(out), case], check=True, timeout=300)
    return out


def _steps(trace_dir: Path) -> list[float]:
    """Each file's step window, seconds: on a host timeline (its activities the aten ops) it begins
    where its ProfilerStep span does (the first step of its capture window) and ends where the span
    or the last aten op started inside it ends, whichever is later (an op can outlast the span by
    the profiler's own bookkeeping)."""
    spans = []
    for path in sorted(trace_dir.glob("*.json")):
        events = json.loads(path.read_text())["traceEvents"]
        (step,) = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
        start, end = step["ts"], step["ts"] + step["dur"]
        ops = [e["ts"] + e["dur"] for e in events if e.get("cat") == "cpu_op"
               and str(e.get("name")).startswith("aten::") and start <= e["ts"] <= end]
        spans.append((max([end, *ops]) - start) * 1e-6)
    return spans


def _analyze(path: Path, peak: float | None = None) -> dict[str, Any]:
    _, report = analyze_path(str(path), None, AnalyzeOptions(peak_tflops=peak), warn=False)
    return report


@pytest.fixture(scope="module")
def convnet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("convnet")
    return {case: _capture(tmp, case) for case in ("convnet", "convnet-blank")}


@needs_torch
@pytest.mark.parametrize("case", ["convnet", "convnet-blank"])
def test_convnet_training_flops_by_hand(convnet: dict[str, Path], case: str) -> None:
    """Every matmul-class op of the step is counted once (the innermost op of aten::conv2d >
    convolution > _convolution > mkldnn_convolution, of aten::linear > addmm). Without Concrete
    Inputs the convolutions' outputs come from their backward's grad_output, and the backward's
    output_mask is unknown: both gradients are counted, the first layer's input one too (one
    forward of CONV1 more than ran)."""
    r = _analyze(convnet[case])
    assert r["timeline"] == "host" and r["workload"] == "training" and r["steps"] == 1
    over = CONV1 if case == "convnet-blank" else 0
    assert r["flops_per_step"] == {"model": 3.0 * FORWARD, "forward": float(FORWARD),
                                   "executed": float(FORWARD + BACKWARD + over)}
    assert r["flops_coverage"] == 1.0
    _says_how_masks_were_counted(r, case)
    # No GPU, no peak: no MFU, the reason said, and the FLOPs shown all the same.
    assert r["mfu"] is None and r["mfu_range"] is None and r["device"]["peak_tflops"] is None
    text = render_text(r)
    flops = f"FLOPs/step: model {flop_count(3 * FORWARD)} (3 × forward {flop_count(FORWARD)})"
    assert flops in text and flops in render_markdown(r)
    assert "MFU needs a peak, and there is no GPU to take one from: pass --peak-tflops with the CPU's" in text
    assert "no GPU in the trace and no --peak-tflops: MFU unknown" in text


def _says_how_masks_were_counted(r: dict[str, Any], case: str) -> None:
    """Without Concrete Inputs a note says how the two convolution backwards were counted."""
    said = [n for n in r["notes"] if "aten::convolution_backward ops record no output_mask" in n]
    assert said == ([] if "blank" not in case else [
        "2 aten::convolution_backward ops record no output_mask (no Concrete Inputs): counted as computing both "
        "the input and the weight gradient, each its forward's FLOPs; a first layer computes only the weight's, "
        "so executed FLOPs (HFU) count one forward more for it, model FLOPs (3 × forward) none"])


@needs_torch
def test_convnet_mfu_against_a_given_peak(convnet: dict[str, Path]) -> None:
    """With --peak-tflops, MFU = 3 × forward FLOPs ÷ (step window × peak); HFU counts what ran."""
    path = convnet["convnet"]
    r = _analyze(path, PEAK_TFLOPS)
    (window,) = _steps(path)
    assert r["step_time_s"] == pytest.approx(window, rel=1e-6)
    assert r["device"]["peak_tflops"] == PEAK_TFLOPS
    assert r["mfu"] == pytest.approx(3 * FORWARD / (window * PEAK_TFLOPS * 1e12), rel=1e-6)
    assert r["hfu"] == pytest.approx(3 * FORWARD / (window * PEAK_TFLOPS * 1e12), rel=1e-6)   # no recompute
    assert r["ledger"]["model_compute"] == pytest.approx(r["mfu"], rel=1e-6)
    text = render_text(r)
    assert f"MFU {percent(r['mfu'])}" in text and f"MFU against --peak-tflops {PEAK_TFLOPS:g}" in text
    assert any(n.startswith("CPU-only trace") and n.endswith("over the analyzed steps") for n in r["notes"])
    page = subprocess.run([sys.executable, "-m", "diag.cli", "analyze", str(path), "--format", "html"],
                          capture_output=True, text=True, check=True, timeout=300).stdout
    assert f"FLOPs/step: model, executed<b>{flop_count(3 * FORWARD)}, {flop_count(FORWARD + BACKWARD)}" in page


@needs_torch
def test_attention_step_after_a_warm_up_in_three_cycles(tmp_path: Path) -> None:
    """Three capture windows of one step each; every step's FLOPs are the block's forward (inference:
    no backward), SDPA counted once (aten::scaled_dot_product_attention contains
    _scaled_dot_product_flash_attention_for_cpu), and MFU is their FLOPs over their windows at the peak."""
    path = _capture(tmp_path, "attention")
    windows = _steps(path)
    assert len(windows) == 3
    r = _analyze(path)
    assert r["workload"] == "inference" and r["steps"] == len(r["ledger_by_step"]) == 3
    assert r["flops_per_step"] == {"model": float(ATTENTION_FORWARD), "forward": float(ATTENTION_FORWARD),
                                   "executed": float(ATTENTION_FORWARD)}
    assert r["mfu"] is None and f"FLOPs/step: model {flop_count(ATTENTION_FORWARD)}, executed" in render_text(r)
    r = _analyze(path, PEAK_TFLOPS)
    expected = 3 * ATTENTION_FORWARD / (sum(windows) * PEAK_TFLOPS * 1e12)   # Σ FLOPs ÷ (Σ windows × peak)
    assert r["mfu"] == pytest.approx(expected, rel=1e-6)


# --- the H200 captures ------------------------------------------------------------------------

H200_FP32 = 67.0   # H200 SXM dense fp32, TFLOP/s (its datasheet: the same compute as the H100 SXM)

# The attention block of the H200 capture, by hand: B 32, L 1024, width 1024, 16 heads of 64.
BIG_ROWS = 32 * 1024
BIG_FORWARD = (2 * BIG_ROWS * 3072 * 1024                   # qkv projection
               + 4 * 32 * 16 * 1024 * 1024 * 64             # QKᵀ and PV: 4 · B · H · L · S · E
               + 10 * (2 * BIG_ROWS * 1024 * 1024           # output projection, ten times
                       + 2 * 32 * 1024 * 1024 * 1024        # bmm [32,1024,1024] × [32,1024,1024]
                       + 2 * 32 * 1024 * 1024 * 1024))      # @ x, the same shapes


def _gpu_trace(name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(gzip.decompress((CAPTURES / name).read_bytes()))["traceEvents"]
    return events


def _windows(events: list[dict[str, Any]]) -> tuple[float, float, int]:
    """The step's window by hand, µs: from the CPU's ProfilerStep start, or from the end of the GPU
    work queued before it that it did not launch (kernels whose correlation no launch call has, ending
    before the step's first launched kernel starts, back to back), to the end of the last kernel the
    step launched (or the CPU span's end, if later); and how many kernels were carried over."""
    (step,) = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    launched = {e["args"]["correlation"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    own = [k for k in kernels if k["args"].get("correlation") in launched]
    first_own = min(k["ts"] for k in own)
    carried = [k for k in kernels if k["args"].get("correlation") not in launched and k["ts"] < first_own]
    start = max([step["ts"], *(k["ts"] + k["dur"] for k in carried)])
    end = max(step["ts"] + step["dur"], *(k["ts"] + k["dur"] for k in own))
    return start, end, len(carried)


@pytest.mark.parametrize("name", ["convnet.pt.trace.json.gz", "convnet-blank.pt.trace.json.gz"])
def test_h200_convnet_training_flops_by_hand(name: str) -> None:
    """The convnet's step on an H200: cuDNN and cuBLAS kernels under each op, the first layer's weight
    gradient a cuDNN direct kernel (wgrad2d_grouped_direct_kernel, a matmul-class row of kernels.toml).
    FLOPs as on the CPU; MFU = 3 × forward ÷ (window × 67 TFLOP/s)."""
    path = CAPTURES / name
    r = _analyze(path)
    over = CONV1 if "blank" in name else 0
    assert r["flops_per_step"] == {"model": 3.0 * FORWARD, "forward": float(FORWARD),
                                   "executed": float(FORWARD + BACKWARD + over)}
    assert r["flops_coverage"] == 1.0 and r["device"]["part"] == "h200" and r["device"]["peak_tflops"] == H200_FP32
    typed = to_typed(json.loads(to_json(r))).flops_per_step
    assert typed is not None and typed.forward == FORWARD
    _says_how_masks_were_counted(r, name)
    start, end, carried = _windows(_gpu_trace(name))
    assert carried == 0 and r["step_time_s"] == pytest.approx((end - start) * 1e-6, rel=1e-6)
    assert r["mfu"] == pytest.approx(3 * FORWARD / ((end - start) * 1e-6 * H200_FP32 * 1e12), rel=1e-6)


def test_h200_single_step_after_an_unsynchronized_warm_up() -> None:
    """The warm-up's 33 kernels (45 ms) still ran when the active step began, with no launch record:
    the step's window begins where they end, every GEMM and attention kernel the step launched has
    shapes, and MFU is a point: the block's forward FLOPs ÷ (window × 67 TFLOP/s)."""
    name = "attention-after-warmup.pt.trace.json.gz"
    r = _analyze(CAPTURES / name)
    start, end, carried = _windows(_gpu_trace(name))
    assert carried == 33
    assert r["workload"] == "inference" and r["flops_coverage"] == 1.0 and r["mfu_range"] is None
    assert r["flops_per_step"]["model"] == r["flops_per_step"]["executed"] == float(BIG_FORWARD)
    assert r["step_time_s"] == pytest.approx((end - start) * 1e-6, rel=1e-6)
    assert r["mfu"] == pytest.approx(BIG_FORWARD / ((end - start) * 1e-6 * H200_FP32 * 1e12), rel=1e-6)
    assert any(n.startswith("33 GPU activities") and "no launch record ran before the first step's own" in n
               for n in r["notes"])
