"""FlashAttention's algorithm in plain PyTorch: attention without the N x N score matrix.

Naive attention writes all q_len x kv_len scores to memory, softmaxes them, and reads them
back: memory grows as N² and the time goes to moving it. FlashAttention (Dao et al. 2022)
walks over key/value blocks and keeps, per query row, only three running quantities:

    m   the largest score seen so far
    l   the sum of exp(score - m) so far
    acc the sum of exp(score - m) * v so far

When a new block raises the maximum from m to m', everything accumulated so far is
rescaled by exp(m - m') (the *online softmax*, Milakov & Gimelshein 2018; FlashAttention
Algorithm 1, lines 9-12). After the last block, out = acc / l, and the log-sum-exp of each
row is m + log(l). Peak memory is one [block_q, block_k] tile per head instead of N x N.

This is the reference for the Triton kernel in ``minillm.kernels.flash_attention``.
"""

from __future__ import annotations

import math

import torch


def online_softmax_step(m, l, acc, scores, v_block):
    """Fold one block of ``scores`` [..., q, k] and values [..., k, d] into (m, l, acc)."""
    m_new = torch.maximum(m, scores.amax(dim=-1))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows all masked
    rescale = torch.exp(m - m_safe)
    p = torch.exp(scores - m_safe[..., None])
    return m_new, l * rescale + p.sum(-1), acc * rescale[..., None] + p @ v_block


def tiled_attention_with_lse(q, k, v, mask=None, causal=False, block_q=128, block_k=128):
    """Attention by tiles; returns (out [b, h, q, d], log-sum-exp [b, h, q]).

    q [b, heads, q_len, d]; k, v [b, kv_heads, kv_len, d]; query head h reads kv head
    h // (heads // kv_heads) through a broadcast view, never a copy. ``causal`` treats the
    queries as the last q_len positions of the kv sequence. ``mask``: bool, broadcastable to
    [b, 1, q_len, kv_len], True where attending is allowed.
    """
    b, heads, q_len, d = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    scale = 1.0 / math.sqrt(d)
    acc_dtype = torch.promote_types(q.dtype, torch.float32)  # fp16/bf16 accumulate in fp32
    qg = q.reshape(b, kv_heads, groups, q_len, d)  # query heads grouped by their kv head
    kg, vg = k[:, :, None], v[:, :, None]  # [b, kv_heads, 1, kv_len, d]: shared by the group
    out = torch.empty_like(q)
    lse = torch.empty(b, heads, q_len, dtype=acc_dtype, device=q.device)
    for q0 in range(0, q_len, block_q):
        q1 = min(q0 + block_q, q_len)
        q_blk = qg[..., q0:q1, :].to(acc_dtype) * scale
        m = torch.full(q_blk.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_blk)
        last_key = kv_len if not causal else min(kv_len, kv_len - q_len + q1)
        for k0 in range(0, last_key, block_k):
            k1 = min(k0 + block_k, kv_len)
            scores = q_blk @ kg[..., k0:k1, :].to(acc_dtype).transpose(-2, -1)
            allowed = _allowed(mask, causal, q0, q1, k0, k1, q_len, kv_len, q.device)
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            m, l, acc = online_softmax_step(m, l, acc, scores, vg[..., k0:k1, :].to(acc_dtype))
        out[:, :, q0:q1] = (acc / l[..., None]).reshape(b, heads, q1 - q0, d).to(q.dtype)
        lse[:, :, q0:q1] = (m + torch.log(l)).reshape(b, heads, q1 - q0)
    return out, lse


def _allowed(mask, causal, q0, q1, k0, k1, q_len, kv_len, device):
    """The [.., q1-q0, k1-k0] tile of the mask (with a group axis), or None if all allowed."""
    allowed = None
    if causal:
        q_pos = torch.arange(q0, q1, device=device)[:, None] + (kv_len - q_len)
        allowed = torch.arange(k0, k1, device=device)[None, :] <= q_pos
    if mask is not None:
        tile = mask[..., q0:q1, k0:k1][:, :, None]  # [b or 1, 1, 1, q, k]
        allowed = tile if allowed is None else tile & allowed
    return allowed


def tiled_attention(q, k, v, mask=None):
    """The backend interface (see :mod:`minillm.attention`): output only."""
    return tiled_attention_with_lse(q, k, v, mask)[0]
