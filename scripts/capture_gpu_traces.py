"""Record the small real GPU traces under tests/data/gpu_captures/ (run once on a GPU machine).

Each capture is plain torch (no diag import: the GPU machine has torch and nothing of ours), kept
small, and written with `meta.json` holding what the test derives by hand: the matmul shapes the
program issued, so a test can count FLOPs without reading diag's code.

    python scripts/capture_gpu_traces.py OUT_DIR

Captures:
- gpt_bf16/: a 4-layer GPT training step under bf16 autocast with causal SDPA, record_shapes on,
  schedule wait=1 warmup=1 active=2 repeat=2 (two trace files, two steps each); gpt_compiled/ and
  gpt_cudagraphs/ the same under torch.compile (mode default, and reduce-overhead: CUDA graphs);
- conv_fp32/ and conv_bf16/: a strided, padded convnet training step, fp32 with Concrete Inputs
  off and bf16 channels-last with them on (torch's default);
- infer_after_warmup/: one forward step profiled right after an unsynchronised warm-up, so the
  warm-up's kernels run inside the first window without a launch record; with_stack on;
- fp8_mix/: fp8 (e4m3) `torch._scaled_mm` GEMMs beside bf16 ones in one step;
- nccl_one_rank/: collectives on a one-rank NCCL group (real NCCL kernel and record_param_comms
  fields; one GPU cannot hold two ranks of one communicator).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

# DIAG_CAPTURE_DEVICE=cpu smoke-tests the script on a machine without a GPU (the traces then hold
# no kernels and are not the ones kept).
DEVICE = os.environ.get("DIAG_CAPTURE_DEVICE", "cuda")


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _write_gz(prof: profile, path: Path) -> None:
    raw = path.with_suffix("")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def _handler(out: Path, stem: str):
    def ready(prof: profile) -> None:
        _write_gz(prof, out / f"{stem}.{prof.step_num}.pt.trace.json.gz")

    return ready


def _record(out: Path, stem: str, step, *, warm: int, wait: int = 0, warmup: int = 1, active: int = 2,
            repeat: int = 1, sync_each: bool = False) -> None:
    """`warm` unprofiled steps, then the schedule's steps under the profiler, one file per cycle."""
    for _ in range(warm):
        step()
    _sync()
    sched = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=sched,
                 record_shapes=True, on_trace_ready=_handler(out, stem)) as prof:
        for _ in range((wait + warmup + active) * repeat):
            step()
            if sync_each:
                _sync()
            prof.step()
    _sync()


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, vocab: int, seq: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


GPT_SHAPE = {"layers": 4, "d": 1024, "heads": 16, "vocab": 8192, "seq": 1024, "batch": 8}


