"""The figures the rules of issue 14 print, derived by hand on small examples: output tiles and
waves, arithmetic intensity against the ridge point, what a shape can reach, the recoverable
share of thin GEMMs, fused-chain savings, and the GEMM ceiling table row by row."""

from __future__ import annotations

import numpy as np
import pytest

from diag.attribution import gemm_shape, workload_mix
from diag.knowledge import hardware
from diag.timeline.nesting import overlapped, points_within
from rules.MFU009_slow_gemms import causes_of, fallback_advice, layout_copy, precision_advice
from rules.MFU011_copies import advice_for
from rules.MFU012_unfused_elementwise import chain_gain

H100 = hardware.PARTS["h100-sxm"]
A100 = hardware.PARTS["a100-80gb"]


def test_256_tokens_by_4096_is_32_tiles_for_132_sms() -> None:
    # The example: ceil(256/128) · ceil(4096/256) = 2 · 16 = 32 output tiles of 128×256.
    assert gemm_shape.output_tiles(256, 4096, (128, 256)) == 32
    flops = 2 * 256 * 4096 * 4096
    nbytes = 2 * (256 * 4096 + 4096 * 4096 + 256 * 4096)
    f = gemm_shape.fit((256, 4096, 4096), flops, nbytes, "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", H100, "bf16")
    assert (f.tiles, f.sms) == (32, 132) and f.under_one_wave
    # 2·256·4096² / (2·(256·4096 + 4096² + 256·4096)) = 4.295e9 / 1.887e7 = 227.6 FLOP/byte,
    # under 989e12 / 3350e9 = 295.2.
    assert f.intensity == pytest.approx(227.56, abs=0.01)
    assert f.ridge == pytest.approx(295.22, abs=0.01) and f.memory_bound and f.thin


def test_a_well_shaped_gemm_fills_the_part() -> None:
    # 8192 × 3072 output in 128×256 tiles: 64 · 12 = 768 tiles, 5.8 waves on 132 SMs;
    # 8192·1024·3072 / (8192·1024 + 1024·3072 + 8192·3072) = 2.577e10 / 3.670e7 = 702.2 FLOP/byte.
    flops = 2 * 8192 * 1024 * 3072
    nbytes = 2 * (8192 * 1024 + 1024 * 3072 + 8192 * 3072)
    f = gemm_shape.fit((8192, 3072, 1024), flops, nbytes, "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", H100, "bf16")
    assert f.tiles == 768 and f.intensity == pytest.approx(702.2, abs=0.1) and not f.thin
    # On an A100 (108 SMs, 312 / 2039 GB/s = 153 FLOP/byte): 128×128 tiles from the part.
    g = gemm_shape.fit((8192, 3072, 1024), flops, nbytes, "some_gemm_kernel", A100, "bf16")
    assert g.tiles == 64 * 24 and g.sms == 108 and not g.thin


def test_a_bmm_counts_its_batch_in_tiles() -> None:
    # 32 heads of QKᵀ, 2048 × 2048 × 64: flops carry the batch, 32 · 16 · 8 tiles of 128×256.
    flops = 2 * 32 * 2048 * 2048 * 64
    assert gemm_shape.fit((2048, 2048, 64), flops, None, "x", H100, "bf16").tiles == 32 * 16 * 8


@pytest.mark.parametrize(("name", "tile"), [
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", (128, 256)),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     (128, 128)),
    ("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_nn", (128, 256)),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", (64, 8)),
    ("void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8>", (256, 128)),
])
def test_the_tile_comes_from_the_kernel_name(name: str, tile: tuple[int, int]) -> None:
    assert gemm_shape.tile_of(name, None) == tile


def test_without_a_tile_in_the_name_the_part_gives_it() -> None:
    assert gemm_shape.tile_of("gemm_kernel", "h100-sxm") == (128, 256)
    assert gemm_shape.tile_of("gemm_kernel", "a100-40gb") == (128, 128)
    assert gemm_shape.tile_of("gemm_kernel", "v100") is None and gemm_shape.tile_of("gemm_kernel", None) is None


def test_reachable_is_the_roofline_capped_at_the_ceiling() -> None:
    peak, hbm = 989e12, 3350e9
    # Over the ridge: the ceiling, 0.75 × 989 = 741.75 TFLOP/s.
    assert gemm_shape.reachable_flops_per_s(peak, 0.75, 702.2, hbm) == pytest.approx(741.75e12)
    # Under it: 100 FLOP/byte × 3,350 GB/s = 335 TFLOP/s.
    assert gemm_shape.reachable_flops_per_s(peak, 0.75, 100.0, hbm) == pytest.approx(335e12)
    assert gemm_shape.reachable_flops_per_s(peak, 0.75, None, hbm) == pytest.approx(741.75e12)


