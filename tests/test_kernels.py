"""diag.knowledge.kernels: kernel names from real traces and from each library's naming."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from diag.knowledge import kernels
from diag.knowledge.kernels import (
    DTYPE_PATTERNS,
    PATTERNS,
    DtypePattern,
    KernelClass,
    KernelPattern,
    classify,
    collective_of,
    gemm_dtype,
    match,
    nccl_algo_proto,
    unclassified_report,
    unknown,
)

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
TRACE_FILES = sorted(TRACES.rglob("*.json")) + sorted(TRACES.rglob("*.json.gz"))

# A name containing one of these must never fall to `other`. "fbgemm" is the FBGEMM library's
# name on its embedding kernels (fbgemm_gpu::permute_2D_data_kernel), not a GEMM.
MUST_BE_CLASSIFIED = re.compile(r"(?<!fb)gemm|nccl|flash|fmha|cutlass|xmma|nvjet", re.IGNORECASE)


def _kernel_names(path: Path) -> set[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            trace = json.load(f)
    except json.JSONDecodeError:
        pytest.skip(
            f"{path.name} is not JSON (an NCCL profiler example with hex literals), so has no Kineto kernels"
        )
    events = trace if isinstance(trace, list) else trace.get("traceEvents", [])
    return {
        e["name"]
        for e in events
        if isinstance(e, dict) and e.get("cat") in ("kernel", "Kernel") and "name" in e
    }


@pytest.mark.skipif(
    not TRACE_FILES, reason=f"real traces not found at {TRACES} (../shared/traces beside the repo)"
)
@pytest.mark.parametrize("path", TRACE_FILES, ids=lambda p: str(p.relative_to(TRACES)))
def test_real_trace_kernels(path: Path) -> None:
    names = _kernel_names(path)
    others = unclassified_report(sorted(names))
    classes = Counter(str(classify(n)) for n in names)
    unknowns = sorted(n for n in names if unknown(n))
    print(f"\n{path.relative_to(TRACES)}: {len(names)} distinct kernels {dict(sorted(classes.items()))}, "
          f"{len(others)} fall to 'other', {len(unknowns)} of them named by no row")
    for name in others:
        print(f"    {'unknown' if unknown(name) else 'other'}: {name[:160]}")
    assert [n for n in others if MUST_BE_CLASSIFIED.search(n)] == []
    for name in names:
        if name.startswith("nccl"):
            assert classify(name) is KernelClass.COMM, name
            assert collective_of(name) is not None, name


@pytest.mark.parametrize(
    ("name", "kernel_class"),
    [
        # cuBLAS
        ("ampere_sgemm_128x64_nn", "gemm"),
        ("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn", "gemm"),
        ("volta_h884gemm_64x64_ldg8_nn", "gemm"),
        ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", "gemm"),
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
            "gemm",
        ),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "gemm"),
        (
            "void gemmSN_TN_kernel<float, 128, 16, 2, 4, 2, 2, true>(cublasGemmSmallNParams<float const, float const, float>)",
            "gemm",
        ),
        (
            "void gemmk1_kernel<int, float, 256, 5, false, false, false, false, cublasGemvTensorStridedBatched<float const>, float, 0>(cublasGemmk1Params<float>)",
            "gemm",
        ),
        (
            "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, float> >(float, float)",
            "gemm",
        ),
        (
            "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasLt::cublasSplitKParams<float>)",
            "gemm",
        ),
        # CUTLASS
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)",
            "gemm",
        ),
        (
            "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)",
            "gemm",
        ),
        # cuDNN convolutions run as implicit GEMMs
        (
            "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_stage5_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer",
            "gemm",
        ),
        ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "gemm"),
        (
            "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",
            "gemm",
        ),
        # AMD and Triton
        ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x128x64_MI16x16x1_SN_LDSB1", "gemm"),
        ("triton_tem_fused_mm_0", "gemm"),
        ("triton_tem_fused_addmm_relu_3", "gemm"),
        ("triton_poi_fused_addmm_relu_0", "other"),  # the GEMM's epilogue, named after it
        # Attention
        (
            "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
            "attention",
        ),
        (
            "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t> >(pytorch_flash::Flash_bwd_params)",
            "attention",
        ),
        (
            "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<cute::tuple<cute::C<128> > > > >(flash::FlashAttnFwdSm90::Params)",
            "attention",
        ),
        (
            "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
            "attention",
        ),
        (
            "fmha_cutlassB_bf16_aligned_128x64_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::Sm80, cutlass::bfloat16_t, true, false, true, 128, 64, 128, false>::Params)",
            "attention",
        ),
        ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", "attention"),
        # Communication
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "comm"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "comm"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "comm"),
        (
            "void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 8, 4>(c10::BFloat16**, c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)",
            "comm",
        ),
        # Copies, memsets and the rest
        ("Memcpy HtoD (Pageable -> Device)", "copy"),
        ("Memset (Device)", "memset"),
        (
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}> >(int, at::native::gpu_kernel_impl<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}> const&)",
            "copy",
        ),
        (
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>(float*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<float, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)",
            "copy",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
            "memset",
        ),
        (
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)",
            "other",
        ),
        (
            "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float>(int, int volatile*, TensorListMetadata<4>, AdamFunctor<float>, float)",
            "other",
        ),
        ("triton_red_fused__to_copy_mean_pow_0", "other"),
        ("triton_poi_fused__scaled_dot_product_efficient_attention_0", "other"),
        ("triton_tem_fused_flex_attention_0", "attention"),
        ("triton__0d1d2d3d", "other"),
        (
            "void fbgemm_gpu::permute_2D_data_kernel<true, int, int, float>(int, int, int, int const*, float const*, int const*, int const*, int const*, int*, float*)",
            "other",
        ),
        # A parameter type does not make a kernel a GEMM: only the head (name and template) counts.
        (
            "void scal_kernel<float, float, 1, false, 6, 5, 5, 3>(cublasTransposeParams<float>, float const*, float*, float const*)",
            "other",
        ),
        (
            "void fft2d_r2c_32x32<float, false, 0u, false>(float2*, float const*, int, int, int, int, int, int, int, int, int, cudnn::reduced_divisor, bool, int2, int, int)",
            "gemm",
        ),
    ],
)
def test_classify(name: str, kernel_class: str) -> None:
    assert classify(name) == kernel_class
    assert str(classify(name)) == kernel_class


@pytest.mark.parametrize(
    ("name", "collective", "algo_proto"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "allreduce", ("RING", "LL")),
        (
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            "allreduce",
            ("RING", "LL"),
        ),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "sendrecv", ("RING", "SIMPLE")),
        (
            "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            "broadcast",
            ("RING", "LL"),
        ),
        ("ncclKernel_AllReduce", "allreduce", (None, None)),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "allreduce",
            ("RING", "LL"),
        ),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_TREE_LL(ncclDevKernelArgsStorage<4096ul>)",
            "allreduce",
            ("TREE", "LL"),
        ),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allgather", ("RING", "LL")),
        (
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "reducescatter",
            ("RING", "LL"),
        ),
        ("ncclDevKernel_Reduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce", ("RING", "LL")),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "sendrecv", (None, None)),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_NVLS_TREE_SIMPLE(ncclDevKernelArgsStorage<4096ul>)",
            "allreduce",
            ("NVLS_TREE", "SIMPLE"),
        ),
        (
            "ncclDevKernel_AllReduce_Sum_u32_COLLNET_DIRECT_LL128(ncclDevKernelArgsStorage<4096ul>)",
            "allreduce",
            ("COLLNET_DIRECT", "LL128"),
        ),
        (
            "ncclKernel_AllToAllPivot_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
            "alltoall",
            ("RING", "SIMPLE"),
        ),  # RCCL
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", None, (None, None)),
        (
            "void c10d::symmetric_memory::multimem_all_gather_kernel<16>(char*, char*, unsigned long)",
            "allgather",
            (None, None),
        ),
        (
            "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
            "allreduce",
            (None, None),
        ),
        ("ampere_sgemm_128x64_nn", None, (None, None)),
    ],
)
def test_collective_and_algorithm(
    name: str, collective: str | None, algo_proto: tuple[str | None, str | None]
) -> None:
    assert collective_of(name) == collective
    assert nccl_algo_proto(name) == algo_proto


def test_pattern_table_names_its_libraries() -> None:
    assert {p.kernel_class for p in PATTERNS} == set(KernelClass)
    assert all(p.source and p.example for p in PATTERNS)
    assert all(p.source and p.example for p in DTYPE_PATTERNS)


@pytest.mark.parametrize("row", PATTERNS, ids=lambda p: p.regex.pattern[:40])
def test_every_kernel_row_names_its_example(row: KernelPattern) -> None:
    """Each row's real example is matched by that row first (no row is shadowed by one above it)
    and gets the row's class, and its collective where the row fixes one."""
    assert match(row.example) is row, (row.example, match(row.example))
    assert classify(row.example) is row.kernel_class
    if row.collective is not None:
        assert collective_of(row.example) == row.collective