def gpt_bf16(out: Path, compile_mode: str | None = None, stem: str = "gpt_bf16") -> dict:
    s = GPT_SHAPE
    model = GPT(s["layers"], s["d"], s["heads"], s["vocab"], s["seq"]).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=DEVICE)
    forward = model if compile_mode is None else torch.compile(model, mode=compile_mode)

    def step() -> None:
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            logits = forward(tokens)
            loss = F.cross_entropy(logits.float().view(-1, s["vocab"]), tokens.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # compiled: the graphs are built (and, reduce-overhead, recorded) in the warm-up steps
    _record(out, stem, step, warm=3 if compile_mode is None else 6, wait=1, repeat=2)
    d, L, T, V = s["d"], s["layers"], s["batch"] * s["seq"], s["vocab"]
    # Matmuls per token, forward: qkv 3d², proj d², fc1 4d², fc2 4d² per layer, head d·V; ×2 FLOPs
    # per MAC, ×3 for forward + backward.
    linear = 3 * 2 * T * (L * 12 * d * d + d * V)
    # Causal SDPA: QKᵀ and PV, 2·2·seq²·d per sequence per layer forward, halved by the mask;
    # backward 2.5× forward (flash backward recomputes QKᵀ).
    attn_fwd = L * s["batch"] * 2 * 2 * s["seq"] ** 2 * d // 2
    return {"shape": s, "linear_flops_per_step": linear, "attention_fwd_flops_per_step": attn_fwd,
            "params_non_embedding": sum(p.numel() for n, p in model.named_parameters()
                                        if n.startswith("blocks.")),
            "tokens_per_step": T}


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.b1 = nn.BatchNorm2d(64)
        self.c2 = nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(128)
        self.c3 = nn.Conv2d(128, 256, 3, stride=1, padding=1, bias=False)
        self.b3 = nn.BatchNorm2d(256)
        self.fc = nn.Linear(256, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.b1(self.c1(x)))
        x = F.relu(self.b2(self.c2(x)))
        x = F.relu(self.b3(self.c3(x)))
        return self.fc(x.mean((2, 3)))


CONV_BATCH, CONV_HW = 64, 224


def conv_flops() -> int:
    """Forward MACs ×2 of each conv and the fc, from the layer shapes (out size by the conv formula)."""
    total, hw = 0, CONV_HW
    for cin, cout, k, stride, pad in ((3, 64, 7, 2, 3), (64, 128, 3, 2, 1), (128, 256, 3, 1, 1)):
        hw = (hw + 2 * pad - k) // stride + 1
        total += 2 * CONV_BATCH * cout * hw * hw * cin * k * k
    return total + 2 * CONV_BATCH * 256 * 1000


def conv(out: Path, bf16: bool) -> dict:
    torch.backends.cudnn.benchmark = True
    model = ConvNet().to(DEVICE)
    x = torch.randn(CONV_BATCH, 3, CONV_HW, CONV_HW, device=DEVICE)
    if bf16:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (CONV_BATCH,), device=DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step() -> None:
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # torch's default records Concrete Inputs; the fp32 capture turns them off, as torch 1.x had none.
    torch._C._profiler._set_record_concrete_inputs_enabled_val(bf16)
    _record(out, "conv_bf16" if bf16 else "conv_fp32", step, warm=3)
    torch._C._profiler._set_record_concrete_inputs_enabled_val(True)
    # Backward: input grad and weight grad each cost the forward's FLOPs (the first conv has no
    # input grad: its input needs none).
    fwd = conv_flops()
    first = 2 * CONV_BATCH * 64 * 112 * 112 * 3 * 49
    return {"dtype": "bf16" if bf16 else "fp32", "batch": CONV_BATCH, "hw": CONV_HW,
            "matmul_fwd_flops_per_step": fwd, "first_conv_fwd_flops": first,
            "matmul_flops_per_step": 3 * fwd - first}


def infer_after_warmup(out: Path) -> dict:
    s = GPT_SHAPE
    model = GPT(s["layers"], s["d"], s["heads"], s["vocab"], s["seq"]).to(DEVICE).eval()
    tokens = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=DEVICE)
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        model(tokens)
        _sync()
        # The profiler's warm-up step queues four forwards and does not wait: their kernels still
        # run when the active step begins, and the CPU side of them is not kept.
        sched = schedule(wait=0, warmup=1, active=1, repeat=1)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=sched,
                     record_shapes=True, with_stack=True,
                     on_trace_ready=_handler(out, "infer_after_warmup")) as prof:
            for _ in range(4):
                model(tokens)
            prof.step()
            model(tokens)
            prof.step()
        _sync()
    d, L, T, V = s["d"], s["layers"], s["batch"] * s["seq"], s["vocab"]
    return {"shape": s, "linear_flops_per_step": 2 * T * (L * 12 * d * d + d * V),
            "attention_flops_per_step": L * s["batch"] * 2 * 2 * s["seq"] ** 2 * d // 2,
            "warmup_forwards_queued": 4}


FP8_SHAPES = {"fp8": [(8192, 8192, 8192)] * 4, "bf16": [(8192, 8192, 8192)] * 4}


