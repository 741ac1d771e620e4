"""`diag mfu`: MFU from throughput, throughput from MFU, or MFU from achieved TFLOP/s per GPU.

    MFU = tokens/s x FLOPs/token / (GPUs x dense peak)         (DESIGN.md)

    diag mfu --params 70e9 --gpus 1024 --gpu h100-sxm --tokens-per-s 12000   -> MFU 0.498%
    diag mfu --params 70e9 --gpus 1024 --gpu h100-sxm --mfu 0.40             -> 964,510 tokens/s
    diag mfu --tflops-per-gpu 400 --gpu h100-sxm                             -> MFU 40.4%

FLOPs per token are 6N, plus 12*L*H*Q*T when --layers --heads --head-dim --seq-len are all
given, or come from --model (a preset or a model file). The peak is the part's dense figure for
--dtype (bf16 by default, fp16 on parts without bf16; a mix such as fp8=0.6,bf16=0.4 gives the effective peak
1 / sum(share / peak), as `diag analyze` does); --peak-tflops overrides it, and a figure equal to some part's
"with sparsity" peak draws a warning on stderr (MFU007).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from diag.knowledge import hardware
from diag.knowledge.model import ModelSpec, flops_per_token, load_model
from diag.runtime.durations import number, significant
from diag.runtime.errors import BadInput, ExitCode
from diag.runtime.option_types import peak_tflops, positive_float, positive_int


@dataclass(frozen=True)
class MfuResult:
    mfu: float  # fraction of the dense peak, 0..1
    tokens_per_s: float | None  # global, all GPUs; None when FLOPs per token are unknown
    peak_tflops: float  # dense peak per GPU
    flops_per_token: float | None
    model_tflops_per_gpu: float  # achieved model TFLOP/s per GPU
    gpus: int | None

    def to_json(self) -> dict[str, float | None]:
        """The contract's four keys, in its order."""
        return {
            "mfu": self.mfu,
            "tokens_per_s": self.tokens_per_s,
            "peak_tflops": self.peak_tflops,
            "flops_per_token": self.flops_per_token,
        }


def solve_mfu(
    *,
    peak_tflops: float,
    flops_per_token: float | None,
    gpus: int | None,
    tokens_per_s: float | None = None,
    mfu: float | None = None,
    tflops_per_gpu: float | None = None,
) -> MfuResult:
    """Solve for the two unknowns from exactly one of tokens_per_s, mfu, tflops_per_gpu.

    tokens_per_s and mfu need flops_per_token and gpus; tflops_per_gpu needs neither (with both,
    tokens/s comes too)."""
    given = [x is not None for x in (tokens_per_s, mfu, tflops_per_gpu)]
    if sum(given) != 1:
        raise ValueError("give exactly one of tokens_per_s, mfu, tflops_per_gpu")
    if not peak_tflops > 0:
        raise ValueError(f"peak_tflops must be positive, got {peak_tflops}")
    if tflops_per_gpu is not None:
        per_gpu = tflops_per_gpu
    elif flops_per_token is None or gpus is None:
        raise ValueError("tokens_per_s and mfu need flops_per_token and gpus")
    elif tokens_per_s is not None:
        per_gpu = tokens_per_s * flops_per_token / gpus / 1e12
    else:
        assert mfu is not None  # exactly one of the three was given
        per_gpu = peak_tflops * mfu
    tokens = tokens_per_s
    if tokens is None and flops_per_token is not None and gpus is not None:
        tokens = per_gpu * 1e12 * gpus / flops_per_token
    return MfuResult(
        mfu=per_gpu / peak_tflops,
        tokens_per_s=tokens,
        peak_tflops=peak_tflops,
        flops_per_token=flops_per_token,
        model_tflops_per_gpu=per_gpu,
        gpus=gpus,
    )


