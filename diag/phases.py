"""Which phase of the training step each CPU op belongs to, from the nesting of spans per thread.

Phases: `forward`, `backward`, `recompute`, `optimizer`, `dataloader`, `other`.

- backward: inside an `autograd::engine::evaluate_function: ...` span (the autograd engine runs
  every node under one; on the CPU it uses the calling thread, on CUDA its own thread), or a
  top-level op on another thread that carries `Fwd thread id`.
- recompute: a *forward* op executed again inside the backward pass by activation
  checkpointing. Inside a backward span, an op is recompute when it is a forward-only op (one no
  derivative formula calls: linear, addmm, the attention forwards, conv, norms, embedding) or
  sits under a checkpoint node (`CheckpointFunctionBackward`, reentrant torch.utils.checkpoint).
  Other custom Functions' nodes (`CompiledFunctionBackward` of torch.compile, Megatron's) are
  ordinary backward. Everything under a recompute op is recompute.
- optimizer: under `Optimizer.step#...` / `Optimizer.zero_grad#...`.
- dataloader: under `enumerate(DataLoader)#...`.
- forward: any other op inside a `ProfilerStep#N` span.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from diag.nesting import parents

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


def is_dataloader_span(name: str) -> bool:
    return name.startswith("enumerate(DataLoader)")


def is_optimizer_span(name: str) -> bool:
    return name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))


def is_step_span(name: str) -> bool:
    return name.startswith("ProfilerStep#")


def assign_phases(tid: I64, end: I64, codes: I64, names: list[str], fwd_tid: Sequence[int | None]) -> list[str]:
    """Phase of each op; ops sorted by (tid, ts, -end), named by `name_codes`.

    An op's phase is a function of its name, whether it has a `Fwd thread id`, and its parent's
    phase (`_phase_of`). Each op's function is a row of 7 entries (parent phase: none or one of
    PHASES → its phase); composing every op's row with its parent's by pointer jumping gives the
    phase in log2(depth) numpy passes."""
    if len(codes) == 0:
        return []
    states = (None, *PHASES)
    has_fwd = pa.array(fwd_tid, pa.int64()).is_valid().to_numpy(zero_copy_only=False)
    keys, key_of = np.unique(codes * 2 + has_fwd, return_inverse=True)
    rows = np.array([[states.index(_phase_of(names[k // 2], parent, bool(k % 2))) for parent in states] for k in keys],
                    np.int8)
    fn = rows[key_of]
    up = parents(tid, end)
    while (up >= 0).any():
        has = np.nonzero(up >= 0)[0]
        fn[has] = np.take_along_axis(fn[has], fn[up[has]].astype(np.int64), axis=1)
        up[has] = up[up[has]]
    labels = np.array(["other", *PHASES], dtype=object)   # states[0], no parent, never comes out
    return list(labels[fn[:, 0]])


def name_codes(names: Sequence[str | None]) -> tuple[I64, list[str]]:
    """Each name's index into the distinct names (None as ""): a trace repeats a few hundred."""
    encoded = pa.array(names, pa.string()).fill_null("").dictionary_encode()
    return encoded.indices.to_numpy().astype(np.int64), encoded.dictionary.to_pylist()


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
