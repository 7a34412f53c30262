"""Attention written out as the paper's equation: softmax(Q Kᵀ / √d) V.

It materialises the full [q_len, kv_len] score matrix per head, which is what
FlashAttention later avoids. Easy to read, and the reference the others are tested against.
"""

from __future__ import annotations

import math

import torch


def repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """[b, kv_heads, s, d] -> [b, kv_heads * times, s, d]: give each query head its K/V head."""
    if times == 1:
        return x
    b, kv_heads, s, d = x.shape
    return x[:, :, None].expand(b, kv_heads, times, s, d).reshape(b, kv_heads * times, s, d)


def naive_attention(q, k, v, mask=None):
    """Scaled dot-product attention with an explicit score matrix (Vaswani et al. 2017, eq. 1)."""
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [b, h, q_len, kv_len]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