def fp8_mix(out: Path) -> dict:
    mats = {}
    for m, n, k in FP8_SHAPES["fp8"][:1]:
        a = torch.randn(m, k, device=DEVICE).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=DEVICE).to(torch.float8_e4m3fn).t()
        mats["fp8"] = (a, b, torch.tensor(1.0, device=DEVICE), torch.tensor(1.0, device=DEVICE))
    for m, n, k in FP8_SHAPES["bf16"][:1]:
        mats["bf16"] = (torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16),
                        torch.randn(k, n, device=DEVICE, dtype=torch.bfloat16))

    def step() -> None:
        a, b, sa, sb = mats["fp8"]
        for _ in FP8_SHAPES["fp8"]:
            torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        x, w = mats["bf16"]
        for _ in FP8_SHAPES["bf16"]:
            torch.mm(x, w)

    _record(out, "fp8_mix", step, warm=3, sync_each=True)
    return {"gemms_per_step": FP8_SHAPES,
            "flops_per_step": {k: sum(2 * m * n * kk for m, n, kk in v) for k, v in FP8_SHAPES.items()}}


def nccl_one_rank(out: Path) -> dict:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    t = torch.randn(4 << 20, device=DEVICE)
    gathered = torch.empty(4 << 20, device=DEVICE)
    w = torch.randn(2048, 2048, device=DEVICE)

    def step() -> None:
        y = t[: 2048 * 2048].view(2048, 2048) @ w
        dist.all_reduce(y)
        dist.all_gather_into_tensor(gathered, t)
        dist.reduce_scatter_tensor(t[: 1 << 20], gathered[: 1 << 20])
        dist.broadcast(t, src=0)
        dist.barrier()

    _record(out, "nccl_one_rank", step, warm=2)
    dist.destroy_process_group()
    return {"world_size": 1, "collectives_per_step": ["all_reduce", "all_gather_into_tensor",
                                                       "reduce_scatter_tensor", "broadcast", "barrier"]}


def hf_generate(out: Path) -> dict:
    """A serving-style capture: Hugging Face transformers' generate() on a small Llama (random
    weights from a config: nothing downloaded), bf16, SDPA attention with a KV cache, the whole call
    under the profiler with no ProfilerStep, as a user profiling inference would write it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=8192, max_position_embeddings=1024,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).to(DEVICE, torch.bfloat16).eval()
    prompt = torch.randint(0, config.vocab_size, (8, 128), device=DEVICE)
    kwargs = {"max_new_tokens": 16, "min_new_tokens": 16, "do_sample": False}
    with torch.no_grad():
        model.generate(prompt, **kwargs)
        _sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            model.generate(prompt, **kwargs)
            _sync()
    _write_gz(prof, out / "hf_generate.pt.trace.json.gz")
    return {"hidden": 1024, "intermediate": 2816, "layers": 4, "heads": 16, "kv_heads": 4, "vocab": 8192,
            "dtype": "bf16", "batch": 8, "prompt": 128, "new_tokens": 16}


CAPTURES = {"gpt_bf16": gpt_bf16,
            "hf_generate": hf_generate,
            # torch.compile of the model (Inductor: Triton kernels, its matmuls as extern mm calls);
            # reduce-overhead replays forward and backward as CUDA graphs.
            "gpt_compiled": lambda o: gpt_bf16(o, "default", "gpt_compiled"),
            "gpt_cudagraphs": lambda o: gpt_bf16(o, "reduce-overhead", "gpt_cudagraphs"),
            "conv_fp32": lambda o: conv(o, False),
            "conv_bf16": lambda o: conv(o, True), "infer_after_warmup": infer_after_warmup,
            "fp8_mix": fp8_mix, "nccl_one_rank": nccl_one_rank}


def main() -> int:
    root = Path(sys.argv[1])
    only = sys.argv[2:] or list(CAPTURES)
    meta: dict = {"torch": torch.__version__, "cuda": torch.version.cuda,
                  "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu", "captures": {}}
    for name in only:
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        try:
            meta["captures"][name] = CAPTURES[name](out)
        except Exception as exc:  # one capture's failure must not lose the others on a short lease
            meta["captures"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        print(name, sorted(p.name for p in out.iterdir()), flush=True)
    (root / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
