"""Paged-attention decode as a Triton kernel: one new token per sequence attends to its
keys and values wherever their blocks lie in the pool (PagedAttention, Kwon et al. 2023).

One program handles one (sequence, query head). It walks the sequence's block table:
for each block it loads ``block_size`` keys of the head's KV group straight from the pool,
scores them against the query, and folds them into the online-softmax state (running max,
running sum, weighted values), as :func:`minillm.attention.tiled.online_softmax_step`
does. Nothing is gathered into a contiguous copy; the last block is masked at the
sequence's length.

On a CPU, set ``TRITON_INTERPRET=1`` before importing: the tests check this kernel in
Triton's interpreter against :func:`minillm.attention.paged.paged_attention`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode(
    Q, KeyPool, ValuePool, BlockTables, ContextLens, Out,
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt, stride_os, stride_oh,
    scale,
    GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    seq, head = tl.program_id(0), tl.program_id(1)
    kv_head = head // GROUPS
    dims = tl.arange(0, HEAD_DIM)
    offsets = tl.arange(0, BLOCK_SIZE)
    q = tl.load(Q + seq * stride_qs + head * stride_qh + dims).to(tl.float32) * scale
    length = tl.load(ContextLens + seq)

    m = tl.max(tl.full([BLOCK_SIZE], float("-inf"), tl.float32), axis=0)  # fp32 scalars:
    l = tl.sum(tl.zeros([BLOCK_SIZE], tl.float32), axis=0)  # loop-carried with one type
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for i in range(0, tl.cdiv(length, BLOCK_SIZE)):
        block = tl.load(BlockTables + seq * stride_bt + i)
        present = i * BLOCK_SIZE + offsets < length
        k = tl.load(KeyPool + block * stride_kb + offsets[:, None] * stride_kt
                    + kv_head * stride_kh + dims[None, :], mask=present[:, None], other=0.0)
        scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1)  # [BLOCK_SIZE]
        scores = tl.where(present, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)
        rescale = tl.exp(m - m_new)
        v = tl.load(ValuePool + block * stride_vb + offsets[:, None] * stride_vt
                    + kv_head * stride_vh + dims[None, :], mask=present[:, None], other=0.0)
        l = l * rescale + tl.sum(p, axis=0)
        acc = acc * rescale + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m = m_new
    out = acc / l
    tl.store(Out + seq * stride_os + head * stride_oh + dims, out.to(Out.dtype.element_ty))


def paged_decode_attention(q: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor
                           ) -> torch.Tensor:
    """q [seqs, heads, head_dim] (one token each) over its sequence's ``context_lens[s]``
    cached tokens; pools [num_blocks, block_size, kv_heads, head_dim]; block tables
    [seqs, max_blocks] (int32/int64); returns [seqs, heads, head_dim]."""
    seqs, heads, head_dim = q.shape
    block_size, kv_heads = key_pool.shape[1], key_pool.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads evenly")
    for name, n in (("head_dim", head_dim), ("block_size", block_size)):
        if n & (n - 1):
            raise ValueError(f"{name} must be a power of two, got {n}")
    if bool((context_lens < 1).any()):
        raise ValueError("every sequence needs at least one cached token")
    q = q.contiguous()
    out = torch.empty_like(q)
    _paged_decode[(seqs, heads)](
        q, key_pool, value_pool, block_tables, context_lens, out,
        q.stride(0), q.stride(1),
        key_pool.stride(0), key_pool.stride(1), key_pool.stride(2),
        value_pool.stride(0), value_pool.stride(1), value_pool.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        1.0 / math.sqrt(head_dim),
        GROUPS=heads // kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
    )
    return out
