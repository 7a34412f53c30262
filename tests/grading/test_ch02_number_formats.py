"""Graded tests for chapter 02 (number formats). PyTorch's own dtypes are the oracle."""

from __future__ import annotations

import pytest
import torch

from minillm.grading import load_impl
from minillm.number_formats import FORMATS, FloatFormat, bit_fields

impl = load_impl("ch02_number_formats")
FP64 = FloatFormat("fp64", 11, 52, torch.float64)
IEEE_LIKE = ["fp32", "fp16", "bf16", "fp8 e5m2"]


def exactly_representable(fmt: FloatFormat, seed: int) -> torch.Tensor:
    """Float64 values that ``fmt`` stores exactly: random ones, zeros, extremes, subnormals."""
    g = torch.Generator().manual_seed(seed)
    info = torch.finfo(fmt.dtype)
    tiny = info.smallest_normal
    values = torch.cat([
        torch.randn(40, generator=g, dtype=torch.float64) * 10,
        torch.exp(torch.empty(20, dtype=torch.float64).uniform_(-12, 12, generator=g)),
        torch.tensor([0.0, -0.0, 1.0, -1.5, info.max, -info.max, tiny, -tiny]),
        torch.tensor([tiny * info.eps, tiny / 4, -tiny * 0.75, tiny * (1 - info.eps)]),
    ]).clamp(-info.max, info.max)
    return values.to(fmt.dtype).double()


def fields_from_bits(values: torch.Tensor, fmt: FloatFormat) -> list[tuple[int, int, int]]:
    if fmt is FP64:  # float64 is its own container: read the 64-bit pattern directly
        raw = values.view(torch.int64)
        fields = ((raw >> 63) & 1, (raw >> 52) & 0x7FF, raw & (2**52 - 1))
    else:
        fields = bit_fields(values, fmt)
    return [tuple(int(f[i]) for f in fields) for i in range(len(values))]


@pytest.mark.exercise("02.1", points=2)
@pytest.mark.parametrize("name", IEEE_LIKE)
def test_float_fields_match_the_bits_pytorch_stores(name):
    fmt = FORMATS[name]
    values = exactly_representable(fmt, seed=1)
    for value, expected in zip(values.tolist(), fields_from_bits(values, fmt), strict=True):
        got = impl.float_fields(value, fmt.exponent_bits, fmt.mantissa_bits)
        assert tuple(got) == expected, f"{name}: fields of {value!r}"


@pytest.mark.exercise("02.1", points=1)
@pytest.mark.parametrize("fmt", [FORMATS["fp8 e4m3"], FP64], ids=["fp8 e4m3", "fp64"])
def test_float_fields_in_e4m3_and_float64(fmt):
    """E4M3FN encodes finite numbers the IEEE way (its top exponent holds 256..448 too)."""
    values = exactly_representable(fmt, seed=2)
    for value, expected in zip(values.tolist(), fields_from_bits(values, fmt), strict=True):
        got = impl.float_fields(value, fmt.exponent_bits, fmt.mantissa_bits)
        assert tuple(got) == expected, f"{fmt.name}: fields of {value!r}"


@pytest.mark.exercise("02.2", points=2)
@pytest.mark.parametrize("name", IEEE_LIKE + ["fp64"])
def test_format_limits_match_torch_finfo(name):
    fmt = FP64 if name == "fp64" else FORMATS[name]
    info = torch.finfo(fmt.dtype)
    got = impl.format_limits(fmt.exponent_bits, fmt.mantissa_bits)
    assert got["max"] == info.max
    assert got["min_normal"] == info.smallest_normal
    assert got["eps"] == info.eps
    assert got["min_subnormal"] == info.smallest_normal * info.eps
    if fmt.bits <= 16:  # the smallest subnormal survives a cast; half of it does not
        smallest = torch.tensor(got["min_subnormal"], dtype=torch.float64)
        assert smallest.to(fmt.dtype).double() == smallest
        assert (smallest * 0.49).to(fmt.dtype).double() == 0


def random_float32_patterns(n: int, seed: int) -> torch.Tensor:
    """float32 values from uniformly random bit patterns (every binade, both signs), no NaNs."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64)
    values = bits.to(torch.int32).view(torch.float32)
    return values[~torch.isnan(values)]


@pytest.mark.exercise("02.3", points=2)
def test_round_to_bfloat16_matches_pytorch():
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(10_000, generator=g) * 100,
                   torch.randn(1000, generator=g) * 1e-39,  # float32 subnormals
                   random_float32_patterns(20_000, seed=4),
                   torch.tensor([0.0, -0.0, 3.0e38, -3.0e38, 3.4e38, float("inf"),
                                 float("-inf")])])
    original = x.clone()
    got = impl.round_to_bfloat16(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got, x.to(torch.bfloat16).float(), rtol=0, atol=0)
    assert torch.equal(x, original), "round_to_bfloat16 must not modify its input"


@pytest.mark.exercise("02.3", points=1)
def test_round_to_bfloat16_breaks_ties_to_even():
    base = torch.tensor([1.0, 1.0078125, -3.0, -3.015625])  # even, odd, even, odd mantissas
    half_gap = 2.0 ** (torch.floor(torch.log2(base.abs())) - 8)  # half of bf16's 2^(k-7)
    half_way = base + torch.sign(base) * half_gap  # exactly between two bfloat16 values
    assert impl.round_to_bfloat16(half_way).tolist() == [1.0, 1.015625, -3.0, -3.03125]
    ties = random_float32_patterns(5000, seed=5).view(torch.int32)
    ties = ((ties & ~0xFFFF) | 0x8000).view(torch.float32)  # exactly half-way, random values
    ties = ties[torch.isfinite(ties)]
    torch.testing.assert_close(impl.round_to_bfloat16(ties), ties.to(torch.bfloat16).float(),
                               rtol=0, atol=0)


def reference_matmul_error(a, b, dtype) -> float:
    exact = a.double() @ b.double()
    rounded = a.to(dtype).float() @ b.to(dtype).float()
    return ((rounded.double() - exact).norm() / exact.norm()).item()


@pytest.mark.exercise("02.4", points=2)
@pytest.mark.parametrize("name", list(FORMATS))
def test_relative_matmul_error_per_format(name):
    dtype = FORMATS[name].dtype
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(33, 300, generator=g), torch.randn(300, 17, generator=g) * 0.5
    got = impl.relative_matmul_error(a, b, dtype)
    assert isinstance(got, float)
    assert got == pytest.approx(reference_matmul_error(a, b, dtype), rel=1e-3)


@pytest.mark.exercise("02.4", points=1)
def test_relative_matmul_error_fp32_accumulates_in_fp32():
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(64, 2048, generator=g), torch.randn(2048, 64, generator=g)
    fp32 = impl.relative_matmul_error(a, b, torch.float32)
    assert 1e-9 < fp32 < 1e-6, "multiply in float32 (inputs unchanged), compare in float64"
    bf16 = impl.relative_matmul_error(a, b, torch.bfloat16)
    assert bf16 == pytest.approx(reference_matmul_error(a, b, torch.bfloat16), rel=1e-3)
