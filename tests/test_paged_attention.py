"""Paged attention: the PyTorch gather reference equals contiguous attention, and the
Triton decode kernel (interpreter on CPU) equals the reference (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import torch

from minillm.attention.paged import gather_kv, paged_attention, slot_mapping, write_kv
from minillm.attention.sdpa import sdpa_attention


def scattered_cache(lengths, block_size=16, kv_heads=2, head_dim=16, num_blocks=64, seed=0):
    """Random K/V for sequences of ``lengths``, written to shuffled blocks of a pool."""
    g = torch.Generator().manual_seed(seed)
    key_pool = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=torch.float64)
    value_pool = torch.zeros_like(key_pool)
    free = torch.randperm(num_blocks, generator=g).tolist()
    tables, contiguous = [], []
    for n in lengths:
        table = [free.pop() for _ in range(-(-n // block_size))]
        k = torch.randn(n, kv_heads, head_dim, generator=g, dtype=torch.float64)
        v = torch.randn(n, kv_heads, head_dim, generator=g, dtype=torch.float64)
        write_kv(key_pool, value_pool, k, v, torch.tensor(slot_mapping(table, 0, n, block_size)))
        tables.append(table)
        contiguous.append((k.transpose(0, 1)[None], v.transpose(0, 1)[None]))
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    return key_pool, value_pool, padded, torch.tensor(lengths), contiguous


def test_slots_follow_the_block_table():
    assert slot_mapping([7, 2], 14, 4, block_size=16) == [126, 127, 32, 33]


def test_gather_returns_each_sequences_keys_in_order():
    key_pool, _, tables, lengths, contiguous = scattered_cache([5, 40])
    gathered = gather_kv(key_pool, tables)
    for s, (k, _) in enumerate(contiguous):
        torch.testing.assert_close(gathered[s:s + 1, :, :lengths[s]], k)


@pytest.mark.parametrize("q_len", [1, 3])
def test_paged_reference_equals_contiguous_attention(q_len):
    key_pool, value_pool, tables, lengths, contiguous = scattered_cache([5, 40, 17])
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, q_len, 16, dtype=torch.float64, generator=g)
    out = paged_attention(q, key_pool, value_pool, tables, lengths)
    for s, (k, v) in enumerate(contiguous):
        n = int(lengths[s])
        causal = torch.ones(q_len, n, dtype=torch.bool).tril(n - q_len)
        expected = sdpa_attention(q[s:s + 1], k, v, causal[None, None])
        torch.testing.assert_close(out[s:s + 1], expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("lengths, block_size", [([1, 16, 17, 50], 16), ([3, 33], 8), ([70], 32)])
def test_triton_paged_decode_equals_the_reference(lengths, block_size):
    from minillm.kernels.paged_attention import paged_decode_attention

    key_pool, value_pool, tables, context, _ = scattered_cache(lengths, block_size=block_size)
    q = torch.randn(len(lengths), 4, 1, 16, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(2))
    expected = paged_attention(q, key_pool, value_pool, tables, context)[:, :, 0]
    out = paged_decode_attention(q[:, :, 0].float(), key_pool.float(), value_pool.float(),
                                 tables, context)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_triton_paged_decode_rejects_what_it_cannot_do():
    from minillm.kernels.paged_attention import paged_decode_attention

    pool = torch.zeros(4, 12, 2, 16)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        paged_decode_attention(torch.zeros(1, 4, 16), pool, pool,
                               torch.zeros(1, 1, dtype=torch.long), torch.tensor([3]))


def test_watch_copies_notes_a_gather_and_not_a_view():
    """minillm.testing.watch_copies, which the chapter 12 lab's tests use to prove that no
    gathered copy is made: a view of one block is not noted, a gather of three blocks is,
    and so is whatever is computed from a watched tensor."""
    from minillm.testing import watch_copies

    pool = torch.randn(8, 4, 2, 3)
    (watched,), copies = watch_copies(pool)
    block = watched[5, :2]  # a view: shares the pool's memory
    flat = watched.flatten(0, 1)  # a view of the whole pool
    assert copies == [] and torch.equal(block.as_subclass(torch.Tensor), pool[5, :2])
    assert flat.shape == (32, 2, 3) and copies == []
    watched[[1, 6, 2]]  # a gather: 3 blocks of 4 x 2 x 3
    (block * 2).sum()
    assert copies == [72, 12, 1]
