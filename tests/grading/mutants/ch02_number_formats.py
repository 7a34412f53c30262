"""Plausible wrong answers to chapter 02 (number formats); the graded tests must catch each
one. Each mutant replaces the solution function named before its ``__``."""

import math

import torch


def float_fields__no_subnormals(x, exponent_bits, mantissa_bits):
    """Treats every non-zero number as normal (an implicit leading 1 even below 2^(1-bias))."""
    bias = 2 ** (exponent_bits - 1) - 1
    sign = 1 if math.copysign(1.0, x) < 0 else 0
    if x == 0:
        return sign, 0, 0
    fraction, exponent = math.frexp(abs(x))
    return sign, exponent - 1 + bias, round((2 * fraction - 1) * 2**mantissa_bits)


def float_fields__sign_from_comparison(x, exponent_bits, mantissa_bits):
    """Takes the sign from x < 0, so -0.0 gets sign 0."""
    bias = 2 ** (exponent_bits - 1) - 1
    sign = 1 if x < 0 else 0
    magnitude = abs(x)
    if magnitude == 0:
        return sign, 0, 0
    fraction, exponent = math.frexp(magnitude)
    biased = exponent - 1 + bias
    if biased >= 1:
        return sign, biased, round((2 * fraction - 1) * 2**mantissa_bits)
    return sign, 0, round(magnitude / 2.0 ** (1 - bias - mantissa_bits))


def float_fields__subnormal_scale_off_by_one(x, exponent_bits, mantissa_bits):
    """Scales subnormals by 2^(-bias - m) instead of 2^(1 - bias - m)."""
    bias = 2 ** (exponent_bits - 1) - 1
    sign = 1 if math.copysign(1.0, x) < 0 else 0
    magnitude = abs(x)
    if magnitude == 0:
        return sign, 0, 0
    fraction, exponent = math.frexp(magnitude)
    biased = exponent - 1 + bias
    if biased >= 1:
        return sign, biased, round((2 * fraction - 1) * 2**mantissa_bits)
    return sign, 0, round(magnitude / 2.0 ** (-bias - mantissa_bits))


def format_limits__all_ones_exponent(exponent_bits, mantissa_bits):
    """Lets the all-ones exponent field hold finite numbers (max is twice too large)."""
    bias = 2 ** (exponent_bits - 1) - 1
    return {"max": (2 - 2.0**-mantissa_bits) * 2.0 ** (2**exponent_bits - 1 - bias),
            "min_normal": 2.0 ** (1 - bias),
            "min_subnormal": 2.0 ** (1 - bias - mantissa_bits),
            "eps": 2.0**-mantissa_bits}


def format_limits__eps_half_gap(exponent_bits, mantissa_bits):
    """Gives eps as half the gap above 1.0 (the rounding error, not the gap)."""
    bias = 2 ** (exponent_bits - 1) - 1
    return {"max": (2 - 2.0**-mantissa_bits) * 2.0 ** (2**exponent_bits - 2 - bias),
            "min_normal": 2.0 ** (1 - bias),
            "min_subnormal": 2.0 ** (1 - bias - mantissa_bits),
            "eps": 2.0 ** -(mantissa_bits + 1)}


def format_limits__min_normal_exponent_zero(exponent_bits, mantissa_bits):
    """Takes the smallest normal at exponent field 0 (2^-bias) instead of field 1."""
    bias = 2 ** (exponent_bits - 1) - 1
    return {"max": (2 - 2.0**-mantissa_bits) * 2.0 ** (2**exponent_bits - 2 - bias),
            "min_normal": 2.0**-bias,
            "min_subnormal": 2.0 ** (-bias - mantissa_bits),
            "eps": 2.0**-mantissa_bits}


def round_to_bfloat16__truncates(x):
    """Clears the low 16 bits without rounding (rounds toward zero)."""
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    kept = bits & 0xFFFF0000
    return torch.where(kept >= 2**31, kept - 2**32, kept).to(torch.int32).view(torch.float32)


def round_to_bfloat16__ties_away(x):
    """Adds 0x8000: rounds halves away from zero instead of to even."""
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0x8000) & 0xFFFF0000
    return torch.where(rounded >= 2**31, rounded - 2**32, rounded).to(torch.int32).view(
        torch.float32)


def round_to_bfloat16__in_place(x):
    """Rounds the bits of x in place and returns x itself, changing the caller's tensor."""
    bits = x.view(torch.int32)
    bits.add_(0x7FFF + ((bits >> 16) & 1)).bitwise_and_(~0xFFFF)
    return x


def relative_matmul_error__float64_product(a, b, dtype):
    """Multiplies the rounded inputs in float64, hiding float32's accumulation error."""
    reference = a.double() @ b.double()
    approximate = a.to(dtype).double() @ b.to(dtype).double()
    return (torch.linalg.norm(approximate - reference) / torch.linalg.norm(reference)).item()


def relative_matmul_error__returns_tensor(a, b, dtype):
    """Returns a 0-d tensor instead of a Python float."""
    reference = a.double() @ b.double()
    approximate = a.to(dtype).float() @ b.to(dtype).float()
    return torch.linalg.norm(approximate.double() - reference) / torch.linalg.norm(reference)


def relative_matmul_error__max_norm(a, b, dtype):
    """Compares the largest entries instead of Frobenius norms."""
    reference = a.double() @ b.double()
    approximate = a.to(dtype).float() @ b.to(dtype).float()
    return ((approximate.double() - reference).abs().max() / reference.abs().max()).item()
