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


def assign_phases(
    tid: Sequence[int], ts: Sequence[int], end: Sequence[int], name: Sequence[str],
    fwd_tid: Sequence[int | None],
) -> list[str]:
    """Phase of each op. Inputs are parallel sequences, sorted by (tid, ts, -end)."""
    n = len(ts)
    phase = ["other"] * n
    stack: list[int] = []
    cur_tid: int | None = None
    memo: dict[tuple[str, str | None, bool], str] = {}   # a trace repeats a few hundred op names
    for i in range(n):
        if tid[i] != cur_tid:
            stack.clear()
            cur_tid = tid[i]
        while stack and end[stack[-1]] <= ts[i] and not (end[stack[-1]] == ts[i] == end[i]):
            stack.pop()
        # A span that starts inside the parent but outlives it is not its child (broken nesting
        # from clock jitter): pop until it fits.
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        key = (name[i] or "", phase[stack[-1]] if stack else None, fwd_tid[i] is not None)
        p = memo.get(key)
        if p is None:
            p = memo[key] = _phase_of(*key)
        phase[i] = p
        stack.append(i)
    return phase


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