@pytest.mark.parametrize("row", DTYPE_PATTERNS, ids=lambda p: p.regex.pattern[:40])
def test_every_dtype_row_names_its_example(row: DtypePattern) -> None:
    assert classify(row.example) in (KernelClass.GEMM, KernelClass.ATTENTION)
    assert next(p for p in DTYPE_PATTERNS if p.regex.search(row.example)) is row
    assert gemm_dtype(row.example) == (row.dtype or None)   # "": the name gives no dtype


# Names misread before the table (issue 13), as real traces and profiler tables print them.
@pytest.mark.parametrize(
    ("name", "kernel_class", "dtype", "collective"),
    [
        ("Bmm_MxE4m3_MxE2m1MxE4m3_Fp32_bA32_bB32_bC32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_"
         "transOut_schedS_biasM_relu2_bN_tma_ldgstsSf_rgTma_clmp_dynB_sm100f", "gemm", "fp8", None),
        ("bmm_E2m1_E2m1E2m1_Fp32_Ab16_Bb16_Cb16_t128x32x512u2_s4_et128x32_m128x32x64_c1x1x1_rM_TN_transOut_schPd2x1x2x3_"
         "biasFp32M_bN_ldgsts_ldgstsSf_rgTma_clmp_swiGlu_dynB_sm100", "gemm", "fp4", None),
        ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c_outfmt_head::GemmKernel>"
         "(dpsk::grouped_gemm::cuda::fp8_ptp128c_outfmt_head::GemmKernel::Params)", "gemm", "fp8", None),
        ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>"
         "(dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel::Params)", "gemm", "fp8", None),
        ("void dpsk::gemm::fp8_gemm_kernel<4096u, 7168u, 128u, 128u, 128u, 5u, 128u, 128u, 1u, (dpsk::gemm::GemmType)0>"
         "(__nv_bfloat16*, float*, int*, unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, "
         "CUtensorMap_st)", "gemm", "fp8", None),
        ("sm90_xmma_gemm_e4m3f32_e4m3f32_f32_tn_n_tilesize128x128x128", "gemm", "fp8", None),
        ("sm90_xmma_gemm_bf16f32_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_"
         "cublas", "gemm", "bf16", None),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN", "gemm", "bf16", None),
        ("nvjet_qqtst_112x128_128x7_2x1_v_bz_coopA_algo2_TNN", "gemm", "fp8", None),
        ("nvjet_qqtst_128x256_128x6_2x2_2cta_h_bz_Avec32UE8M0_Bvec32UE8M0_TNT", "gemm", "fp8", None),
        ("nvjet_sm90_hss_64x8_64x16_1x1_h_bz_splitK_NNT", "gemm", "fp16", None),
        ("void dpsk::ep::internode::combine<false, 4, __nv_bfloat16>", "comm", None, "alltoall"),
        ("void dpsk::ep::internode::dispatch<false, 8, true, 8>", "comm", None, "alltoall"),
        ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(T1 *, float *)", "comm", None, "alltoall"),
        ("void deep_ep::internode_ll::dispatch<false, 3, 7168>", "comm", None, "alltoall"),
        ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16, 4>"
         "(c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
         "comm", None, "allreduce"),
        ("ncclSymkDevKernel_AllReduce_AGxLLMC_R_sum_bf16", "comm", None, "allreduce"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "comm", None, None),
        ("Cijk_Alik_Bljk_F8BS_BH_Bias_HA_S_SAB_SAV_UserArgs_MT256", "gemm", "fp8", None),
        ("Custom_Cijk_Alik_Bljk_F8B8BS_shortname1", "gemm", "fp8", None),
        ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x128x64_MI16x16x1_SN_LDSB1", "gemm", "bf16", None),
        ("void ck::kernel_gemm_xdl_cshuffle_v3_multi_d<ck::GridwiseGemmMultiD_ABScale_xdl_cshuffle_v3>", "gemm", None, None),
        ("ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync>", "attention", None, None),
        ("sm80_xmma_dgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_stage4_warpsize1x4x1_g8_"
         "tensor16x8x16_execute_kernel__5x_cudnn", "gemm", "fp16", None),
        ("sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_warpsize2x2x1_"
         "g1_tensor16x8x8_execute_kernel_cudnn", "gemm", "tf32", None),
        ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>", "gemm", None, None),
        ("void cudnn::detail::wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>", "gemm", None, None),
        ("volta_sgemm_128x64_nn", "gemm", "fp32", None),
        ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, "
         "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention", "fp16", None),
        ("fmha_cutlassB_bf16_aligned_128x64_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<"
         "cutlass::arch::Sm80, cutlass::bfloat16_t, true, false, true, 128, 64, 128, false>::Params)",
         "attention", "bf16", None),
        # Serving: FlashInfer, vLLM paged attention (its KV-cache enum names fp8 in every instance),
        # SGLang's Triton attention, the Triton MoE grouped GEMM, Marlin int4 (CUDA's `int4` vector type).
        ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u, 16u, 1u, 8u, "
         "(flashinfer::PageStorage)0, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>", "attention", "bf16", None),
        ("void vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, "
         "(vllm::Fp8KVCacheDataType)0, false, 512>", "attention", "bf16", None),
        ("void vllm::paged_attention_v1_kernel<unsigned char, unsigned char, 128, 16, 128, "
         "(vllm::Fp8KVCacheDataType)1, false>", "attention", None, None),
        ("_fwd_kernel_stage2", "attention", None, None),
        ("fused_moe_kernel_gptq_awq", "gemm", None, None),
        ("void marlin::Marlin<256, 1, 8, 8, 4, 8>(int4 const*, int4 const*, int4*, int4 const*, int, int, int, int)",
         "gemm", None, None),
        ("void vllm::paged_attention_v2_reduce_kernel<__nv_bfloat16, 128, 128, 512>", "other", None, None),
        # MIOpen convolutions (issue 36), as MIOpen logs and rocprof name them.
        ("miopenSp3AsmConv_v21_1_3_gfx9_fp32_f2x3_stride1", "gemm", "fp32", None),
        ("naive_conv_ab_nonpacked_fwd_nchw_int8_t_int32_t_int8_t", "gemm", None, None),
        ("naive_conv_ab_nonpacked_fwd_ncdhw_ushort_double_ushort", "gemm", None, None),
        ("igemm_fwd_gtcx3_nhwc_fp16_bx0_ex0_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_tb1x8x2x1_1x4x1x64_gkgs",
         "gemm", "fp16", None),
    ],
)
def test_issue_13_names(name: str, kernel_class: str, dtype: str | None, collective: str | None) -> None:
    assert str(classify(name)) == kernel_class
    assert gemm_dtype(name) == dtype
    assert collective_of(name) == collective


def test_dtype_only_for_matmul_kernels() -> None:
    # An fp8 cast is not an fp8 GEMM: the dtype rows apply to gemm/attention kernels only.
    assert gemm_dtype("void cuda::per_token_cast_to_fp8_with_channels<__nv_bfloat16, 128>(float*)") is None


def test_unclassified_report_lists_distinct_others() -> None:
    names = ["ampere_sgemm_128x64_nn", "triton__0d1d2d", "triton__0d1d2d", "Kernel"]
    assert unclassified_report(names) == ["Kernel", "triton__0d1d2d"]


@pytest.mark.parametrize(("name", "shown"), [
    ("ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
     "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align1>(cutlass_80_tensorop_s1688gemm_64x64_"
     "16x6_tn_align1::Params)", "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align1>"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >"
     "(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)", "at::native::vectorized_elementwise_kernel<4, …>"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<3>, std::plus<float>, float>(int)", "at::native::anonymous_namespace::multi_tensor_apply_kernel<…>"),
])
def test_short_names_are_cut_at_a_template_boundary(name: str, shown: str) -> None:
    """Issue 39: the HTML page had cut names mid-identifier; a name is cut where C++ has a boundary."""
    assert kernels.short(name) == shown
    assert len(shown) <= 72
