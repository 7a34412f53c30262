"""Floating-point formats as bit fields: sign, exponent, mantissa.

A binary floating-point number with ``e`` exponent bits and ``m`` mantissa bits stores

    value = (-1)^sign x 2^(exponent - bias) x (1 + mantissa / 2^m),   bias = 2^(e-1) - 1

for normal numbers (exponent field not all zeros), and ``2^(1 - bias) x mantissa / 2^m``
for subnormals (exponent field 0). More exponent bits buy range; more mantissa bits buy
precision (the gap between neighbours is ``2^-m`` relative). Used by chapter 02.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FloatFormat:
    name: str
    exponent_bits: int
    mantissa_bits: int
    dtype: torch.dtype

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1


FORMATS = {
    "fp32": FloatFormat("fp32", 8, 23, torch.float32),
    "fp16": FloatFormat("fp16", 5, 10, torch.float16),
    "bf16": FloatFormat("bf16", 8, 7, torch.bfloat16),
    "fp8 e5m2": FloatFormat("fp8 e5m2", 5, 2, torch.float8_e5m2),
    "fp8 e4m3": FloatFormat("fp8 e4m3", 4, 3, torch.float8_e4m3fn),  # no infinities: max 448
}

_UNSIGNED = {32: torch.int64, 16: torch.int32, 8: torch.int16}
_SAME_WIDTH_INT = {32: torch.int32, 16: torch.int16, 8: torch.uint8}


def bit_fields(x: torch.Tensor, fmt: FloatFormat) -> tuple[torch.Tensor, ...]:
    """(sign, exponent, mantissa) integer fields of ``x`` rounded to ``fmt`` by PyTorch."""
    raw = x.to(fmt.dtype).view(_SAME_WIDTH_INT[fmt.bits]).to(_UNSIGNED[fmt.bits])
    raw = raw & (2**fmt.bits - 1)  # two's complement -> the unsigned bit pattern
    mantissa = raw & (2**fmt.mantissa_bits - 1)
    exponent = (raw >> fmt.mantissa_bits) & (2**fmt.exponent_bits - 1)
    sign = raw >> (fmt.bits - 1)
    return sign, exponent, mantissa


def bit_string(value: float, fmt: FloatFormat) -> str:
    """'s eeeee mmmmmmmmmm': the bits of ``value`` in ``fmt``, fields separated by spaces."""
    sign, exponent, mantissa = (int(f) for f in bit_fields(torch.tensor([value]), fmt))
    return (f"{sign} {exponent:0{fmt.exponent_bits}b} {mantissa:0{fmt.mantissa_bits}b}")
