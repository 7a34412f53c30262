"""KV-cache quantization (minillm/attention/kv_quant.py) and the C++ paged attention
(csrc/paged_attention.h) over float32 and int8 pools.

Tolerances: an int8 head's values are within scale / 2 = max |x| / 254 of the originals
(float64 reference); attention over an int8 pool equals float64 attention over the
dequantized values to float32 rounding (1e-5), and attention over the original float32
values to the rounding's effect (random N(0, 1) heads of 16: 0.05 absolute)."""

from __future__ import annotations

import pytest
import torch

from minillm.attention.kv_quant import (
    dequantize_int8,
    gather_int8,
    kv_cache_dtype_of,
    quantize_int8,
    write_int8,
)
from minillm.attention.paged import gather_kv, paged_attention, slot_mapping, write_kv
from minillm.native import native_kernels

needs_kernels = pytest.mark.skipif(native_kernels() is None, reason="no C++ compiler here")


def test_int8_codes_are_the_float64_rounding_of_each_head():
    x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(0)) * 4
    codes, scales = quantize_int8(x)
    x64 = x.double()
    scales64 = x64.abs().amax(-1) / 127
    assert codes.dtype == torch.int8 and scales.shape == (5, 3)
    torch.testing.assert_close(scales.double(), scales64, rtol=1e-7, atol=0)
    expected = (x64 / scales64[..., None]).round()
    assert (codes.double() - expected).abs().max() <= 1  # a tie's float32 rounding at most
    assert (codes.abs().amax(-1) == 127).all()  # each head's largest value is +-127
    error = (dequantize_int8(codes, scales).double() - x64).abs()
    assert (error <= scales64[..., None] / 2 * (1 + 1e-5)).all()


def test_an_all_zero_head_is_zero_codes_and_a_zero_scale():
    codes, scales = quantize_int8(torch.zeros(2, 8))
    assert not codes.any() and not scales.any()
    assert not dequantize_int8(codes, scales).isnan().any()


def test_an_unknown_kv_cache_dtype_is_refused_with_the_choices():
    assert kv_cache_dtype_of(None) == "float32" and kv_cache_dtype_of("int8") == "int8"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of float32, int8"):
        kv_cache_dtype_of("fp8")


def int8_cache(lengths, block_size=16, kv_heads=2, head_dim=16, num_blocks=96, seed=0):
    """Random float32 K/V of sequences of ``lengths``, written to shuffled blocks of a
    float32 pool and of an int8 pool (codes, scales)."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    floats = [torch.zeros(shape) for _ in range(2)]
    codes = [torch.zeros(shape, dtype=torch.int8) for _ in range(2)]
    scales = [torch.zeros(shape[:3]) for _ in range(2)]
    free, tables = torch.randperm(num_blocks, generator=g).tolist(), []
    for n in lengths:
        table = [free.pop() for _ in range(-(-n // block_size))]
        slots = torch.tensor(slot_mapping(table, 0, n, block_size))
        k, v = (torch.randn(n, kv_heads, head_dim, generator=g) for _ in range(2))
        write_kv(*floats, k, v, slots)
        for i, x in enumerate((k, v)):
            write_int8(codes[i], scales[i], x, slots)
        tables.append(table)
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    return floats, codes, scales, padded, torch.tensor(lengths)


def test_the_gather_dequantizes_each_sequences_tokens_in_order():
    floats, codes, scales, tables, lengths = int8_cache([5, 40])
    for i in range(2):
        expected = dequantize_int8(*quantize_int8(gather_kv(floats[i], tables)))
        torch.testing.assert_close(gather_int8(codes[i], scales[i], tables), expected,
                                   rtol=0, atol=0)


LENGTHS = [[1, 16, 17, 50], [300], [600, 3, 257]]  # > 256 tokens: split in parts and merged


@needs_kernels
@pytest.mark.parametrize("lengths", LENGTHS)
def test_cpp_attention_over_a_float32_pool_equals_float64_attention(lengths):
    floats, _, _, tables, context = int8_cache(lengths)
    q = torch.randn(len(lengths), 6, 16, generator=torch.Generator().manual_seed(1))
    out = native_kernels().paged_decode_read(q, *floats, [], tables, context)
    expected = paged_attention(q[:, :, None].double(), *(p.double() for p in floats), tables,
                               context)[:, :, 0]
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("lengths", LENGTHS)
def test_cpp_attention_over_an_int8_pool_equals_attention_over_its_values(lengths):
    floats, codes, scales, tables, context = int8_cache(lengths)
    q = torch.randn(len(lengths), 6, 16, generator=torch.Generator().manual_seed(1))
    out = native_kernels().paged_decode_read(q, *codes, scales, tables, context).double()
    dequantized = [dequantize_int8(c, s).double() for c, s in zip(codes, scales, strict=True)]
    exact = paged_attention(q[:, :, None].double(), *dequantized, tables, context)[:, :, 0]
    torch.testing.assert_close(out, exact, atol=1e-5, rtol=1e-5)
    original = paged_attention(q[:, :, None].double(), *(p.double() for p in floats), tables,
                               context)[:, :, 0]
    torch.testing.assert_close(out, original, atol=0.05, rtol=0)
    assert not torch.equal(out, original)


@needs_kernels
def test_cpp_int8_pool_refuses_scales_of_the_wrong_shape():
    _, codes, scales, tables, context = int8_cache([5])
    with pytest.raises(RuntimeError, match="scales are two contiguous float32"):
        native_kernels().paged_decode_read(torch.zeros(1, 6, 16), *codes,
                                           [scales[0][:, :1], scales[1]], tables, context)
