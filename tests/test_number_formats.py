"""Bit fields, spacing and neighbours of floating-point formats, checked against PyTorch."""

from __future__ import annotations

import math

import pytest
import torch

from minillm.number_formats import (
    FORMATS,
    bit_fields,
    bit_pattern,
    bit_string,
    decode,
    neighbours,
    representable_values,
    spacing,
)

SMALL_FORMATS = [name for name, fmt in FORMATS.items() if fmt.bits <= 16]


def random_values(n: int = 2000, seed: int = 0) -> torch.Tensor:
    """Values spread over many binades, both signs: normal and log-uniform magnitudes."""
    g = torch.Generator().manual_seed(seed)
    log_uniform = torch.exp(torch.empty(n).uniform_(-30, 30, generator=g))
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    return torch.cat([torch.randn(n, generator=g) * 3, signs * log_uniform]).double()


@pytest.mark.parametrize("name", list(FORMATS))
def test_layout_matches_the_dtype(name):
    fmt = FORMATS[name]
    info = torch.finfo(fmt.dtype)
    assert fmt.bits == info.bits
    assert info.eps == 2.0**-fmt.mantissa_bits
    assert info.smallest_normal == 2.0 ** (1 - fmt.bias)


@pytest.mark.parametrize("name", list(FORMATS))
def test_fields_decode_back_to_the_value(name):
    fmt = FORMATS[name]
    x = random_values()
    rounded = x.to(fmt.dtype).double()
    sign, exponent, mantissa = bit_fields(x, fmt)
    decoded = [decode(int(s), int(e), int(m), fmt)
               for s, e, m in zip(sign, exponent, mantissa, strict=True)]
    torch.testing.assert_close(torch.tensor(decoded, dtype=torch.float64), rounded,
                               rtol=0, atol=0, equal_nan=True)


def test_bit_string_of_known_values():
    assert bit_string(1.0, FORMATS["fp32"]) == "0 01111111 " + "0" * 23
    assert bit_string(-2.0, FORMATS["fp16"]) == "1 10000 0000000000"
    assert bit_string(1.0, FORMATS["bf16"]) == "0 01111111 0000000"
    assert bit_string(448.0, FORMATS["fp8 e4m3"]) == "0 1111 110"
    assert bit_string(57344.0, FORMATS["fp8 e5m2"]) == "0 11110 11"


def test_reserved_patterns():
    assert decode(0, 31, 0, FORMATS["fp16"]) == math.inf
    assert decode(1, 31, 0, FORMATS["fp8 e5m2"]) == -math.inf
    assert math.isnan(decode(0, 31, 1, FORMATS["fp16"]))
    assert decode(0, 15, 6, FORMATS["fp8 e4m3"]) == 448.0  # all-ones exponent is data
    assert math.isnan(decode(0, 15, 7, FORMATS["fp8 e4m3"]))  # ... except S.1111.111
    assert int(bit_pattern(torch.tensor([math.nan]), FORMATS["fp8 e4m3"])) & 0x7F == 0x7F


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_spacing_is_the_step_to_the_next_bit_pattern(name):
    fmt = FORMATS[name]
    values = representable_values(fmt)
    positive = values[values >= 0]
    gaps = positive[1:] - positive[:-1]  # consecutive bit patterns for positive numbers
    torch.testing.assert_close(spacing(positive[:-1], fmt), gaps, rtol=0, atol=0)


def test_spacing_of_float32_matches_nextafter():
    x = random_values().float()
    x = x[x.abs() < 1e38]
    step = (torch.nextafter(x.abs(), torch.tensor(math.inf)) - x.abs()).double()
    torch.testing.assert_close(spacing(x, FORMATS["fp32"]), step, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(FORMATS))
def test_neighbours_bracket_and_rounding_picks_the_nearer(name):
    fmt = FORMATS[name]
    x = random_values(seed=1)
    x = x[x.abs() < torch.finfo(fmt.dtype).max]
    below, above = neighbours(x, fmt)
    assert bool((below <= x).all()) and bool((x <= above).all())
    rounded = x.to(fmt.dtype).double()
    assert bool(((rounded == below) | (rounded == above)).all())
    nearer = torch.minimum(x - below, above - x)
    assert bool(((rounded - x).abs() == nearer).all())


def test_neighbours_past_the_largest_value():
    fmt = FORMATS["fp16"]
    below, above = neighbours(torch.tensor([7e4, -7e4]), fmt)
    assert below.tolist() == [65504.0, -math.inf]
    assert above.tolist() == [math.inf, -65504.0]


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_representable_values_span_finfo(name):
    fmt = FORMATS[name]
    info = torch.finfo(fmt.dtype)
    values = representable_values(fmt)
    assert values.max() == info.max and values.min() == -info.max
    assert values[values > 0].min() == info.smallest_normal * info.eps  # smallest subnormal
    one = int((values == 1).nonzero())
    assert values[one + 1] - 1 == info.eps
    reserved = 2 if fmt.finite_only else 2 * 2**fmt.mantissa_bits  # NaNs (and infinities)
    assert len(values) == 2**fmt.bits - reserved - 1  # +0 and -0 counted once


def test_representable_values_refuses_fp32():
    with pytest.raises(ValueError, match="8- or 16-bit"):
        representable_values(FORMATS["fp32"])
