"""What diag.capture.profiler costs a training step: the example GPT's step on the CPU, without and with it.

    .venv/bin/python bench/capture_overhead.py [--steps 40]

One process, world size 1 (gloo), one thread. Prints the median step time of each phase and its
ratio to the unprofiled median. Recorded steps pay for recording every op with its shapes, a
fixed cost per op (printed); the step that ends a cycle also pays for writing the trace file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from diag.capture.example.gpt import GPT, Rank, Trainer, non_embedding_params
from diag.capture.example.launch import ExampleConfig
from diag.capture.profiler import capture


def _timed(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


@dataclass(frozen=True)
class Round:
    """One round: `steps` unprofiled steps, then one profiler cycle of `steps` recorded ones."""

    plain_s: float  # median
    recorded_s: float  # median, the cycle's last step excluded
    write_s: float  # the last step's profiler.step(): stop, post-process, write the file
    trace_mb: float
    ops_per_step: float


def one_round(trainer: Trainer, batch: torch.Tensor, steps: int) -> Round:
    plain = [_timed(lambda: trainer.step(batch)) for _ in range(steps)]
    with tempfile.TemporaryDirectory() as out:
        with capture(out, wait=0, warmup=1, active=steps) as profiler:
            trainer.step(batch)
            profiler.step()
            recorded = [_timed(lambda: trainer.step(batch)) + _timed(profiler.step) for _ in range(steps - 1)]
            trainer.step(batch)
            write_s = _timed(profiler.step)
        (trace,) = Path(out).glob("*.pt.trace.json")
        ops = sum(1 for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X")
        return Round(statistics.median(plain), statistics.median(recorded), write_s, trace.stat().st_size / 1e6, ops / steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=15, help="steps per phase")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of unprofiled and profiled phases")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo", rank=0, world_size=1)
    header = ("model", "plain ms", "recorded ms", "× plain", "range", "ops/step", "µs/op", "write s", "trace MB")
    print("{:<24} {:>9} {:>12} {:>8} {:>11} {:>9} {:>6} {:>8} {:>9}".format(*header))
    # The example's tiny default (width 64) and a 4× wider one: the cost is per recorded op,
    # so it weighs less as the ops grow.
    for head_dim in (16, 64):
        config = ExampleConfig(head_dim=head_dim)
        torch.manual_seed(0)
        gpt = GPT(config)
        trainer = Trainer(config, gpt, Rank(config), torch.device("cpu"))
        batch = torch.randint(config.vocab, (config.batch, config.seq_len + 1))
        for _ in range(3):  # warm the allocator and the first-call paths
            trainer.step(batch)
        # Alternate, so that load from other processes on the machine hits both phases alike.
        rounds = [one_round(trainer, batch, args.steps) for _ in range(args.rounds)]
        ratios = sorted(r.recorded_s / r.plain_s for r in rounds)
        plain = statistics.median(r.plain_s for r in rounds)
        recorded = statistics.median(r.recorded_s for r in rounds)
        ops = statistics.median(r.ops_per_step for r in rounds)
        model = f"width {config.heads * head_dim}, {non_embedding_params(gpt) / 1e6:.2f}M"
        print(
            f"{model:<24} {plain * 1e3:9.1f} {recorded * 1e3:12.1f} {statistics.median(ratios):8.2f} "
            f"{ratios[0]:5.2f}-{ratios[-1]:<5.2f} {ops:9.0f} {(recorded - plain) / ops * 1e6:6.1f} "
            f"{statistics.median(r.write_s for r in rounds):8.2f} {statistics.median(r.trace_mb for r in rounds):9.1f}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