@pytest.mark.parametrize("row", list(gemm_shape.CEILINGS.values()), ids=lambda r: r.part)
def test_ceiling_table_row_by_row(row: gemm_shape.Ceiling) -> None:
    assert row.part in hardware.PARTS, f"{row.part}: not a part key in diag/knowledge/hardware.py"
    assert 0.3 <= row.ceiling <= 1.0 and row.source and row.example
    # The example kernel's name carries the row's tile.
    assert gemm_shape.tile_of(row.example, None) == (row.tile_m, row.tile_n)


def test_attention_shaped_matmuls() -> None:
    assert gemm_shape.attention_shaped("aten::bmm", (2048, 2048, 64), True)      # QKᵀ: K = head_dim
    assert gemm_shape.attention_shaped("aten::bmm", (2048, 64, 2048), True)      # PV: N = head_dim
    assert not gemm_shape.attention_shaped("aten::mm", (2048, 2048, 64), True)   # a projection
    assert not gemm_shape.attention_shaped("aten::bmm", (2048, 4096, 4096), True)
    # A recommender's feature interaction: a head-sized bmm with no softmax beside it (issue 35).
    assert not gemm_shape.attention_shaped("aten::bmm", (27, 27, 16), False)


def test_attention_bmms_need_a_softmax_between_two() -> None:
    ops = ["aten::bmm", "aten::div", "aten::_softmax", "aten::bmm", "aten::addmm", "aten::bmm"]
    assert workload_mix.attention_bmms(ops, [7] * 6, [True] * 6) == {0, 3}
    # On another stream, or with no bmm after it, the softmax marks nothing.
    assert workload_mix.attention_bmms(ops, [7, 7, 7, 8, 7, 8], [True] * 6) == set()
    assert workload_mix.attention_bmms(["aten::bmm", "aten::bmm", "aten::mul"], [7] * 3, [True] * 3) == set()


