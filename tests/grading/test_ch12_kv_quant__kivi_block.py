"""Graded tests for chapter 12, section 9, exercise 12.8: KIVI's int4 for one full block
(keys per channel over the block, values per token, codes packed two to a byte).

Oracles: the library's rounding and packing (``minillm.attention.kv_int4``) bit for bit, on
hidden random blocks (Hypothesis) and edge cases; what the engine's int4 pool
(``minillm.engine.int4_cache``) stores for a block it rounds; and the error of the channels
beside a huge one, which per-channel keys keep at their own half step.
"""

from __future__ import annotations

import pytest
import torch
from ch12_kv_cases import HIDDEN, assert_same, tensors
from hypothesis import given
from hypothesis import strategies as st

from minillm.attention import kv_int4
from minillm.config import ModelConfig
from minillm.engine.int4_cache import Int4Pool
from minillm.grading import load_impl

impl = load_impl("ch12_kv_quant")


def block(block_size=16, kv_heads=3, head_dim=8, seed=0, outlier=None) -> tuple:
    """Random keys and values of one full block; ``outlier``: a key channel times 1000."""
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(2, block_size, kv_heads, head_dim, generator=g)
    if outlier is not None:
        keys[..., outlier] = 1000 + keys[..., outlier]
    return keys, values


def library_block(keys, values):
    """What the engine's int4 pool stores for a full block (``minillm.engine.int4_cache``)."""
    key_codes, key_scales, key_minimums = kv_int4.quantize_int4(keys, dim=0)
    value_codes, value_scales, value_minimums = kv_int4.quantize_int4(values, dim=-1)
    return impl.Int4Block(kv_int4.pack(key_codes), key_scales, key_minimums,
                          kv_int4.pack(value_codes), value_scales, value_minimums)


FIELDS = ("key_codes", "key_scales", "key_minimums", "value_codes", "value_scales",
          "value_minimums")


def assert_same_block(yours, library) -> None:
    for name in FIELDS:
        assert_same(getattr(yours, name), getattr(library, name), name)


# -- 12.8 KIVI: one full block, keys per channel, values per token, packed ----------------

@pytest.mark.exercise("12.8", points=1)
def test_pack_two_codes_a_byte_low_nibble_first():
    codes = torch.tensor([[1, 2, 15, 0, 7, 9]], dtype=torch.uint8)
    packed = impl.pack(codes)
    assert packed.dtype == torch.uint8 and packed.tolist() == [[0x21, 0x0F, 0x97]]
    assert torch.equal(impl.unpack(packed), codes)
    every = torch.randint(0, 16, (3, 2, 64), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(6))
    assert_same(impl.pack(every), kv_int4.pack(every), "packed")
    assert_same(impl.unpack(kv_int4.pack(every)), every, "unpacked")


@pytest.mark.exercise("12.8", points=3)
@HIDDEN
@given(data=st.data())
def test_kivi_block_equals_the_librarys_on_hidden_random_blocks(data):
    shape = (data.draw(st.sampled_from([1, 2, 4, 16]), label="block_size"),
             data.draw(st.integers(1, 3), label="kv_heads"),
             data.draw(st.sampled_from([2, 8, 64]), label="head_dim"))
    keys, values = data.draw(tensors(shape), label="keys"), data.draw(tensors(shape))
    before = keys.clone(), values.clone()
    assert_same_block(impl.quantize_kv_block(keys, values), library_block(keys, values))
    assert torch.equal(keys, before[0]) and torch.equal(values, before[1]), \
        "the inputs must not be changed"


@pytest.mark.exercise("12.8", points=2)
@pytest.mark.parametrize("block_size, kv_heads, head_dim", [(16, 3, 64), (4, 2, 8)])
def test_kivi_block_is_what_the_engines_int4_pool_stores(block_size, kv_heads, head_dim):
    """A full block written to the engine's int4 pool and rounded (a query after it reads
    it) holds your block's codes, scales and minimums."""
    config = ModelConfig(vocab_size=8, hidden_size=kv_heads * head_dim, intermediate_size=8,
                         num_layers=1, num_heads=kv_heads, num_kv_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=64)
    pool = Int4Pool(config, num_blocks=4, block_size=block_size)
    keys, values = block(block_size, kv_heads, head_dim, seed=7, outlier=1)
    pool.write(0, keys, values, torch.arange(2 * block_size, 3 * block_size))
    pool.attend(0, torch.zeros(1, kv_heads, 1, head_dim), torch.tensor([[2, 3]]),
                torch.tensor([[block_size]]), [block_size])
    stored = impl.Int4Block(pool.keys[0][2], pool.key_scales[0][2], pool.key_minimums[0][2],
                            pool.values[0][2], pool.value_scales[0][2],
                            pool.value_minimums[0][2])
    assert_same_block(impl.quantize_kv_block(keys, values), stored)


@pytest.mark.exercise("12.8", points=1)
def test_a_huge_key_channel_leaves_the_others_precise():
    """Keys per channel: a channel near 1000 in every token costs the other channels
    nothing (per token, its range would swallow their 16 levels)."""
    keys, values = block(outlier=5, seed=8)
    back, _ = impl.dequantize_kv_block(impl.quantize_kv_block(keys, values))
    others = torch.arange(keys.shape[-1]) != 5
    spread = keys.amax(0) - keys.amin(0)  # each channel's range over the block
    assert ((back - keys).abs()[..., others] <= spread[..., others] / 30 + 1e-6).all()


@pytest.mark.exercise("12.8", points=1)
def test_kivi_dequantize_equals_the_library():
    keys, values = block(seed=9, outlier=0)
    rounded = library_block(keys, values)
    back_keys, back_values = impl.dequantize_kv_block(rounded)
    assert_same(back_keys, kv_int4.dequantize_int4(kv_int4.unpack(rounded.key_codes),
                                                   rounded.key_scales, rounded.key_minimums,
                                                   0), "keys")
    assert_same(back_values, kv_int4.dequantize_int4(kv_int4.unpack(rounded.value_codes),
                                                     rounded.value_scales,
                                                     rounded.value_minimums, -1), "values")


@pytest.mark.exercise("12.8", points=1)
def test_an_all_zero_block_and_constant_channels():
    keys, values = torch.zeros(2, 4, 2, 8)
    keys[:, 1, 3] = -2.5  # a constant key channel; values: every row zero
    yours = impl.quantize_kv_block(keys, values)
    assert_same_block(yours, library_block(keys, values))
    back_keys, back_values = impl.dequantize_kv_block(yours)
    assert torch.equal(back_keys, keys) and torch.equal(back_values, values)
