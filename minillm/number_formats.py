"""Floating-point formats as bit fields: sign, exponent, mantissa.

A binary floating-point format with ``e`` exponent bits and ``m`` mantissa bits stores

    normal     (exponent field E >= 1):  (-1)^s x 2^(E - bias) x (1 + M / 2^m)
    subnormal  (exponent field E == 0):  (-1)^s x 2^(1 - bias) x (M / 2^m)

with ``bias = 2^(e-1) - 1``. IEEE-like formats (FP32, FP16, BF16, FP8 E5M2) reserve the
all-ones exponent for infinities and NaNs. FP8 E4M3 in its "FN" flavour (finite, one NaN
pattern per sign; ``torch.float8_e4m3fn``) has no infinities and spends the all-ones
exponent on ordinary numbers, so its largest value is 448 instead of 240.

More exponent bits buy range; more mantissa bits buy precision: between two powers of two
there are ``2^m`` evenly spaced values, so neighbours differ by ``2^-m`` relative.
Chapter 02 of the course draws, measures and uses these formats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FloatFormat:
    """The bit layout of a floating-point format and the PyTorch dtype that stores it."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    dtype: torch.dtype
    finite_only: bool = False  # True for E4M3FN: no infinities, the all-ones exponent is data

    @property
    def bits(self) -> int:
        """Total width: one sign bit, the exponent, the mantissa."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        """Stored exponent minus true exponent: 127 for FP32/BF16, 15 for FP16, 7 for E4M3."""
        return 2 ** (self.exponent_bits - 1) - 1


FORMATS = {
    "fp32": FloatFormat("fp32", 8, 23, torch.float32),
    "fp16": FloatFormat("fp16", 5, 10, torch.float16),
    "bf16": FloatFormat("bf16", 8, 7, torch.bfloat16),
    "fp8 e5m2": FloatFormat("fp8 e5m2", 5, 2, torch.float8_e5m2),
    "fp8 e4m3": FloatFormat("fp8 e4m3", 4, 3, torch.float8_e4m3fn, finite_only=True),
}

_SAME_WIDTH_INT = {32: torch.int32, 16: torch.int16, 8: torch.uint8}  # for .view()
_WIDER_INT = {32: torch.int64, 16: torch.int32, 8: torch.int32}  # room for unsigned patterns


def bit_pattern(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """The stored bits of ``x`` rounded to ``fmt`` by PyTorch, as non-negative integers."""
    raw = x.to(fmt.dtype).view(_SAME_WIDTH_INT[fmt.bits]).to(_WIDER_INT[fmt.bits])
    return raw & (2**fmt.bits - 1)  # two's complement -> the unsigned bit pattern


def bit_fields(x: torch.Tensor, fmt: FloatFormat) -> tuple[torch.Tensor, ...]:
    """(sign, exponent, mantissa) integer fields of ``x`` rounded to ``fmt`` by PyTorch."""
    raw = bit_pattern(x, fmt)
    mantissa = raw & (2**fmt.mantissa_bits - 1)
    exponent = (raw >> fmt.mantissa_bits) & (2**fmt.exponent_bits - 1)
    sign = raw >> (fmt.bits - 1)
    return sign, exponent, mantissa


def bit_string(value: float, fmt: FloatFormat) -> str:
    """'s eeeee mmmmmmmmmm': the bits of ``value`` in ``fmt``, fields separated by spaces."""
    sign, exponent, mantissa = (int(f) for f in bit_fields(torch.tensor([value]), fmt))
    return f"{sign} {exponent:0{fmt.exponent_bits}b} {mantissa:0{fmt.mantissa_bits}b}"


def decode(sign: int, exponent: int, mantissa: int, fmt: FloatFormat) -> float:
    """The value that the fields (sign, exponent, mantissa) encode in ``fmt``.

    Reserved patterns decode to inf or nan: the all-ones exponent in IEEE-like formats,
    and only the all-ones exponent *and* mantissa in finite-only E4M3FN.
    """
    top_exponent = 2**fmt.exponent_bits - 1
    top_mantissa = 2**fmt.mantissa_bits - 1
    sign_factor = -1.0 if sign else 1.0
    if exponent == top_exponent and not fmt.finite_only:
        return sign_factor * math.inf if mantissa == 0 else math.nan
    if fmt.finite_only and exponent == top_exponent and mantissa == top_mantissa:
        return math.nan
    fraction = mantissa / 2**fmt.mantissa_bits
    if exponent == 0:  # subnormal (or zero): no implicit leading 1, exponent pinned at 1 - bias
        return sign_factor * 2.0 ** (1 - fmt.bias) * fraction
    return sign_factor * 2.0 ** (exponent - fmt.bias) * (1 + fraction)


def spacing(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Gap between ``|x|`` (a finite value) and the next larger number of ``fmt`` (float64).

    In the binade [2^k, 2^(k+1)) the gap is 2^(k - m): it doubles with every power of two,
    so the *relative* gap stays between 2^-(m+1) and 2^-m. Below the smallest normal
    number the subnormals are evenly spaced by 2^(1 - bias - m).
    """
    magnitude = x.double().abs()
    _, exponent = torch.frexp(magnitude)  # |x| = f * 2^exponent with 0.5 <= f < 1
    binade = torch.where(magnitude > 0, exponent - 1, 1 - fmt.bias).clamp(min=1 - fmt.bias)
    return 2.0 ** (binade - fmt.mantissa_bits).double()


def neighbours(x: torch.Tensor, fmt: FloatFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """The representable numbers of ``fmt`` nearest to ``x`` from below and above (float64).

    ``below <= x <= above``, both equal to ``x`` when it is representable. Past the
    largest finite value the outer neighbour is ±inf. Rounding to nearest picks whichever
    is closer (on a tie, the one whose mantissa is even).
    """
    magnitude = x.double().abs()
    gap = spacing(magnitude, fmt)
    lower = torch.floor(magnitude / gap) * gap  # exact: dividing by a power of two
    upper = torch.ceil(magnitude / gap) * gap
    largest = torch.finfo(fmt.dtype).max
    lower = lower.clamp(max=largest)
    upper = torch.where(upper > largest, math.inf, upper)
    negative = x < 0
    return torch.where(negative, -upper, lower), torch.where(negative, -lower, upper)


def representable_values(fmt: FloatFormat) -> torch.Tensor:
    """Every finite value of an 8- or 16-bit ``fmt``, sorted, as float64 (zero once)."""
    if fmt.bits > 16:
        raise ValueError(f"{fmt.name} has 2^{fmt.bits} values; enumerate 8- or 16-bit formats")
    codes = torch.arange(2**fmt.bits, dtype=torch.int32)
    if fmt.bits == 16:
        codes = torch.where(codes >= 2**15, codes - 2**16, codes)  # as signed int16
    values = codes.to(_SAME_WIDTH_INT[fmt.bits]).view(fmt.dtype).double()
    return torch.unique(values[torch.isfinite(values)])
