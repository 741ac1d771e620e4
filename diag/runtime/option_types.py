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


def non_negative_int(text: str) -> int:
    """A whole number ≥ 0: a rank."""
    value = _float(text)
    if not (math.isfinite(value) and value.is_integer() and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 0, got {text!r}")
    return int(value)