def add_mfu_arguments(parser: argparse.ArgumentParser) -> None:
    # Each number is checked as it is parsed (diag/runtime/option_types.py): a bad one is one line, exit 2.
    model = parser.add_argument_group("model (FLOPs per token)")
    model.add_argument("--params", metavar="N", type=positive_float, help="non-embedding parameters, e.g. 70e9 (FLOPs/token = 6N)")
    model.add_argument(
        "--model", metavar="PRESET|FILE.toml", help="llama3-8b|llama3-70b|llama3-405b or a [model] file"
    )
    for flag in ("--layers", "--heads", "--head-dim", "--seq-len"):
        model.add_argument(
            flag, metavar="INT", type=positive_int, help="with the other three: adds the attention term 12*L*H*Q*T"
        )
    hw = parser.add_argument_group("hardware")
    hw.add_argument("--gpus", metavar="INT", type=positive_int, help="number of GPUs")
    hw.add_argument("--gpu", metavar="PART", help=f"one of {', '.join(sorted(hardware.PARTS))}, in any case, "
                                                  "or the trace's device name")
    hw.add_argument("--dtype",
                    help="dtype of the peak (default bf16; fp16 on parts without bf16, V100), or a mix of matmul "
                         "FLOPs, e.g. fp8=0.6,bf16=0.4: the effective peak 1 / sum(share / peak)")
    hw.add_argument("--peak-tflops", metavar="X", type=peak_tflops, help="dense peak per GPU, overriding --gpu's")
    target = parser.add_argument_group("known quantity (exactly one)")
    target.add_argument("--tokens-per-s", metavar="X", type=positive_float, help="global training throughput -> prints MFU")
    target.add_argument("--mfu", metavar="F", type=positive_float, help="MFU as a fraction, e.g. 0.40 -> prints tokens/s")
    target.add_argument("--tflops-per-gpu", metavar="X", type=positive_float, help="achieved model TFLOP/s per GPU -> prints MFU")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="json: one object {mfu, tokens_per_s, peak_tflops, flops_per_token} (default text)")


def _model(args: argparse.Namespace) -> ModelSpec | None:
    attention = {
        flag: getattr(args, flag[2:].replace("-", "_"))
        for flag in ("--layers", "--heads", "--head-dim", "--seq-len")
    }
    if args.model is not None:
        if args.params is not None or any(v is not None for v in attention.values()):
            raise BadInput("--model", "give --model, or --params with the attention flags, not both")
        return load_model(args.model)
    if args.params is None:
        if any(v is not None for v in attention.values()):
            raise BadInput("--params", "the attention flags need --params too")
        return None
    given = [flag for flag, v in attention.items() if v is not None]
    if given and len(given) != len(attention):
        missing = [flag for flag in attention if flag not in given]
        raise BadInput(given[0], f"the attention term needs all four flags; missing {' '.join(missing)}")
    layers, heads, head_dim, seq_len = (int(v or 0) for v in attention.values())
    return ModelSpec(args.params, layers, heads, head_dim, seq_len, tokens_per_step=None, name="--params")


def _peak(args: argparse.Namespace) -> tuple[float, str]:
    """Dense peak TFLOP/s per GPU and where it came from."""
    if args.peak_tflops is not None:
        return args.peak_tflops, "--peak-tflops"
    if args.gpu is None:
        raise BadInput("--gpu", f"give --gpu ({', '.join(sorted(hardware.PARTS))}) or --peak-tflops")
    try:
        part = hardware.resolve_part(args.gpu).part   # cli.main said what an ambiguous name was taken to be
    except ValueError as error:
        raise BadInput("--gpu", str(error)) from None
    shares = _dtype_shares(args.dtype or hardware.default_dtype(part))
    try:
        peak = hardware.effective_peak_tflops(part, shares)
    except ValueError as error:
        raise BadInput("--dtype", str(error)) from None
    if len(shares) == 1:
        return peak, f"{part.name} {next(iter(shares))} dense"
    mix = ", ".join(f"{d} {s:.0%}" for d, s in shares.items())
    return peak, f"{part.name} effective peak of the dense peaks by matmul FLOPs: {mix}"


def _dtype_shares(text: str) -> dict[str, float]:
    """--dtype: 'bf16', or 'fp8=0.6,bf16=0.4' (shares of matmul FLOPs, summing to 1), or ratios
    'fp8=3,bf16=2' (normalized)."""
    if "=" not in text:
        return {text.strip(): 1.0}
    shares: dict[str, float] = {}
    for item in text.split(","):
        dtype, _, share = item.partition("=")
        try:
            value = positive_float(share.strip())
        except argparse.ArgumentTypeError as error:
            raise BadInput("--dtype", f"{dtype.strip() or 'a share'}: {error}; expected DTYPE=SHARE,..., "
                                      f"e.g. fp8=0.6,bf16=0.4; got {text!r}") from None
        if not dtype.strip():
            raise BadInput("--dtype", f"expected DTYPE=SHARE,..., e.g. fp8=0.6,bf16=0.4; got {text!r}")
        shares[dtype.strip()] = value
    total = sum(shares.values())
    # Shares written as fractions (each ≤ 1) must add up to 1: fp8=0.6,bf16=0.6 is a slip, not a
    # 50/50 mix. Larger numbers are ratios (fp8=2,bf16=1), normalized as documented.
    if all(v <= 1 for v in shares.values()) and abs(total - 1) > 0.01:
        raise BadInput("--dtype", f"shares {text!r} add up to {total:g}, not 1: give fractions of the matmul FLOPs "
                                  "that sum to 1 (fp8=0.6,bf16=0.4), or ratios (fp8=3,bf16=2)")
    return {d: v / total for d, v in shares.items()}


