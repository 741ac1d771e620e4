"""Option values checked as argparse parses them, so a bad one stops the command before any work,
with one line naming the option and the value (cli.DiagParser prints it, exit 2)."""

from __future__ import annotations

import argparse
import math
import re

# What argparse must take as a value, not an option: `--peak-tflops -1`, `--params -7e9`,
# `--gpus -inf`. Its own pattern (`-1`, `-.5`) misses exponents and inf/nan, which then read as
# an unknown option instead of a bad value.
NEGATIVE_NUMBER = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive_float(text: str) -> float:
    """A finite number > 0: a peak, a token count, a time."""
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A whole number ≥ 1 (`8`, or `64e6` for a byte count)."""
    value = _float(text)
    if not (math.isfinite(value) and value.is_integer() and value >= 1):
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, got {text!r}")
    return int(value)


# A GPU's dense peak: the largest in diag/knowledge/data/parts.toml are a few thousand TFLOP/s
# (fp8/fp4 on Blackwell); 10^5 leaves room for parts to come and refuses a slip of the exponent
# (`1e30` printed MFU 0.000…045%).
MAX_PEAK_TFLOPS = 1e5
# Parse workers: one a core, and no machine diag runs on has more than this many.
MAX_JOBS = 1024


def peak_tflops(text: str) -> float:
    """--peak-tflops: a finite number > 0 and ≤ MAX_PEAK_TFLOPS."""
    value = positive_float(text)
    if value > MAX_PEAK_TFLOPS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_PEAK_TFLOPS:g} TFLOP/s (a GPU's dense peak), "
                                         f"got {text!r}")
    return value


def jobs(text: str) -> int:
    """--jobs: a whole number from 1 to MAX_JOBS."""
    value = positive_int(text)
    if value > MAX_JOBS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_JOBS} (one worker a core), got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number ≥ 0 written in digits (a rank: `1e3` is a slip, not rank 1000), below 2^31."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 10 and int(digits) < 2**31):
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 0 in digits, below 2^31, got {text!r}")
    return int(digits)
