"""What a run is and what it already uses, read from its kernel and op names: the workload family
(transformer, convnet, recommender, moe) with the evidence for it, and the features advice must not
recommend because the run has them (DeepEP, NVSHMEM, torch.compile, FSDP, Transformer Engine), and
the serving engine whose own switch turns CUDA graphs on (vLLM, SGLang).

Each rank's digest keeps kernel time by signal (`signals`) and the features it saw (`features`);
RunContext adds them up over ranks (`family`, `uses`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec
import numpy as np

from diag.timeline.rank import RankTimeline

BATCHED = frozenset({"aten::bmm", "aten::baddbmm"})

# Kernel-name signals of a family, each a share of the rank's SM kernel time.
CONV = re.compile(r"conv|winograd|scudnn|[dw]grad", re.IGNORECASE)  # cuDNN's kernels and the aten ops over them
_SIGNALS = {
    # fbgemm's table-batched embeddings (TorchRec), nn.EmbeddingBag.
    "embedding": re.compile(r"split_embedding|embedding_bag|EmbeddingBag|batched_embedding", re.IGNORECASE),
    # MoE routing and expert GEMMs: vLLM/SGLang fused_moe, grouped GEMMs, DeepEP dispatch/combine.
    "moe": re.compile(r"fused_moe|moe_|_moe|expert|grouped_gemm|dpsk::ep", re.IGNORECASE),
}
# Features the run already uses, by kernel name or by a host span's name.
_FEATURE_KERNELS = {
    "deepep": re.compile(r"dpsk::ep|deep_ep", re.IGNORECASE),
    "nvshmem": re.compile(r"nvshmem", re.IGNORECASE),
    "torch_compile": re.compile(r"^triton_"),
    "transformer_engine": re.compile(r"transformer_engine", re.IGNORECASE),
    # vLLM's own CUDA kernels live in its C++ namespace (csrc/: `vllm::rms_norm_kernel<…>`).
    "vllm": re.compile(r"(^|\W)vllm::"),
    # A fused optimizer step: torch's AdamW(fused=True) runs multi_tensor_apply_kernel
    # <FusedOptimizerTensorListMetadata, FusedAdamMathFunctor> (a real H200 capture); Apex and
    # Transformer Engine run multi_tensor_adam kernels.
    "fused_optimizer": re.compile(r"FusedOptimizer|FusedAdam|FusedSGD|multi_tensor_adam", re.IGNORECASE),
}
_FEATURE_SPANS = {
    "torch_compile": re.compile(r"^(CompiledFunction|Torch-Compiled Region)"),
    "fsdp": re.compile(r"FSDP|FullyShardedDataParallel"),
    # TorchRec's table-batched embedding lookups (fbgemm_gpu), whose kernels may be a small share.
    "embedding_tables": re.compile(r"^fbgemm::split_embedding|torchrec|EmbeddingBagCollection"),
    "transformer_engine": re.compile(r"transformer_engine|TransformerEngine"),
    # The serving engines, by their ops (`vllm::unified_attention`, `sgl_kernel::rmsnorm`) or, with
    # with_stack, their Python frames (`vllm/worker/…`, `sglang/srt/…`).
    "vllm": re.compile(r"^vllm::|(^|/)vllm/"),
    "sglang": re.compile(r"^sgl_kernel::|(^|/)sglang/"),
    # A foreach optimizer (torch's default on CUDA, or foreach=True): its multi-tensor update ops
    # (clip_grad_norm_'s _foreach_norm is no optimizer's).
    "foreach_optimizer": re.compile(r"^aten::_foreach_(?!norm)"),
}
# Every feature `RunContext.uses` answers for.
FEATURES = ("cuda_graphs", *sorted({*_FEATURE_KERNELS, *_FEATURE_SPANS}))
# Shares past which a signal names the family: a tenth of kernel time in MoE kernels; 2% in
# embedding-table kernels (a transformer looks tokens up with aten::embedding, never these: HTA's
# recommender captures spend 4-19% of kernel time in them); convolutions half the GEMM-class time.
FAMILY_SHARE, EMBEDDING_SHARE, CONV_SHARE = 0.10, 0.02, 0.5


class Mix(msgspec.Struct):
    signals: dict[str, int]        # kernel, gemm, conv, attention, embedding, moe → kernel ns
    features: list[str]


# Attention by hand runs bmm (QKᵀ), softmax, bmm (PV) on one stream, with a scale, a mask or a
# dropout between: a softmax within this many activities of a bmm on each side marks both bmms. A
# CPU capture's host timeline counts every aten op: 8 stand between QKᵀ's bmm and the softmax there
# (resolve_conj, div, to, _to_copy, empty_strided, copy_: tests/test_cpu_causes.py).
SOFTMAX_WINDOW = 12


def attention_bmms(op_name: Sequence[str | None], stream: Sequence[object], kernel: Sequence[bool]) -> set[int]:
    """The activities (indices) of batched matmuls with a softmax between them and another batched
    matmul on the same stream, SOFTMAX_WINDOW kernels apart at most (the backward's softmax
    gradient counts: _softmax_backward_data)."""
    by_stream: dict[object, list[int]] = {}
    for i, k in enumerate(kernel):
        if k:
            by_stream.setdefault(stream[i], []).append(i)
    out: set[int] = set()
    for seq in by_stream.values():
        for j, i in enumerate(seq):
            if "softmax" not in (op_name[i] or ""):
                continue
            before = [x for x in seq[max(0, j - SOFTMAX_WINDOW): j] if op_name[x] in BATCHED]
            after = [x for x in seq[j + 1: j + 1 + SOFTMAX_WINDOW] if op_name[x] in BATCHED]
            if before and after:
                out |= {before[-1], after[0]}
    return out


def mix_of(tl: RankTimeline, attention_bmms: set[int]) -> Mix:
    """One rank's signals and features (a host timeline has none: its ops are not kernels)."""
    dur = (tl.end_ns - tl.ts_ns).astype(np.int64)
    names, ops = tl.name, tl.op_name
    sig = dict.fromkeys(("kernel", "gemm", "conv", "attention", *_SIGNALS), 0)
    features: set[str] = set()
    if tl.host_timeline:
        return Mix(sig, [])
    # The patterns per distinct (kernel, op) name pair, not per kernel: a step repeats a few hundred
    # names tens of thousands of times (the control trace: 53k searches, 0.23 s, before).
    matched: dict[tuple[str, str], tuple[bool, tuple[str, ...]]] = {}
    for i in np.flatnonzero(tl.kernel).tolist():
        d, nm, op = int(dur[i]), names[i] or "", ops[i] or ""
        hit = matched.get((nm, op))
        if hit is None:
            hit = matched[(nm, op)] = (bool(CONV.search(nm) or CONV.search(op)),
                                       tuple(key for key, pat in _SIGNALS.items() if pat.search(nm) or pat.search(op)))
        conv, keys = hit
        sig["kernel"] += d
        k = tl.kclass[i]
        if k in ("gemm", "attention"):
            sig["gemm"] += d
            if conv:
                sig["conv"] += d
        if k == "attention" or i in attention_bmms:
            sig["attention"] += d
        for key in keys:
            sig[key] += d
    for nm in set(names):
        features |= {f for f, pat in _FEATURE_KERNELS.items() if nm and pat.search(nm)}
    if tl.host_spans is not None:
        for nm in set(tl.host_spans.name):
            features |= {f for f, pat in _FEATURE_SPANS.items() if pat.search(nm)}
    return Mix(sig, sorted(features))


