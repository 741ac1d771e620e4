"""Real H200 captures (tests/data/gpu_captures/h200, PROVENANCE.md there), each number diag gives
checked against a count made here from the program's layer shapes or from the raw trace JSON.

The per-step figures come from the store diag writes (`gpu_states`: the step's window and its model,
recomputed FLOPs); the MFU is Σ model FLOPs ÷ (Σ windows × dense peak), docs/ledger.md.
"""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

H200 = Path(__file__).resolve().parent / "data" / "gpu_captures" / "h200"
BF16_PEAK = 989.4e12    # H100/H200 SXM dense bf16 (NVIDIA H100 datasheet; parts.toml)
FP8_PEAK = 1978.9e12
META = json.loads((H200 / "meta.json").read_text())


class Run:
    def __init__(self, report: dict[str, Any], db: Path) -> None:
        self.report = report
        with duckdb.connect(str(db), read_only=True) as con:
            self.steps = con.execute(
                "SELECT step, window_ns, model_flops, recompute_flops FROM gpu_states ORDER BY step"
            ).fetchall()

    @property
    def model_flops(self) -> list[float]:
        return [row[2] for row in self.steps]

    def mfu_by_hand(self, flops_per_step: float, peak: float) -> float:
        """FLOPs per step ÷ (mean window × peak): Σ FLOPs ÷ (Σ windows × peak) with equal steps."""
        return flops_per_step / (statistics.fmean(window for _, window, _, _ in self.steps) * 1e-9 * peak)


