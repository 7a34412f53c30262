"""Chapter 02: number formats — bit fields, range vs precision, rounding, matmul error."""

from __future__ import annotations

import math

import torch


def float_fields(x: float, exponent_bits: int, mantissa_bits: int) -> tuple[int, int, int]:
    """Exercise 02.1: Return the (sign, exponent, mantissa) bit fields of x in a float format.

    The format has 1 sign bit, `exponent_bits` exponent bits and `mantissa_bits` mantissa
    bits, with bias = 2**(exponent_bits - 1) - 1. x is exactly representable in it (a
    normal or subnormal number or zero; not inf or nan). Return plain ints (S, E, M) with
      normal numbers (E >= 1):      x = (-1)**S * 2**(E - bias) * (1 + M / 2**mantissa_bits)
      subnormals and zero (E == 0): x = (-1)**S * 2**(1 - bias) * (M / 2**mantissa_bits)
    -0.0 has sign 1. Example: 1.5 in FP16 (5, 10) is (0, 15, 512).
    Hint: math.frexp(abs(x)) returns (f, e) with abs(x) = f * 2**e and 0.5 <= f < 1;
    math.copysign(1.0, x) tells -0.0 from 0.0.
    """
    ### BEGIN SOLUTION
    bias = 2 ** (exponent_bits - 1) - 1
    sign = 1 if math.copysign(1.0, x) < 0 else 0
    magnitude = abs(x)
    if magnitude == 0:
        return sign, 0, 0
    fraction, exponent = math.frexp(magnitude)  # magnitude = (2 * fraction) * 2**(exponent - 1)
    biased = exponent - 1 + bias
    if biased >= 1:  # normal: the leading 1 of 2 * fraction is implicit
        return sign, biased, round((2 * fraction - 1) * 2**mantissa_bits)
    return sign, 0, round(magnitude / 2.0 ** (1 - bias - mantissa_bits))  # subnormal
    ### END SOLUTION


def format_limits(exponent_bits: int, mantissa_bits: int) -> dict[str, float]:
    """Exercise 02.2: Return the range and precision of an IEEE-like binary float format.

    IEEE-like: the all-ones exponent field is reserved for inf and nan, so the largest
    exponent field of a finite number is 2**exponent_bits - 2. Return a dict of floats:
      "max":           the largest finite value (all mantissa bits set),
      "min_normal":    the smallest positive normal value (exponent field 1, mantissa 0),
      "min_subnormal": the smallest positive subnormal value (exponent field 0, mantissa 1),
      "eps":           the gap between 1.0 and the next larger value.
    Check yourself: FP16 (5, 10) has max 65504, min_normal 2**-14 and eps 2**-10.
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
    """Exercise 02.3: Round float32 values to bfloat16 with integer operations on their bits.

    x: a float32 tensor of any shape, without NaNs (NaN handling is out of scope).
    Returns a NEW float32 tensor equal to x.to(torch.bfloat16).to(torch.float32), computed
    without those conversions. bfloat16 keeps the top 16 bits of a float32 pattern, so
    rounding to nearest (ties to even) is integer arithmetic on the 32-bit pattern: add
    0x7FFF plus bit 16 (the lowest kept bit), then clear the low 16 bits. A carry out of
    the mantissa correctly bumps the exponent (and past the largest value, gives inf).
    Hint: x.view(torch.int32) reinterprets the bits without changing them. Do the
    arithmetic in int64 on `bits & 0xFFFFFFFF` (the pattern as an unsigned number), then
    bring it back into int32's range (subtract 2**32 where it is >= 2**31) before
    .to(torch.int32).view(torch.float32).
    """
    ### BEGIN SOLUTION
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    lowest_kept_bit = (bits >> 16) & 1
    rounded = (bits + 0x7FFF + lowest_kept_bit) & 0xFFFF0000
    signed = torch.where(rounded >= 2**31, rounded - 2**32, rounded)
    return signed.to(torch.int32).view(torch.float32)
    ### END SOLUTION


def relative_matmul_error(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> float:
    """Exercise 02.4: Return the relative error of a @ b when the inputs are stored in dtype.

    a: [M, K] and b: [K, N], float32. Round both inputs to `dtype` (e.g. torch.bfloat16 or
    torch.float8_e4m3fn), convert them back to float32 and multiply in float32: the
    products are accumulated in FP32, as GPU tensor cores do for 16- and 8-bit inputs.
    The reference is the product of the ORIGINAL inputs in float64. Return
        ||C - C_ref||_F / ||C_ref||_F      (Frobenius norms, as a Python float)
    With dtype=torch.float32 the inputs are unchanged and what remains is float32's own
    accumulation error (around 1e-7), which must not be zero: do not multiply in float64.
    Hint: torch.linalg.norm of a matrix is its Frobenius norm.
    """
    ### BEGIN SOLUTION
    reference = a.double() @ b.double()
    approximate = a.to(dtype).float() @ b.to(dtype).float()
    error = torch.linalg.norm(approximate.double() - reference) / torch.linalg.norm(reference)
    return error.item()
    ### END SOLUTION