def _sparse_warning(peak_tflops: float, dtype: str) -> str | None:
    matches = hardware.sparse_peak_matches(peak_tflops, dtype=dtype)
    if not matches:
        return None
    part, dt = matches[0]
    return (
        f"warning: {number(peak_tflops)} TFLOP/s is {part.name}'s {dt} peak *with sparsity*; its dense peak is "
        f"{hardware.dense_peak_tflops(part, dt):g}, and MFU against the sparse figure is halved (MFU007)"
    )


def run_mfu(args: argparse.Namespace) -> int:
    """Print the result (text or JSON) on stdout; raise BadInput for bad input."""
    model = _model(args)
    peak, peak_source = _peak(args)
    known = {
        flag: getattr(args, flag[2:].replace("-", "_"))
        for flag in ("--tokens-per-s", "--mfu", "--tflops-per-gpu")
    }
    given = [flag for flag, v in known.items() if v is not None]
    if len(given) != 1:
        raise BadInput("diag mfu", "give exactly one of --tokens-per-s, --mfu, --tflops-per-gpu")
    if given[0] != "--tflops-per-gpu":
        if model is None:
            raise BadInput(given[0], "needs --params (or --model) for FLOPs per token")
        if args.gpus is None:
            raise BadInput(given[0], "needs --gpus")
    mfu = known["--mfu"]
    if mfu is not None and mfu > 1:
        raise BadInput("--mfu", f"is a fraction of the peak, e.g. 0.40; got {args.mfu}")
    result = solve_mfu(
        peak_tflops=peak,
        flops_per_token=flops_per_token(model) if model is not None else None,
        gpus=args.gpus,
        tokens_per_s=known["--tokens-per-s"],
        mfu=mfu,
        tflops_per_gpu=known["--tflops-per-gpu"],
    )
    if result.mfu > 1:
        # More model FLOP/s than the GPUs can do at their dense peak: the inputs contradict each other.
        raise BadInput(given[0], f"{number(known[given[0]])} is implausible: it means "
                                 f"{result.model_tflops_per_gpu:,.0f} model TFLOP/s per GPU, {result.mfu * 100:,.0f}% of "
                                 f"the {number(peak)} TFLOP/s peak ({peak_source}); check it against the model, "
                                 "--gpus and the peak")
    warning = None
    if peak_source == "--peak-tflops":
        dominant = max(_dtype_shares(args.dtype or "bf16").items(), key=lambda x: x[1])[0]
        warning = _sparse_warning(peak, dominant)
    if warning:
        print(warning, file=sys.stderr)
    if args.format == "json":
        print(json.dumps(result.to_json()))
    else:
        print(render_text(result, peak_source, model))
    return ExitCode.OK


def render_text(result: MfuResult, peak_source: str, model: ModelSpec | None) -> str:
    lines = [f"MFU            {significant(100 * result.mfu)}%"]
    if result.tokens_per_s is not None:
        lines.append(f"tokens/s       {result.tokens_per_s:,.0f}")
    if result.flops_per_token is not None and model is not None:
        term = "6N + 12LHQT" if model.layers else "6N; --layers --heads --head-dim --seq-len add attention"
        lines.append(f"FLOPs/token    {significant(result.flops_per_token, 4)}  ({term})")
    lines.append(f"model TFLOP/s  {result.model_tflops_per_gpu:,.1f} per GPU")
    lines.append(f"peak           {number(result.peak_tflops)} TFLOP/s per GPU ({peak_source})")
    if result.gpus is not None:
        lines.append(f"GPUs           {result.gpus:,}")
    return "\n".join(lines)