class Family(msgspec.Struct, frozen=True):
    family: str                    # transformer | convnet | recommender | moe | other
    evidence: list[str]


def family_of(signals: dict[str, int], features: set[str]) -> Family:
    """The family the kernel mix says, first that holds: MoE kernels (or DeepEP), embedding
    lookups, convolutions, attention; else other."""
    kernel, gemm = signals.get("kernel", 0), signals.get("gemm", 0)
    if not kernel:
        return Family("other", ["no GPU kernels"])

    def share(key: str, of: int) -> float:
        return signals.get(key, 0) / of if of else 0.0

    if share("moe", kernel) >= FAMILY_SHARE or "deepep" in features:
        return Family("moe", [f"MoE kernels (fused_moe, grouped GEMM, expert, DeepEP) {share('moe', kernel):.0%} "
                              "of kernel time"] + (["DeepEP kernels (dpsk::ep)"] if "deepep" in features else []))
    if share("embedding", kernel) >= EMBEDDING_SHARE or "embedding_tables" in features:
        return Family("recommender", [f"embedding-table kernels (split_embedding, embedding_bag) "
                                      f"{share('embedding', kernel):.0%} of kernel time"]
                      + (["fbgemm/TorchRec embedding-table ops on the host"] if "embedding_tables" in features else []))
    if share("conv", gemm) >= CONV_SHARE:
        return Family("convnet", [f"convolution kernels {share('conv', gemm):.0%} of GEMM/attention time"])
    if signals.get("attention", 0):
        return Family("transformer", [f"attention kernels (fused, or bmm-softmax-bmm) {share('attention', kernel):.0%} "
                                      "of kernel time"])
    return Family("other", ["no attention, convolution, embedding or MoE kernels"])
