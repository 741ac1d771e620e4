"""The example job's switches, and the launcher that runs it as N processes on one machine.

No torch here: `diag.cli` imports this module, and the job (`python -m diag.capture.example.gpt`) parses
the same switches.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from diag.capture.profiler import flight_recorder_env, prepare_out_dir
from diag.runtime.errors import ExitCode, require

if TYPE_CHECKING:
    import subprocess

RECOMPUTE_CHOICES = ("none", "full", "selective")


@dataclass(frozen=True)
class ExampleConfig:
    """One run of the example job; the defaults make a run of a few seconds on 2 CPU cores."""

    steps: int = 4
    # Profiler schedule: skip one step, warm up one, record `active` (default: the rest), `repeat` times.
    active: int | None = None
    repeat: int = 1
    # The model (tiny by default; pass bigger ones on GPUs).
    layers: int = 4
    heads: int = 4
    head_dim: int = 16
    seq_len: int = 64
    vocab: int = 256
    batch: int = 8  # sequences per data-parallel rank per optimizer step
    # Causes.
    loader_delay_ms: float = 0.0
    slow_rank: int | None = None
    slow_ms: float = 50.0
    recompute: str = "none"
    micro_batch: int | None = None  # default: the whole batch; with --pp, a quarter of it
    no_overlap: bool = False
    pp: int = 1

    @property
    def active_steps(self) -> int:
        return self.active if self.active is not None else self.steps - 2

    @property
    def micro_batch_size(self) -> int:
        if self.micro_batch is not None:
            return self.micro_batch
        # Four microbatches keep GPipe's bubble at (p-1)/(m+p-1) = 1/5 of the step for p = 2.
        return max(1, self.batch // 4) if self.pp > 1 else self.batch

    def check(self, nproc: int) -> None:
        """Raise ValueError naming the switch when this run cannot work with nproc processes."""
        problems = []
        if self.active_steps < 1 or self.repeat < 1 or self.steps < self.repeat * (2 + self.active_steps):
            problems.append(
                f"--steps {self.steps} is fewer than --repeat {self.repeat} × (1 wait + 1 warm-up + "
                f"{self.active_steps} active)"
            )
        if self.recompute not in RECOMPUTE_CHOICES:
            problems.append(f"--recompute {self.recompute} is not one of {RECOMPUTE_CHOICES}")
        if self.pp < 1 or nproc % self.pp or self.layers % self.pp:
            problems.append(f"--pp {self.pp} must divide --nproc {nproc} and the {self.layers} layers")
        if self.batch % self.micro_batch_size:
            problems.append(f"--micro-batch {self.micro_batch_size} must divide --batch {self.batch}")
        if self.slow_rank is not None and not 0 <= self.slow_rank < nproc:
            problems.append(f"--slow-rank {self.slow_rank} is not a rank of {nproc} processes")
        if min(self.layers, self.heads, self.head_dim, self.seq_len, self.vocab, self.batch) < 1:
            problems.append("model sizes must be positive")
        if problems:
            raise ValueError("; ".join(problems))

    def to_argv(self) -> list[str]:
        """The job's command-line switches for this configuration (parsed back by add_job_arguments)."""
        argv = []
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None or value is False:
                continue
            flag = "--" + field.name.replace("_", "-")
            argv += [flag] if value is True else [flag, str(value)]
        return argv

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExampleConfig:
        return cls(**{field.name: getattr(args, field.name) for field in fields(cls)})