def test_slow_gemm_causes() -> None:
    assert causes_of((4095, 4096, 4096), "bf16", "k", "aten::mm", False) == {
        "pad M=4095 (4095×4096×4096) to a multiple of 8 (tensor cores need it)"}
    # On a tensor-core kernel M is not judged: 788×3072×768 (issue 35) ran on tensor cores.
    assert not causes_of((788, 3072, 768), "bf16", "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "aten::mm", False)
    assert causes_of((1024, 647, 30), "bf16", "sm80_xmma_gemm_bf16", "aten::mm", False) == {
        "pad N=647, K=30 (1024×647×30) to a multiple of 8 (tensor cores need it)"}
    # A partial tile: 96 pads to 128 (25% of the work wasted); 4104 to 4160 (1.3%) is not worth it.
    assert any("N=96 (1024×96×512) to a multiple of 64" in c for c in causes_of((1024, 96, 512), "bf16", "k", "aten::mm", False))
    assert not causes_of((4104, 4096, 4096), "bf16", "k", "aten::mm", False)
    assert "fp32" in causes_of((4096, 4096, 4096), "fp32", "ampere_sgemm_128x64_tn", "aten::mm", False)
    # A TF32 tensor-core kernel is the fix already in place.
    assert not causes_of((4096, 4096, 4096), "fp32", "ampere_tf32_s1688gemm_tf32_128x128", "aten::mm", False)
    assert any("transpose" in c for c in causes_of((4096, 4096, 4096), "bf16", "k", "aten::mm", True))
    assert any("split-K" in c for c in causes_of((256, 256, 8192), "bf16", "gemm_splitKreduce_kernel", "aten::mm", False))
    # A convolution's weight gradient reduces over every position: split-K is its right kernel (H200).
    assert not causes_of(None, "bf16", "sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_"
                         "tilesize128x64x64_warpgroupsize1x1x1_g1_execute_split_k_kernel__5x_cudnn",
                         "aten::convolution_backward", False)
    # autocast's cast of a weight to bf16 before the GEMM is no transpose; a same-dtype copy may be.
    assert not layout_copy("aten::copy_", "void at::native::vectorized_elementwise_kernel<8, "
                           "at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}")
    assert layout_copy("aten::copy_", "void at::native::unrolled_elementwise_kernel<at::native::"
                       "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}")
    assert any("scaled_dot_product" in c for c in causes_of((2048, 2048, 64), "bf16", "k", "aten::bmm", False, True))
    assert not causes_of((2048, 2048, 64), "bf16", "k", "aten::bmm", False, False)


def test_fused_chain_savings() -> None:
    # Six kernels of 30 MB each, 10 µs each: one fused pass moves 30 MB, so 5/6 of 60 µs is saved.
    moved, fused, gain = chain_gain([10e-6] * 6, [30e6] * 6)
    assert (moved, fused) == (180e6, 30e6) and gain == pytest.approx(50e-6)
    # A kernel without bytes: the fused pass lasts as long as the longest kernel (8 µs of 3+5+8).
    assert chain_gain([3e-6, 5e-6, 8e-6], [1e6, None, 2e6]) == (0.0, 0.0, pytest.approx(8e-6))


def test_copy_advice_by_kind() -> None:
    assert "pin_memory=True" in (advice_for("Memcpy HtoD (Pageable -> Device)") or "")
    assert ".item()" in (advice_for("Memcpy DtoH (Device -> Pageable)") or "")
    assert advice_for("Memcpy PtoP (Device -> Device)") is None


def test_fp32_on_a_tf32_kernel_is_judged_against_the_tf32_ridge() -> None:
    a100 = hardware.PARTS["a100-40gb"]
    flops, nbytes = 2 * 4096.0**3, 4 * 3 * 4096.0**2
    # A100 40GB: tf32 156e12 / 1555e9 = 100.3 FLOP/byte; plain fp32 19.5e12 / 1555e9 = 12.5.
    tf32 = gemm_shape.fit((4096, 4096, 4096), flops, nbytes, "volta_tensorop_s1688gemm_128x128_tn", a100, "fp32")
    plain = gemm_shape.fit((4096, 4096, 4096), flops, nbytes, "ampere_sgemm_128x64_tn", a100, "fp32")
    assert tf32.ridge == pytest.approx(100.3, abs=0.1) and plain.ridge == pytest.approx(12.54, abs=0.01)


def test_a_gap_is_overlapped_when_any_mark_crosses_it() -> None:
    """The idle rules' gap-by-mark tests (MFU010, MFU013) against their pairwise definitions: a
    span overlaps (s < b and e > a), an instant falls within (a <= t <= b); marks nest, overlap,
    touch the gap's ends and come in any order."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        s = rng.integers(0, 100, rng.integers(0, 8))
        e = s + rng.integers(0, 30, len(s))
        a = rng.integers(0, 120, 20)
        b = a + rng.integers(1, 20, 20)
        want = [bool(((s < bj) & (e > aj)).any()) for aj, bj in zip(a, b, strict=True)]
        assert overlapped(s, e, a, b).tolist() == want
        within = [bool(((e >= aj) & (e <= bj)).any()) for aj, bj in zip(a, b, strict=True)]
        assert points_within(e, a, b).tolist() == within


def test_precision_advice_reads_the_parts_peaks() -> None:
    """fp32 on a tensor-core part: mixed precision first, at the ratio of parts.toml's peaks
    (V100: fp16 125 vs fp32 15.7 TFLOP/s, 8×; no TF32 or bf16 on Volta); convolutions add
    channels_last, and Transformer Engine is never offered for them or before Hopper (issue 35)."""
    v100, h100 = hardware.PARTS["v100"], hardware.PARTS["h100-sxm"]
    text = precision_advice(v100, "fp32", convs=True)
    assert text is not None and "8× its fp32 peak (125 vs 15.7 TFLOP/s dense)" in text
    assert "torch.float16" in text and "GradScaler" in text and "channels_last" in text
    assert "tf32" not in text.lower()
    text = precision_advice(h100, "fp32", convs=False)
    assert text is not None and "15× its fp32 peak (989 vs 67" in text and "allow_tf32" in text
    assert precision_advice(h100, "bf16", convs=False) is None
    assert precision_advice(None, "fp32", convs=False) is None
    assert "Transformer Engine" not in fallback_advice(v100, convs=True, smi="nvidia-smi -q -d PERFORMANCE")
    assert "Transformer Engine" not in fallback_advice(hardware.PARTS["a100-80gb"], convs=False, smi="x")
    assert "Transformer Engine" in fallback_advice(h100, convs=False, smi="x")
    assert "Transformer Engine" not in fallback_advice(h100, convs=True, smi="x")
