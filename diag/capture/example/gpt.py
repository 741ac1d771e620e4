"""The example job: one rank of a small GPT trained with torch.distributed, captured by diag.capture.profiler.

`diag example` (launch.py) runs `python -m diag.capture.example.gpt --out DIR ...` once per rank with
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set: gloo on CPUs, NCCL with one GPU
per rank (cuda:LOCAL_RANK, bf16 autocast) when there are GPUs. Ranks are laid out
`rank = stage × dp + dp_rank`: pipeline stages outermost, data-parallel replicas within.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

from diag.capture.example.launch import ExampleConfig, add_job_arguments
from diag.capture.profiler import capture

# The label of --slow-rank's extra work in the trace.
SLOW_RANK_SPAN = "diag_example::slow_rank"


class Attention(nn.Module):
    def __init__(self, heads: int, head_dim: int, recompute_core: bool) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.recompute_core = recompute_core
        width = heads * head_dim
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = (
            part.view(batch, seq, self.heads, self.head_dim).transpose(1, 2) for part in self.qkv(x).split(width, dim=2)
        )
        if self.recompute_core:
            # Selective recomputation (Korthikanti et al. 2022): keep the projections' activations,
            # recompute only softmax(QKᵀ)V in backward.
            y = checkpoint(F.scaled_dot_product_attention, q, k, v, is_causal=True, use_reentrant=False)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    def __init__(self, heads: int, head_dim: int, recompute: str) -> None:
        super().__init__()
        width = heads * head_dim
        self.recompute_all = recompute == "full"
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(heads, head_dim, recompute_core=recompute == "selective")
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute_all:
            # Full recomputation: the whole block's forward runs again in backward (8N, not 6N, FLOPs).
            out: torch.Tensor = checkpoint(self._forward, x, use_reentrant=False)
            return out
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-2's layout, with an untied output head so that it counts among the non-embedding params."""

    def __init__(self, config: ExampleConfig) -> None:
        super().__init__()
        width = config.heads * config.head_dim
        self.wte = nn.Embedding(config.vocab, width)
        self.wpe = nn.Embedding(config.seq_len, width)
        self.blocks = nn.ModuleList(
            Block(config.heads, config.head_dim, config.recompute) for _ in range(config.layers)
        )
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, config.vocab, bias=False)


def non_embedding_params(model: GPT) -> int:
    """N of 6N: every parameter but the token and position embeddings (lookups, not matmuls)."""
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith(("wte.", "wpe.")))


class Stage(nn.Module):
    """Pipeline stage `index` of `count`: its share of the blocks, the embeddings on the first
    stage, the final norm and head on the last. One stage of one is the whole model."""

    def __init__(self, gpt: GPT, index: int, count: int) -> None:
        super().__init__()
        per_stage = len(gpt.blocks) // count
        self.is_first = index == 0
        self.is_last = index == count - 1
        self.blocks = nn.ModuleList(list(gpt.blocks)[index * per_stage : (index + 1) * per_stage])
        self.embed = nn.ModuleList([gpt.wte, gpt.wpe]) if self.is_first else None
        self.head = nn.Sequential(gpt.ln_f, gpt.lm_head) if self.is_last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            wte, wpe = self.embed
            x = wte(x) + wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


