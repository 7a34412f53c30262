"""Graded tests for chapter 02 (number formats). PyTorch's own casts are the oracle."""

from __future__ import annotations

import pytest
import torch

from minillm.grading import load_impl
from minillm.number_formats import FORMATS, bit_fields

impl = load_impl("ch02_number_formats")
IEEE_LIKE = ["fp32", "fp16", "bf16", "fp8 e5m2"]


@pytest.mark.exercise("02.1", points=2)
@pytest.mark.parametrize("name", IEEE_LIKE)
def test_float_fields_match_the_bits_pytorch_stores(name):
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(1)
    values = torch.cat([torch.randn(40, generator=g) * 10, torch.tensor([0.0, -0.0, 1.0, -1.5])])
    tiny = torch.finfo(fmt.dtype).smallest_normal
    values = torch.cat([values, torch.tensor([tiny, tiny / 4, -tiny * 3])])  # subnormals too
    exact = values.to(fmt.dtype).double()
    sign, exponent, mantissa = bit_fields(exact, fmt)
    for i, value in enumerate(exact.tolist()):
        expected = (int(sign[i]), int(exponent[i]), int(mantissa[i]))
        assert impl.float_fields(value, fmt.exponent_bits, fmt.mantissa_bits) == expected, value


@pytest.mark.exercise("02.2", points=2)
@pytest.mark.parametrize("name", IEEE_LIKE)
def test_format_limits_match_torch_finfo(name):
    fmt = FORMATS[name]
    info = torch.finfo(fmt.dtype)
    got = impl.format_limits(fmt.exponent_bits, fmt.mantissa_bits)
    assert got["max"] == info.max
    assert got["min_normal"] == info.smallest_normal
    assert got["eps"] == info.eps
    smallest = torch.tensor(got["min_subnormal"], dtype=torch.float64)
    assert smallest.to(fmt.dtype).double() == smallest  # representable...
    assert (smallest * 0.49).to(fmt.dtype).double() == 0  # ...and nothing smaller is


@pytest.mark.exercise("02.3", points=3)
def test_round_to_bfloat16_matches_pytorch():
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(10_000, generator=g) * 100, torch.randn(1000, generator=g) * 1e-30,
                   torch.tensor([0.0, -0.0, 3.0e38, -3.0e38, float("inf"), float("-inf")])])
    torch.testing.assert_close(impl.round_to_bfloat16(x), x.to(torch.bfloat16).float(),
                               rtol=0, atol=0)


@pytest.mark.exercise("02.3", points=1)
def test_round_to_bfloat16_breaks_ties_to_even():
    base = torch.tensor([1.0, 1.0078125])  # bf16 neighbours 2**-7 apart: even, odd mantissa
    half_way = base + 2.0**-8  # exactly between two bfloat16 values
    assert impl.round_to_bfloat16(half_way).tolist() == [1.0, 1.015625]
