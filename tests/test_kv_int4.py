"""The int4 (KIVI) KV cache: rounding against float64, packing, and the pool's attention
against float64 attention over the values it stands for.

Tolerances: each value within scale / 2 = (max - min) / 30 of the original (float64
reference); the pool's attention equals float64 attention over the rounded keys of the
blocks full before each query, the float32 keys of its own block and the rounded values,
to float32 rounding (1e-5); against the original float32 K/V, to the rounding's effect on
random N(0, 1) heads of 16 (0.3 absolute)."""

from __future__ import annotations

import torch

from minillm.attention.kv_int4 import dequantize_int4, pack, quantize_int4, unpack
from minillm.attention.paged import slot_mapping
from minillm.config import ModelConfig
from minillm.engine.int4_cache import Int4Pool
from minillm.testing import TINY


def test_int4_rounds_each_group_to_16_levels_within_half_a_step():
    x = torch.randn(4, 3, 16, generator=torch.Generator().manual_seed(0)) * 3
    for dim in (0, -1):  # keys: along the tokens (per channel); values: along the channels
        codes, scales, minimums = quantize_int4(x, dim)
        x64 = x.double()
        low, high = x64.amin(dim), x64.amax(dim)
        torch.testing.assert_close(scales.double(), (high - low) / 15, rtol=1e-6, atol=0)
        torch.testing.assert_close(minimums.double(), low, rtol=0, atol=0)
        assert codes.max() == 15 and codes.min() == 0
        error = (dequantize_int4(codes, scales, minimums, dim).double() - x64).abs()
        assert (error <= scales.double().unsqueeze(dim) / 2 + 1e-6).all()


def test_a_constant_group_is_exact():
    x = torch.full((4, 8), 2.5)
    codes, scales, minimums = quantize_int4(x, 0)
    assert not codes.any() and not scales.any()
    torch.testing.assert_close(dequantize_int4(codes, scales, minimums, 0), x)


def test_packing_two_codes_a_byte_is_undone():
    codes = torch.randint(0, 16, (5, 3, 16), dtype=torch.uint8)
    packed = pack(codes)
    assert packed.shape == (5, 3, 8) and torch.equal(unpack(packed), codes)


def reference_attention(q, k, v, positions, block_size):
    """float64: each query (position p) over keys 0..p, block i < p // block_size rounded
    per channel, its own block as given, values rounded per token."""
    k64 = k.double()
    rounded = k64.clone()
    for begin in range(0, len(k), block_size):
        if begin + block_size <= len(k):
            block = k[begin:begin + block_size]
            rounded[begin:begin + block_size] = dequantize_int4(*quantize_int4(block, 0), 0)
    values = dequantize_int4(*quantize_int4(v, -1), -1).double()
    out = []
    for p in positions:
        keys = torch.cat([rounded[:p // block_size * block_size],
                          k64[p // block_size * block_size:p + 1]])
        group = q.shape[1] // k.shape[1]
        keys, vals = (t.repeat_interleave(group, 1) for t in (keys, values[:p + 1]))
        scores = torch.einsum("hd,thd->ht", q[p - positions[0]].double(), keys)
        out.append(torch.einsum("ht,thd->hd", (scores / 4).softmax(-1), vals))
    return torch.stack(out)


def test_pool_attention_reads_full_blocks_rounded_and_its_own_block_as_written():
    config = ModelConfig(**TINY)
    pool = Int4Pool(config, num_blocks=8, block_size=4)
    g = torch.Generator().manual_seed(1)
    length, table = 14, [5, 2, 7, 0]
    k, v = (torch.randn(length, 2, 16, generator=g) for _ in range(2))
    pool.write(0, k, v, torch.tensor(slot_mapping(table, 0, length, 4)))
    q = torch.randn(6, 4, 16, generator=g)  # the last 6 tokens' queries, as a chunk
    positions = torch.arange(length - 6, length)
    out = pool.attend(0, q.transpose(0, 1)[None], torch.tensor([table]), positions[None],
                      [length - 6])[0].transpose(0, 1)
    expected = reference_attention(q, k, v, positions.tolist(), 4)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    plain = torch.stack([torch.einsum(
        "ht,thd->hd", (torch.einsum("hd,thd->ht", q[i], k[:p + 1].repeat_interleave(2, 1))
                       / 4).softmax(-1), v[:p + 1].repeat_interleave(2, 1))
        for i, p in enumerate(positions.tolist())])
    torch.testing.assert_close(out, plain, atol=0.3, rtol=0)
    assert set(pool.staging[0]) == {7, 0}  # blocks 5 and 2 were filled before the step


def test_copy_on_write_copies_the_staged_keys():
    pool = Int4Pool(ModelConfig(**TINY), num_blocks=4, block_size=4)
    k = torch.randn(2, 2, 16)
    pool.write(0, k, k, torch.tensor([4, 5]))  # block 1, offsets 0 and 1
    pool.copy_staging([(1, 3)])
    assert torch.equal(pool.staging[0][3][:2], k)
    assert pool.staging[0][3].data_ptr() != pool.staging[0][1].data_ptr()
