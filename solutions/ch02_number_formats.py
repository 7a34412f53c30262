"""Chapter 02: number formats — bit fields, range vs precision, rounding to bfloat16."""

from __future__ import annotations

import math

import torch


def float_fields(x: float, exponent_bits: int, mantissa_bits: int) -> tuple[int, int, int]:
    """Exercise 02.1: Return (sign, exponent, mantissa) fields of x in an IEEE-like format.

    x is exactly representable in the format (a normal or subnormal number, not inf/nan).
    bias = 2**(exponent_bits - 1) - 1. Normal: x = ±2**(E - bias) * (1 + M / 2**mantissa_bits)
    with 1 <= E; subnormal and zero: E = 0 and x = ±2**(1 - bias) * M / 2**mantissa_bits.
    Hint: math.frexp(abs(x)) returns (f, e) with abs(x) = f * 2**e and 0.5 <= f < 1.
    """
    ### BEGIN SOLUTION
    bias = 2 ** (exponent_bits - 1) - 1
    sign = 1 if math.copysign(1.0, x) < 0 else 0
    magnitude = abs(x)
    if magnitude == 0:
        return sign, 0, 0
    fraction, exponent = math.frexp(magnitude)  # magnitude = fraction * 2**exponent
    biased = exponent - 1 + bias
    if biased >= 1:  # normal: magnitude = 2**(biased - bias) * (1 + M / 2**m)
        mantissa = round((2 * fraction - 1) * 2**mantissa_bits)
        return sign, biased, mantissa
    mantissa = round(magnitude / 2 ** (1 - bias) * 2**mantissa_bits)
    return sign, 0, mantissa
    ### END SOLUTION


def format_limits(exponent_bits: int, mantissa_bits: int) -> dict[str, float]:
    """Exercise 02.2: The range and precision of an IEEE-like format (with infinities).

    Return {"max": largest finite value, "min_normal": smallest positive normal,
    "min_subnormal": smallest positive subnormal, "eps": gap between 1 and the next value}.
    The all-ones exponent is reserved for inf/nan, so the largest exponent field is
    2**exponent_bits - 2. Check yourself: fp16 (5, 10) has max 65504 and eps 2**-10.
    """
    ### BEGIN SOLUTION
    bias = 2 ** (exponent_bits - 1) - 1
    largest_exponent = (2**exponent_bits - 2) - bias
    return {
        "max": (2 - 2.0**-mantissa_bits) * 2.0**largest_exponent,
        "min_normal": 2.0 ** (1 - bias),
        "min_subnormal": 2.0 ** (1 - bias - mantissa_bits),
        "eps": 2.0**-mantissa_bits,
    }
    ### END SOLUTION


def round_to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    """Exercise 02.3: Round float32 values to bfloat16 precision with integer operations.

    bfloat16 is the top 16 bits of a float32. Round to nearest, ties to even: add
    0x7FFF + (bit 16 of the pattern) to the 32-bit pattern, then clear the low 16 bits.
    x: float32 tensor (no NaNs). Returns a float32 tensor equal to
    x.to(torch.bfloat16).to(torch.float32), computed without those conversions.
    Hint: x.view(torch.int32) reinterprets the bits; do the arithmetic in int64 to avoid
    overflow, mask with 0xFFFFFFFF, and bring the pattern back to int32 before .view(float32).
    """
    ### BEGIN SOLUTION
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    signed = torch.where(rounded >= 2**31, rounded - 2**32, rounded)
    return signed.to(torch.int32).view(torch.float32)
    ### END SOLUTION