class RandomTokens(Dataset[torch.Tensor]):
    """Batches of random tokens (seq_len + 1 each, for inputs and shifted targets); sleeps
    `delay_s` per batch, like a loader that cannot keep up with the GPUs."""

    def __init__(self, config: ExampleConfig, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.delay_s = config.loader_delay_ms / 1000

    def __len__(self) -> int:
        return self.config.steps

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        shape = (self.config.batch, self.config.seq_len + 1)
        return torch.randint(self.config.vocab, shape, generator=generator)


class Rank:
    """This process's place in the job and the groups it talks in."""

    def __init__(self, config: ExampleConfig) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.dp = self.world // config.pp
        self.stage, self.dp_rank = divmod(self.rank, self.dp)
        self.dp_group: dist.ProcessGroup | None = None  # None: the whole world
        if config.pp > 1 and self.dp > 1:
            # Every rank must create every group, in the same order.
            for stage in range(config.pp):
                group = dist.new_group([stage * self.dp + i for i in range(self.dp)])
                if stage == self.stage:
                    self.dp_group = group
        self.next_rank = self.rank + self.dp
        self.prev_rank = self.rank - self.dp


def _slow_down(ms: float, device: torch.device) -> None:
    """Real work, not a sleep: matmuls until `ms` have passed (synchronized on a GPU, so that
    the GPU, not only the host, is busy)."""
    with torch.profiler.record_function(SLOW_RANK_SPAN):
        a = torch.randn(256, 256, device=device)
        deadline = time.perf_counter() + ms / 1000
        while time.perf_counter() < deadline:
            a = torch.tanh(a @ a)
            if device.type == "cuda":
                torch.cuda.synchronize(device)


class Trainer:
    def __init__(self, config: ExampleConfig, gpt: GPT, where: Rank, device: torch.device) -> None:
        self.config = config
        self.where = where
        self.device = device
        stage = Stage(gpt, where.stage, config.pp).to(device)
        self.stage = stage
        self.params = list(stage.parameters())
        # DDP's bucketed all-reduce overlaps backward; with pipelining or --no-overlap the
        # gradients are all-reduced one by one after backward, nothing beside them.
        self.ddp: DistributedDataParallel | None = None
        if config.pp == 1 and not config.no_overlap and where.dp > 1:
            model_mb = sum(p.numel() * p.element_size() for p in self.params) / 2**20
            # About four buckets even for the tiny default model (DDP's 25 MiB would make one).
            bucket_cap_mb = min(25.0, model_mb / 4)
            self.ddp = DistributedDataParallel(stage, bucket_cap_mb=bucket_cap_mb)  # type: ignore[arg-type]
        self.optimizer = torch.optim.AdamW(self.params, lr=3e-4)
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step(self, batch: torch.Tensor) -> None:
        config = self.config
        if config.slow_rank == self.where.rank:
            _slow_down(config.slow_ms, self.device)
        batch = batch.to(self.device)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        micro = list(zip(inputs.split(config.micro_batch_size), targets.split(config.micro_batch_size), strict=True))
        if config.pp > 1:
            self._gpipe(micro)
        else:
            self._accumulate(micro)
        if self.ddp is None and self.where.dp > 1:
            self._all_reduce_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor, microbatches: int) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()) / microbatches

    def _accumulate(self, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        model = self.ddp if self.ddp is not None else self.stage
        for index, (x, y) in enumerate(micro):
            # DDP all-reduces only on the last microbatch's backward.
            last = index == len(micro) - 1
            no_sync = self.ddp.no_sync() if self.ddp is not None and not last else nullcontext()
            with no_sync:
                with self.autocast:
                    loss = self._loss(model(x), y, len(micro))
                loss.backward()

    def _gpipe(self, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """GPipe: every microbatch forward, then every one backward; activations and their
        gradients go between neighbouring stages by send/recv."""
        stage, where = self.stage, self.where
        shape = (self.config.micro_batch_size, self.config.seq_len, self.config.heads * self.config.head_dim)
        inputs, outputs = [], []
        for x, y in micro:
            if not stage.is_first:
                x = torch.empty(shape, device=self.device)
                dist.recv(x, where.prev_rank)
                x.requires_grad_()
            with self.autocast:
                out = stage(x)
            if stage.is_last:
                out = self._loss(out, y, len(micro))
            else:
                dist.send(out.detach().float().contiguous(), where.next_rank)
            inputs.append(x)
            outputs.append(out)
        for x, out in reversed(list(zip(inputs, outputs, strict=True))):
            if stage.is_last:
                out.backward()
            else:
                grad = torch.empty(shape, device=self.device)
                dist.recv(grad, where.next_rank)
                out.backward(grad.to(out.dtype))
            if not stage.is_first:
                assert x.grad is not None
                dist.send(x.grad.contiguous(), where.prev_rank)

    def _all_reduce_gradients(self) -> None:
        for p in self.params:
            if p.grad is not None:
                # gloo has no AVG: sum, then divide.
                dist.all_reduce(p.grad, group=self.where.dp_group)
                p.grad.div_(self.where.dp)


def _device() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            # NCCL refuses two ranks of one communicator on one GPU.
            raise SystemExit(
                f"diag example: rank {local_rank} needs GPU {local_rank}, and there are "
                f"{torch.cuda.device_count()}: pass --nproc {torch.cuda.device_count()} or fewer"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device, "nccl"
    return torch.device("cpu"), "gloo"


def train(config: ExampleConfig, out_dir: Path) -> None:
    """Run this rank of the job, profiled into out_dir."""
    torch.set_num_threads(1)
    device, backend = _device()
    # A tiny job that waits minutes on a peer has failed; don't hang a test or a terminal for 30.
    dist.init_process_group(backend, timeout=timedelta(seconds=120))
    try:
        config.check(dist.get_world_size())
        where = Rank(config)
        torch.manual_seed(0)  # the same initial weights on every rank
        gpt = GPT(config)
        model = {
            "params": non_embedding_params(gpt),
            "layers": config.layers,
            "heads": config.heads,
            "head_dim": config.head_dim,
            "seq_len": config.seq_len,
            "tokens_per_step": config.batch * config.seq_len * where.dp,
        }
        trainer = Trainer(config, gpt, where, device)
        loader: Iterator[torch.Tensor] = iter(
            DataLoader(RandomTokens(config, seed=where.dp_rank), batch_size=None, num_workers=0)
        )
        with capture(
            out_dir, wait=1, warmup=1, active=config.active_steps, repeat=config.repeat, model=model
        ) as profiler:
            for _ in range(config.steps):
                # Fetched inside the step, as `for batch in loader` does, so the profiler's
                # `enumerate(DataLoader)#...` span falls in this step's ProfilerStep.
                trainer.step(next(loader))
                profiler.step()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diag.capture.example.gpt", description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    add_job_arguments(parser)
    args = parser.parse_args(argv)
    train(ExampleConfig.from_args(args), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
