"""Bit fields of floating-point formats, checked against values PyTorch rounds to."""

from __future__ import annotations

import pytest
import torch

from minillm.number_formats import FORMATS, bit_fields, bit_string


@pytest.mark.parametrize("name", list(FORMATS))
def test_fields_decode_back_to_the_value(name):
    fmt = FORMATS[name]
    x = torch.randn(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    rounded = x.to(fmt.dtype).double()
    sign, exponent, mantissa = (f.double() for f in bit_fields(x, fmt))
    normal = exponent > 0
    scale = torch.where(normal, 2.0 ** (exponent - fmt.bias), 2.0 ** (1 - fmt.bias))
    value = (1 - 2 * sign) * scale * (normal.double() + mantissa / 2**fmt.mantissa_bits)
    torch.testing.assert_close(value, rounded, rtol=0, atol=0)


def test_bit_string_of_known_values():
    assert bit_string(1.0, FORMATS["fp32"]) == "0 01111111 " + "0" * 23
    assert bit_string(-2.0, FORMATS["fp16"]) == "1 10000 0000000000"
    assert bit_string(448.0, FORMATS["fp8 e4m3"]) == "0 1111 110"
