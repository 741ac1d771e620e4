"""What diag.capture costs a training step: the example GPT's step on the CPU, without and with it.

    .venv/bin/python bench/capture_overhead.py [--steps 40]

One process, world size 1 (gloo), one thread. Prints the median step time of each phase and its
ratio to the unprofiled median. Recorded steps pay for recording every op with its shapes; the
step that ends a cycle also pays for writing the trace file, shown on its own row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from diag.capture import capture
from diag.example.gpt import GPT, Rank, Trainer, non_embedding_params
from diag.example.launch import ExampleConfig


def _timed(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(config: ExampleConfig, steps: int) -> list[tuple[str, float]]:
    """(phase, seconds) for one model size: medians of plain and recorded steps, and the one-offs."""
    torch.manual_seed(0)
    trainer = Trainer(config, GPT(config), Rank(config), torch.device("cpu"))
    batch = torch.randint(config.vocab, (config.batch, config.seq_len + 1))
    for _ in range(3):  # warm the allocator and the first-call paths
        trainer.step(batch)
    plain = [_timed(lambda: trainer.step(batch)) for _ in range(steps)]
    with tempfile.TemporaryDirectory() as out:
        # Wait 1, warm up 1, then record all the rest as one cycle.
        with capture(out, wait=1, warmup=1, active=steps) as profiler:
            waited = _timed(lambda: trainer.step(batch)) + _timed(profiler.step)
            warmed = _timed(lambda: trainer.step(batch)) + _timed(profiler.step)
            recorded = [_timed(lambda: trainer.step(batch)) + _timed(profiler.step) for _ in range(steps - 1)]
            last = _timed(lambda: trainer.step(batch))
            written = _timed(profiler.step)  # the end of the cycle: the trace file is written here
        trace_mb = sum(f.stat().st_size for f in Path(out).glob("*.pt.trace.json")) / 1e6
    return [
        ("no profiler (median)", statistics.median(plain)),
        ("waiting step", waited),
        ("warm-up step", warmed),
        ("recorded step (median)", statistics.median(recorded)),
        (f"last step + write {trace_mb:.0f} MB trace", last + written),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="steps per phase")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo", rank=0, world_size=1)
    print(f"{'model':<26} {'phase':<34} {'ms':>9} {'× plain':>8}")
    # The example's tiny default (width 64) and a 4× wider one: the cost is per op, so it
    # weighs less as the ops grow.
    for head_dim in (16, 64):
        config = ExampleConfig(steps=args.steps, head_dim=head_dim)
        model = f"width {config.heads * head_dim}, {non_embedding_params(GPT(config)) / 1e6:.2f}M params"
        rows = measure(config, args.steps)
        base = rows[0][1]
        for phase, seconds in rows:
            print(f"{model:<26} {phase:<34} {seconds * 1e3:9.1f} {seconds / base:8.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
