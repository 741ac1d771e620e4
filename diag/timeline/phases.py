"""Which phase of the training step each CPU op belongs to, from the nesting of spans per thread.

Phases: `forward`, `backward`, `recompute`, `optimizer`, `dataloader`, `other`.

- backward: inside an `autograd::engine::evaluate_function: ...` span (the autograd engine runs
  every node under one; on the CPU it uses the calling thread, on CUDA its own thread), or a
  top-level op that carries a nonzero `Fwd thread id` (forward ops with grad enabled carry 0, so
  a forward outside any ProfilerStep span stays forward-side: `other`, not backward).
- recompute: a *forward* op executed again inside the backward pass by activation
  checkpointing. Inside a backward span, an op is recompute when it is a forward-only op (one no
  derivative formula calls: linear, addmm, the attention forwards, conv, norms, embedding) or
  sits under a checkpoint node (`CheckpointFunctionBackward`, reentrant torch.utils.checkpoint).
  Other custom Functions' nodes (`CompiledFunctionBackward` of torch.compile, Megatron's) are
  ordinary backward. Everything under a recompute op is recompute.
- optimizer: under `Optimizer.step#...` / `Optimizer.zero_grad#...`.
- dataloader: under `enumerate(DataLoader)#...`.
- forward: any other op inside a `ProfilerStep#N` span.

The ops are CPU ops and annotations only: Python frames (`python_function`, with_stack=True) wrap
the step spans and are left out by the caller (timeline.py `_CPU_OPS`).
"""

from __future__ import annotations

import functools
import re

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from diag.timeline.nesting import parents

I64 = npt.NDArray[np.int64]

FORWARD_ONLY_OPS = frozenset({
    "aten::linear", "aten::addmm", "aten::baddbmm",
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward", "aten::convolution", "aten::conv1d", "aten::conv2d",
    "aten::conv3d", "aten::layer_norm", "aten::native_layer_norm", "aten::rms_norm",
    "aten::_fused_rms_norm", "aten::embedding",
})
_CHECKPOINT_NODE = re.compile(r"Checkpoint\w*Backward$")
_BACKWARD_SPAN = "autograd::engine::evaluate_function"
PHASES = ("forward", "backward", "recompute", "optimizer", "dataloader", "other")


# Kernels only a backward pass launches, for traces that record no CPU ops (activities=[CUDA]):
# `threshold_backward`, `LayerNormBackwardCUDAKernel`, `flash_bwd_dq_dk_dv_loop_kernel`,
# `sm80_xmma_dgrad_implicit_gemm`, `sm80_xmma_wgrad_implicit_gemm`, `cuComputeGradInput`,
# `layer_norm_grad_input_kernel`, `embedding_backward_feature_kernel`.
_BACKWARD_KERNEL = re.compile(r"backward|bwd|dgrad|wgrad|grad_?input|grad_?weight", re.IGNORECASE)
TRAINING_PHASES = ("backward", "recompute", "optimizer")


def is_backward_kernel(name: str) -> bool:
    return bool(_BACKWARD_KERNEL.search(name))


def is_dataloader_span(name: str) -> bool:
    return name.startswith("enumerate(DataLoader)")


def is_optimizer_span(name: str) -> bool:
    return name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))


def is_step_span(name: str) -> bool:
    return name.startswith("ProfilerStep#")


def assign_phases(tid: I64, end: I64, codes: I64, names: list[str],
                  has_fwd_tid: npt.NDArray[np.bool_]) -> npt.NDArray[np.object_]:
    """Phase of each op; ops sorted by (tid, ts, -end), named by `name_codes`.

    An op's phase is a function of its name, whether it has a `Fwd thread id`, and its parent's
    phase (`_phase_of`): a row of 7 entries (parent phase: none or one of PHASES → its phase)
    per distinct (name, Fwd thread id), applied from the top level down, a level a numpy pass."""
    if len(codes) == 0:
        return np.zeros(0, dtype=object)
    key = codes * 2 + has_fwd_tid
    keys = np.flatnonzero(np.bincount(key, minlength=2 * len(names)))   # the (name, Fwd thread id) seen
    key_of = np.zeros(2 * len(names), np.int64)
    key_of[keys] = np.arange(len(keys))
    key_of = key_of[key]
    rows = np.array([_phase_row(names[k // 2], bool(k % 2)) for k in keys.tolist()], np.int8)
    up = parents(tid, end)
    state = np.zeros(len(codes), np.int8)   # index into _STATES
    done = up < 0
    state[done] = rows[key_of[done], 0]
    todo = np.nonzero(~done)[0]
    # Top down, one nesting level a pass (the control trace's 41k ops nest 8 deep).
    while len(todo):
        ready = done[up[todo]]
        i = todo[ready]
        state[i] = rows[key_of[i], state[up[i]]]
        done[i] = True
        todo = todo[~ready]
    return _LABELS[state]


_STATES = (None, *PHASES)
_LABELS = np.array(["other", *PHASES], dtype=object)   # _STATES[0], no parent, never comes out


@functools.lru_cache(maxsize=16384)
def _phase_row(name: str, has_fwd_tid: bool) -> tuple[int, ...]:
    """An op's phase (index into _STATES) under each parent phase. Cached: ranks share their names."""
    return tuple(_STATES.index(_phase_of(name, parent, has_fwd_tid)) for parent in _STATES)


def name_codes(names: pa.ChunkedArray) -> tuple[I64, list[str]]:
    """Each name's index into the distinct names (None as ""): a trace repeats a few hundred."""
    encoded = names.fill_null("").combine_chunks().dictionary_encode()
    return np.asarray(encoded.indices, np.int64), encoded.dictionary.to_pylist()


def _phase_of(name: str, parent: str | None, has_fwd_tid: bool) -> str:
    if is_dataloader_span(name):
        return "dataloader"
    if is_optimizer_span(name):
        return "optimizer"
    if name.startswith(_BACKWARD_SPAN):
        # Also inside a recompute subtree: the backward of a recomputed segment is real backward work.
        return "backward"
    if parent == "recompute":
        return "recompute"
    if parent == "backward":
        if name in FORWARD_ONLY_OPS or _CHECKPOINT_NODE.search(name):
            return "recompute"
        return "backward"
    if parent is None:
        if is_step_span(name):
            return "forward"
        return "backward" if has_fwd_tid else "other"
    return parent