def analyze(case: str, tmp_path: Path) -> Run:
    db = tmp_path / f"{case}.duckdb"
    out = subprocess.run([sys.executable, "-m", "diag.cli", "analyze", str(H200 / case), "--format", "json",
                          "--db", str(db)], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    return Run(json.loads(out.stdout), db)


def gpt_forward_flops(shape: dict[str, int], causal: bool = True) -> float:
    """The GPT of scripts/capture_gpu_traces.py, one forward pass: per layer qkv (3d²), proj (d²),
    fc1 and fc2 (4d² each) per token, the head d·V, 2 FLOPs a multiply-add; attention QKᵀ and PV,
    4·B·S²·d per layer, half of it under the causal mask."""
    d, L, V, B, S = shape["d"], shape["layers"], shape["vocab"], shape["batch"], shape["seq"]
    tokens = B * S
    attention = L * 4 * B * S * S * d / (2 if causal else 1)
    return 2 * tokens * (12 * L * d * d + d * V) + attention


def test_gpt_training_mfu_counts_every_matmul_and_causal_attention(tmp_path: Path) -> None:
    """bf16 autocast with cuDNN SDPA: the attention kernels run under aten::_cudnn_attention_* (torch
    2.11), and their names say f16 for bf16 work. Model FLOPs are 3 × the forward."""
    run = analyze("gpt_bf16", tmp_path)
    flops = 3 * gpt_forward_flops(META["captures"]["gpt_bf16"]["shape"])
    assert run.model_flops == pytest.approx([flops] * 4, rel=1e-12)
    r = run.report
    assert r["flops_coverage"] == 1.0 and r["mfu_range"] is None
    assert r["device"]["dtype_mix"] == {"bf16": 1.0}
    assert r["mfu"] == pytest.approx(run.mfu_by_hand(flops, BF16_PEAK), rel=1e-3)
    assert 0.15 < r["mfu"] < 0.19
    # The step already runs AdamW(fused=True) (FusedAdamMathFunctor kernels): no advice repeats it.
    assert "fused_optimizer" in r["workload_family"]["uses"]
    assert not any("AdamW" in f["advice"] for f in r["findings"])


def test_a_foreach_optimizer_is_told_to_fuse(tmp_path: Path) -> None:
    r = analyze("example_none", tmp_path).report
    assert "fused_optimizer" not in r["workload_family"]["uses"]
    assert any("AdamW(fused=True)" in f["advice"] for f in r["findings"] if f["code"] == "MFU012")


def test_conv_bf16_mfu_from_the_layer_shapes(tmp_path: Path) -> None:
    run = analyze("conv_bf16", tmp_path)
    meta = META["captures"]["conv_bf16"]
    flops = 3 * meta["matmul_fwd_flops_per_step"]
    assert run.model_flops == pytest.approx([flops] * 2, rel=1e-12)
    assert run.report["mfu"] == pytest.approx(run.mfu_by_hand(flops, BF16_PEAK), rel=1e-3)
    slow = next(f for f in run.report["findings"] if f["code"] == "MFU009")
    causes = {c for s in slow["details"]["shapes"] for c in s["causes"]}
    # autocast's bf16 casts before each conv are no transposes; cuDNN's wgrad split-K is the right
    # kernel for a reduction over 64×56×56 positions, not a small shape.
    assert not any("transpose" in c or "split-K" in c for c in causes), causes


def test_conv_without_concrete_inputs_takes_each_output_from_its_backward(tmp_path: Path) -> None:
    """fp32 (cuDNN runs it on TF32), Concrete Inputs off: no stride or padding in the trace, so each
    conv's output size is the grad_output of its aten::convolution_backward."""
    run = analyze("conv_fp32", tmp_path)
    flops = 3 * META["captures"]["conv_fp32"]["matmul_fwd_flops_per_step"]
    assert run.model_flops == pytest.approx([flops] * 2, rel=1e-12)
    assert run.report["flops_coverage"] == 1.0


def test_single_inference_step_after_an_unsynchronised_warm_up(tmp_path: Path) -> None:
    """The profiler's warm-up step left 4 forwards queued: their kernels run into the active window
    with no launch record (no cuda_runtime or cuda_driver event of their correlation). The step
    begins where the last of them ends."""
    trace = json.loads(gzip.decompress(next((H200 / "infer_after_warmup").glob("*.json.gz")).read_bytes()))
    events = trace["traceEvents"]
    launched = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    carried = [e for e in gpu if e["args"]["correlation"] not in launched]
    own = [e for e in gpu if e["args"]["correlation"] in launched]
    window_us = max(e["ts"] + e["dur"] for e in own) - max(e["ts"] + e["dur"] for e in carried)

    run = analyze("infer_after_warmup", tmp_path)
    r = run.report
    assert r["workload"] == "inference" and r["steps"] == 1
    assert r["step_time_s"] == pytest.approx(window_us * 1e-6, abs=2e-9)
    assert any(f"{len(carried)} GPU activities" in n for n in r["notes"]), r["notes"]
    flops = gpt_forward_flops(META["captures"]["infer_after_warmup"]["shape"])
    assert run.model_flops == pytest.approx([flops], rel=1e-12)
    assert r["mfu"] == pytest.approx(flops / (window_us * 1e-6 * BF16_PEAK), rel=1e-3)


def test_fp8_and_bf16_gemms_judged_each_at_its_own_peak(tmp_path: Path) -> None:
    run = analyze("fp8_mix", tmp_path)
    r = run.report
    per_dtype = 4 * 2 * 8192**3
    assert run.model_flops == pytest.approx([2 * per_dtype] * 2, rel=1e-12)
    assert r["device"]["dtype_mix"] == {"fp8": 0.5, "bf16": 0.5}
    # Σ FLOPs ÷ Σ(FLOPs_d ÷ peak_d) (DESIGN.md)
    assert r["device"]["peak_tflops"] * 1e12 == pytest.approx(1 / (0.5 / FP8_PEAK + 0.5 / BF16_PEAK), rel=1e-3)
    slow = next(f for f in r["findings"] if f["code"] == "MFU009")
    ceiling = {"fp8": FP8_PEAK / 1e12, "bf16": BF16_PEAK / 1e12}
    for shape in slow["details"]["shapes"]:
        assert shape["reachable_tflops"] <= ceiling[shape["dtype"]], shape


def test_full_recomputation_of_every_block_is_called_full(tmp_path: Path) -> None:
    """`--recompute full` checkpoints each block (torch.utils.checkpoint, non-reentrant). In the
    backward each block's forward runs again up to the last tensor the backward needs: qkv, proj,
    fc1 and attention, not fc2 (its output feeds only the residual add) — 8d² of the 12d² linear
    FLOPs per token, and the head is never checkpointed. That is 60% of the forward FLOPs, yet whole
    layers: the finding says full, from the linear layers among the recomputed FLOPs."""
    run = analyze("example_full", tmp_path)
    d, L, B, S, V = 1024, 4, 8, 1024, 8192
    tokens = B * S
    attention = L * 2 * B * S * S * d              # causal: half of 4·B·S²·d per layer
    recomputed_linear = 2 * tokens * L * 8 * d * d
    assert [row[3] for row in run.steps] == pytest.approx([recomputed_linear + attention] * 4, rel=1e-12)
    forward = 2 * tokens * (12 * L * d * d + d * V) + attention
    finding = next(f for f in run.report["findings"] if f["code"] == "MFU004")
    assert finding["details"]["kind"] == "full"
    assert finding["details"]["recompute_over_forward_flops"] == pytest.approx(
        (recomputed_linear + attention) / forward, rel=1e-9)
    assert finding["details"]["recompute_linear_share"] == pytest.approx(
        recomputed_linear / (recomputed_linear + attention), rel=1e-9)


def test_one_rank_is_not_told_to_lower_tensor_parallelism(tmp_path: Path) -> None:
    """A one-rank NCCL group: NCCL runs no kernel for a group of one, the 2048³ fp32 GEMM is thin on
    132 SMs (128 output tiles), and with one rank there is no TP degree to lower."""
    r = analyze("nccl_one_rank", tmp_path).report
    assert r["world_size"] == 1
    thin = next(f for f in r["findings"] if f["code"] == "MFU003")
    assert thin["details"]["shapes"][0]["output_tiles"] == 128
    assert "tensor-model-parallel" not in thin["advice"]


def test_compiled_gpt_mfu_and_its_fused_optimizer(tmp_path: Path) -> None:
    """torch.compile (Inductor) keeps the matmuls as aten ops with shapes: the same FLOPs as eager.
    Its optimizer is AdamW(fused=True): the host-bound advice says it is fused already."""
    run = analyze("gpt_compiled", tmp_path)
    flops = 3 * gpt_forward_flops(META["captures"]["gpt_compiled"]["shape"])
    assert run.model_flops == pytest.approx([flops] * 4, rel=1e-12)
    r = run.report
    assert r["mfu"] == pytest.approx(run.mfu_by_hand(flops, BF16_PEAK), rel=1e-3)
    assert {"torch_compile", "fused_optimizer"} <= set(r["workload_family"]["uses"])
    host = next(f for f in r["findings"] if f["code"] == "MFU010")
    assert "fused=True or foreach=True" not in host["advice"]


def test_cuda_graphs_leave_mfu_unknown_and_say_why(tmp_path: Path) -> None:
    """reduce-overhead replays the step as CUDA graphs: one launch, no op with shapes per kernel, so
    the trace holds no FLOPs. MFU is unknown, the reason names the graph replay, the hint names the
    missing input, and no rule calls the matmul time a loss."""
    r = analyze("gpt_cudagraphs", tmp_path).report
    assert r["mfu"] is None and r["mfu_range"] is None and r["flops_coverage"] == 0.0
    assert r["device"]["graph_kernel_fraction"] > 0.5   # the eager optimizer step and loss are the rest
    note = next(n for n in r["notes"] if "FLOPs from op shapes" in n)
    assert "the rest: a CUDA graph replay (one launch, no op shapes per kernel) 100%" in note and "--model" in note
    slow = next(f for f in r["findings"] if f["code"] == "MFU009")
    assert slow["recoverable_fraction"] == 0.0 and "--model" in slow["advice"]


def test_hf_generate_is_serving_shaped(tmp_path: Path) -> None:
    """transformers' generate() profiled whole, as a user profiling inference writes it: one window
    (no ProfilerStep), inference, and the decode GEMMs thin by the batch (M = 8 sequences), whose
    advice is more sequences per forward, not a smaller TP degree (one rank)."""
    r = analyze("hf_generate", tmp_path).report
    assert r["workload"] == "inference" and r["steps"] == 1
    assert any("no ProfilerStep spans" in n for n in r["notes"])
    thin = next(f for f in r["findings"] if f["code"] == "MFU003")
    assert thin["details"]["shapes"][0]["m"] == META["captures"]["hf_generate"]["batch"]
    assert "continuous batching" in thin["advice"] and "tensor-model-parallel" not in thin["advice"]