# The GPT's sizes, as --help says them.
_SIZES = {
    "layers": "transformer blocks", "heads": "attention heads per block", "head_dim": "width of each head",
    "seq_len": "tokens per sequence", "vocab": "vocabulary size", "batch": "sequences per step on each rank",
}


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's switches, shared by `diag example` and `python -m diag.capture.example.gpt`."""
    default = asdict(ExampleConfig())
    parser.add_argument("--steps", type=int, default=default["steps"], help="optimizer steps to run")
    parser.add_argument("--active", type=int, help="steps recorded per profiler cycle (default: steps - 2)")
    parser.add_argument("--repeat", type=int, default=default["repeat"], help="profiler cycles (one file per rank each)")
    sizes = parser.add_argument_group("model")
    for name, words in _SIZES.items():
        sizes.add_argument("--" + name.replace("_", "-"), type=int, default=default[name],
                           help=f"{words} (default {default[name]})")
    causes = parser.add_argument_group("causes to inject")
    causes.add_argument(
        "--loader-delay-ms", type=float, default=0.0, help="the DataLoader's dataset sleeps this long per batch"
    )
    causes.add_argument("--slow-rank", type=int, help="this rank does --slow-ms of extra matmuls every step")
    causes.add_argument("--slow-ms", type=float, default=default["slow_ms"],
                        help=f"extra matmul time per step on --slow-rank, in ms (default {default['slow_ms']:g})")
    causes.add_argument(
        "--recompute",
        choices=RECOMPUTE_CHOICES,
        default="none",
        help="activation checkpointing: each whole block, or only the attention core",
    )
    causes.add_argument("--micro-batch", type=int, help="sequences per microbatch (gradient accumulation)")
    causes.add_argument(
        "--no-overlap",
        action="store_true",
        help="all-reduce the gradients one by one after backward instead of DDP's bucketed overlap",
    )
    causes.add_argument("--pp", type=int, default=1, help="pipeline stages (GPipe, send/recv between ranks)")


def run_example(out_dir: str | os.PathLike[str], nproc: int = 2, steps: int = 4, **switches: object) -> Path:
    """Run the example job as nproc processes, captured into out_dir; returns out_dir.

    switches are ExampleConfig's fields (loader_delay_ms=50, pp=2, ...). Raises ValueError for a
    configuration that cannot run and RuntimeError when a rank fails.
    """
    config = ExampleConfig(steps=steps, **switches)  # type: ignore[arg-type]
    config.check(nproc)
    out = prepare_out_dir(out_dir)
    base_env = dict(os.environ)
    # Before the process groups exist, when NCCL reads them (capture() can only set them later).
    base_env.update(flight_recorder_env(out, base_env))
    base_env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        # One thread per process: several ranks share a small machine (and a GPU rank needs none).
        OMP_NUM_THREADS="1",
    )
    import subprocess  # here and below, not at the top: `diag --help` loads this module (issue 16)

    command = [sys.executable, "-m", "diag.capture.example.gpt", "--out", str(out), *config.to_argv()]
    ranks = [
        subprocess.Popen(command, env={**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
        for rank in range(nproc)
    ]
    _wait_all(ranks)
    return out


# Rank 0's store listens on a port picked here, seconds before it binds it (torch's import): a port
# from bind(0) is one the kernel also hands out to outgoing connections, and one did take it in
# CI (EADDRINUSE). Below the kernel's ephemeral range only an explicit bind can take it.
_PORTS_FROM = 15000
_EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"


def _free_port() -> int:
    import random
    import socket

    try:
        with open(_EPHEMERAL) as f:
            first_ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):   # not Linux: the IANA range starts at 49152
        first_ephemeral = 49152
    candidates = range(_PORTS_FROM, first_ephemeral)
    for port in random.sample(candidates, min(len(candidates), 64)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:   # a range with nothing free
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_all(ranks: list[subprocess.Popen[bytes]]) -> None:
    """Wait for every rank; when one fails, stop the others (they would wait on it in a collective)."""
    failed: dict[int, int] = {}
    try:
        while not failed and any(proc.poll() is None for proc in ranks):
            time.sleep(0.05)
            failed = {rank: proc.returncode for rank, proc in enumerate(ranks) if proc.returncode not in (None, 0)}
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.terminate()
        for proc in ranks:
            proc.wait()
    failed = failed or {rank: proc.returncode for rank, proc in enumerate(ranks) if proc.returncode != 0}
    if failed:
        first = min(failed)
        raise RuntimeError(f"example job: rank {first} exited with status {failed[first]} (its error is above)")


def add_example_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="directory for the traces and model.toml")
    parser.add_argument("--nproc", type=int, default=2, help="processes (ranks); one per GPU when there are GPUs")
    add_job_arguments(parser)


def run_example_command(args: argparse.Namespace) -> int:
    require("torch", "example", "capture")
    config = ExampleConfig.from_args(args)
    try:
        out = run_example(args.out, nproc=args.nproc, **asdict(config))
    except ValueError as error:
        print(f"diag example: {error}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except RuntimeError as error:
        print(f"diag example: {error}", file=sys.stderr)
        return ExitCode.INTERNAL
    traces = sorted(out.glob("*.pt.trace.json"))
    print(f"diag example: {len(traces)} traces and model.toml in {out}; next: diag analyze {out}", file=sys.stderr)
    return ExitCode.OK
