"""Graded tests for chapter 06 (quantization basics). The library is the oracle."""

from __future__ import annotations

import pytest
import torch

from minillm.grading import load_impl
from minillm.quant import packing
from minillm.quant.basic import QuantScheme, fake_quantize, quantize
from minillm.quant.nf4 import dequantize_blockwise, nf4_levels, quantize_blockwise

impl = load_impl("ch06_quantization")


def random(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def library_per_tensor(x, bits, symmetric, clip_ratio=1.0):
    """The library's per-tensor quantization of ``x`` (any shape), viewed as one row."""
    return quantize(x.reshape(1, -1), QuantScheme(bits, symmetric, per_tensor=True,
                                                  clip_ratio=clip_ratio))


def assert_same_scale(got, expected):
    """Scales compared relatively: a tiny scale (an all-zero tensor's) must be right too."""
    torch.testing.assert_close(torch.as_tensor(got).reshape(()), expected.reshape(()),
                               rtol=1e-6, atol=0)


EDGE_CASES = {  # name: tensor
    "all zero": torch.zeros(4, 8),
    "constant": torch.full((3, 5), -2.5),
    "negative only": -random(6, 7, seed=5).abs() - 1.0,
    "one value": torch.tensor([0.3]),
}


@pytest.mark.exercise("06.1", points=2)
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_absmax_matches_the_library(bits, seed):
    x = random(2, 5, 7, seed=seed, scale=3.0)
    codes, scale = impl.absmax_quantize(x, bits)
    expected = library_per_tensor(x, bits, symmetric=True)
    assert codes.dtype == torch.int8 and codes.shape == x.shape
    assert torch.equal(codes, expected.codes.reshape(x.shape))
    assert_same_scale(scale, expected.scales)
    restored = impl.absmax_dequantize(codes, scale)
    torch.testing.assert_close(restored, expected.dequantize().reshape(x.shape))
    assert ((restored - x).abs() <= scale / 2 + 1e-6).all()  # the Δ/2 bound


@pytest.mark.exercise("06.1", points=1)
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_absmax_edge_cases(case):
    x = EDGE_CASES[case]
    codes, scale = impl.absmax_quantize(x, 4)
    restored = impl.absmax_dequantize(codes, scale)
    assert torch.isfinite(restored).all()
    assert torch.equal(codes, library_per_tensor(x, 4, symmetric=True).codes.reshape(x.shape))
    assert_same_scale(scale, library_per_tensor(x, 4, symmetric=True).scales)
    torch.testing.assert_close(restored, library_per_tensor(x, 4, True).dequantize()
                               .reshape(x.shape))
    if case in ("all zero", "constant", "one value"):  # exactly on the grid
        torch.testing.assert_close(restored, x)


@pytest.mark.exercise("06.1", points=1)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("clip_ratio", [0.5, 0.8])
def test_absmax_clipping_saturates_at_both_ends_of_the_symmetric_range(bits, clip_ratio):
    x = random(4, 33, seed=bits, scale=2.0)
    x[0, 0], x[1, 1] = 9.0, -8.0  # outliers on both sides, beyond the clipped range
    codes, scale = impl.absmax_quantize(x, bits, clip_ratio)
    expected = library_per_tensor(x, bits, symmetric=True, clip_ratio=clip_ratio)
    q_max = 2 ** (bits - 1) - 1
    assert codes.dtype == torch.int8
    assert int(codes.min()) == -q_max and int(codes.max()) == q_max, "both ends are reached"
    assert torch.equal(codes, expected.codes.reshape(x.shape))
    assert_same_scale(scale, expected.scales)
    torch.testing.assert_close(impl.absmax_dequantize(codes, scale),
                               expected.dequantize().reshape(x.shape))


@pytest.mark.exercise("06.2", points=2)
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_zeropoint_matches_the_library(bits, seed):
    x = random(3, 11, seed=seed, scale=2.0) + 1.5  # not centred on zero
    codes, scale, zero = impl.zeropoint_quantize(x, bits)
    expected = library_per_tensor(x, bits, symmetric=False)
    assert codes.dtype == torch.uint8 and codes.shape == x.shape
    assert torch.equal(codes, expected.codes.reshape(x.shape))
    assert_same_scale(scale, expected.scales)
    torch.testing.assert_close(torch.as_tensor(zero).float().reshape(()),
                               expected.zeros.reshape(()))
    restored = impl.zeropoint_dequantize(codes, scale, zero)
    torch.testing.assert_close(restored, expected.dequantize().reshape(x.shape))
    assert ((restored - x).abs() <= scale / 2 + 1e-5).all()  # the Δ/2 bound


@pytest.mark.exercise("06.2", points=1)
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_zeropoint_edge_cases(case):
    x = EDGE_CASES[case]
    codes, scale, zero = impl.zeropoint_quantize(x, 4)
    restored = impl.zeropoint_dequantize(codes, scale, zero)
    expected = library_per_tensor(x, 4, symmetric=False)
    assert torch.isfinite(restored).all()
    assert torch.equal(codes, expected.codes.reshape(x.shape))
    assert_same_scale(scale, expected.scales)
    torch.testing.assert_close(torch.as_tensor(zero).float().reshape(()),
                               expected.zeros.reshape(()))
    torch.testing.assert_close(restored, expected.dequantize().reshape(x.shape))
    torch.testing.assert_close(restored, x, atol=float(scale) / 2 + 1e-5, rtol=1e-5)


@pytest.mark.exercise("06.2", points=1)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("clip_ratio", [0.5, 0.8])
def test_zeropoint_clipping_saturates_at_0_and_the_top_code(bits, clip_ratio):
    x = random(4, 33, seed=bits, scale=2.0) + 0.5
    x[0, 0], x[1, 1] = 9.0, -6.0  # outliers on both sides, beyond the clipped range
    codes, scale, zero = impl.zeropoint_quantize(x, bits, clip_ratio)
    expected = library_per_tensor(x, bits, symmetric=False, clip_ratio=clip_ratio)
    assert codes.dtype == torch.uint8
    assert int(codes.min()) == 0 and int(codes.max()) == 2**bits - 1, "both ends are reached"
    assert torch.equal(codes, expected.codes.reshape(x.shape))
    assert_same_scale(scale, expected.scales)
    torch.testing.assert_close(impl.zeropoint_dequantize(codes, scale, zero),
                               expected.dequantize().reshape(x.shape))


@pytest.mark.exercise("06.3", points=3)
@pytest.mark.parametrize("bits", [3, 4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group_size", [8, 32, 64])
def test_groupwise_matches_the_library(bits, symmetric, group_size):
    weight = random(12, 64, seed=bits, scale=0.05)
    weight[3] -= 0.2  # a row that is negative almost everywhere
    weight[5, :8] = 0  # an all-zero group
    out = impl.groupwise_fake_quantize(weight, bits, group_size, symmetric)
    expected = fake_quantize(weight, QuantScheme(bits, symmetric, group_size))
    assert out.shape == weight.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.exercise("06.3", points=1)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_groupwise_of_a_half_precision_weight_is_float32(dtype):
    weight = random(8, 64, seed=11, scale=0.05).to(dtype)
    out = impl.groupwise_fake_quantize(weight, 4, 32, symmetric=False)
    assert out.dtype == torch.float32, "return float32, whatever the weight's dtype"
    torch.testing.assert_close(out, fake_quantize(weight.float(), QuantScheme(4, False, 32)),
                               atol=1e-6, rtol=1e-5)


@pytest.mark.exercise("06.3", points=1)
def test_smaller_groups_give_smaller_error():
    weight = random(16, 128, seed=7)
    errors = [(impl.groupwise_fake_quantize(weight, 4, g) - weight).pow(2).mean().item()
              for g in (128, 32, 8)]
    expected = [(fake_quantize(weight, QuantScheme(4, False, g)) - weight).pow(2).mean().item()
                for g in (128, 32, 8)]
    assert errors[0] > errors[1] > errors[2]
    assert errors == pytest.approx(expected, rel=1e-4)


@pytest.mark.exercise("06.4", points=1)
@pytest.mark.parametrize("shape", [(2,), (3, 8), (2, 3, 16)])
def test_pack_int4_matches_the_library(shape):
    codes = torch.randint(0, 16, shape, generator=torch.Generator().manual_seed(len(shape)),
                          dtype=torch.uint8)
    packed = impl.pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (*shape[:-1], shape[-1] // 2)
    assert torch.equal(packed, packing.pack_int4(codes))
    unpacked = impl.unpack_int4(packed)
    assert unpacked.dtype == torch.uint8 and torch.equal(unpacked, codes)


@pytest.mark.exercise("06.4", points=1)
def test_low_nibble_first():
    assert impl.pack_int4(torch.tensor([1, 2, 15, 0], dtype=torch.uint8)).tolist() == [33, 15]
    assert impl.unpack_int4(torch.tensor([0xA5], dtype=torch.uint8)).tolist() == [5, 10]


@pytest.mark.exercise("06.5", points=2)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nf4_matches_the_library(seed):
    levels = nf4_levels()
    blocks = random(10, 64, seed=seed, scale=0.02)
    codes, absmax = impl.nf4_quantize(blocks, levels)
    expected_codes, expected_absmax = quantize_blockwise(blocks, levels, block_size=64)
    assert codes.shape == blocks.shape
    assert torch.equal(codes.to(torch.uint8), expected_codes)
    torch.testing.assert_close(absmax, expected_absmax)
    restored = impl.nf4_dequantize(codes, absmax, levels)
    torch.testing.assert_close(restored,
                               dequantize_blockwise(expected_codes, expected_absmax, levels,
                                                    blocks.shape))


@pytest.mark.exercise("06.5", points=1)
def test_nf4_uses_the_given_levels_and_handles_a_zero_block():
    levels = torch.linspace(-1, 1, 16)  # a uniform 4-bit codebook this time
    blocks = torch.cat([random(3, 16, seed=3), torch.zeros(1, 16)])
    codes, absmax = impl.nf4_quantize(blocks, levels)
    expected_codes, _ = quantize_blockwise(blocks, levels, block_size=16)
    assert torch.equal(codes.to(torch.uint8), expected_codes), "a zero block: the zero code"
    restored = impl.nf4_dequantize(codes, absmax, levels)
    assert torch.isfinite(restored).all() and (restored[3] == 0).all()
    assert ((restored[:3] - blocks[:3]).abs() <= absmax[:3, None] / 15 + 1e-6).all()
