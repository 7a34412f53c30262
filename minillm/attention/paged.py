"""Attention over a paged KV cache: keys and values live in blocks scattered over a pool.

The pool of one layer holds ``[num_blocks, block_size, kv_heads, head_dim]`` keys (and the
same for values). A sequence's block table lists its blocks in order, so its t-th token
lives in block ``block_table[t // block_size]`` at offset ``t % block_size`` — its *slot*
is ``block * block_size + offset`` in the pool seen as one long row of slots.

This is the readable PyTorch reference: write the new tokens' K/V at their slots, then
*gather* each sequence's blocks into a contiguous [kv_heads, length, head_dim] view and run
ordinary attention, masking keys past each sequence's length and, for the queries of a
prefill chunk, keys in their future. The decode case without the gather, following the
block table block by block, is the C++ op ``minillm::paged_decode_attention``
(``csrc/paged_attention.h``; :func:`paged_decode_reference` is its readable twin) and, on
a GPU, the Triton kernel (``minillm.kernels.paged_attention``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def slot_mapping(block_table: list[int], start: int, count: int, block_size: int) -> list[int]:
    """Pool slots of tokens ``start .. start + count - 1`` of one sequence."""
    return [block_table[t // block_size] * block_size + t % block_size
            for t in range(start, start + count)]


def write_kv(key_pool: torch.Tensor, value_pool: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store new keys/values [tokens, kv_heads, head_dim] at their ``slots`` (one layer)."""
    key_pool.view(-1, *k.shape[1:]).index_copy_(0, slots, k.to(key_pool.dtype))
    value_pool.view(-1, *v.shape[1:]).index_copy_(0, slots, v.to(value_pool.dtype))


def gather_kv(pool: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Each sequence's blocks, in order: [seqs, kv_heads, max_blocks * block_size, head_dim]."""
    blocks = pool[block_tables]  # [seqs, max_blocks, block_size, kv_heads, head_dim]
    return blocks.flatten(1, 2).transpose(1, 2)


def paged_attention(q: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    """Causal attention of q [seqs, heads, q_len, head_dim] (each sequence's last q_len
    tokens) over its first ``context_lens[s]`` cached tokens. Block tables are padded
    with any valid block id; those keys are masked."""
    keys, values = gather_kv(key_pool, block_tables), gather_kv(value_pool, block_tables)
    q_len, slots = q.shape[2], keys.shape[2]
    key_pos = torch.arange(slots, device=q.device)
    query_pos = context_lens[:, None] - q_len + torch.arange(q_len, device=q.device)  # [s, q]
    allowed = key_pos[None, None, :] <= query_pos[:, :, None]  # causal, and within length
    return F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype),
                                          attn_mask=allowed[:, None],
                                          enable_gqa=keys.shape[1] != q.shape[1])


def paged_decode_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           key_pool: torch.Tensor, value_pool: torch.Tensor, slots: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    """One decode step's attention, the way ``minillm::paged_decode_attention`` computes it:
    write k, v [seqs, kv_heads, head_dim] at ``slots`` (rows with slot -1 are padding and
    write nothing), then each query q [seqs, heads, head_dim] attends over its sequence's
    first ``context_lens`` tokens; padding rows (length 0) give zeros."""
    keep = slots >= 0
    write_kv(key_pool, value_pool, k[keep], v[keep], slots[keep])
    out = paged_attention(q[:, :, None], key_pool, value_pool, block_tables,
                          context_lens.clamp(min=1))[:, :, 0]
    return torch.where((context_lens > 0)[:, None, None], out, 0.0)
