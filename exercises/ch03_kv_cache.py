# Generated from solutions/ch03_kv_cache.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 03: the KV cache — compute each token's keys and values once, reuse them forever."""

from __future__ import annotations

import math

import torch


def cache_append(cache_k: torch.Tensor, cache_v: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 03.1: Store new keys/values in preallocated buffers and return all stored ones.

    cache_k, cache_v: [batch, kv_heads, max_len, head_dim]; steps 0 .. length-1 are filled.
    k, v: [batch, kv_heads, new, head_dim], the keys/values of the new tokens.
    Write them (in place) at steps length .. length+new-1, then return views (not copies)
    of steps 0 .. length+new-1 of both buffers: everything the new queries may attend to.
    Raise ValueError (saying what does not fit) if length + new > max_len.
    Hint: `cache_k[:, :, a:b] = k` writes in place, and `cache_k[:, :, :b]` is a view.
    """
    raise NotImplementedError("Exercise 03.1: Store new keys/values in preallocated buffers and return all stored ones")


def attention_with_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exercise 03.2: Causal attention of the newest queries against all cached keys/values.

    q: [batch, heads, new, d] are the queries of the LAST `new` positions of the sequence;
    k, v: [batch, kv_heads, total, d] hold every position 0 .. total-1 (cache + new tokens).
    heads is a multiple of kv_heads: query head h reads K/V head h // (heads // kv_heads).
    New query i sits at position total - new + i and sees keys 0 .. total - new + i.
    Returns softmax(q kᵀ / √d + causal mask) v, [batch, heads, new, d].
    Hint: torch.repeat_interleave(k, groups, dim=1) gives each query head its K/V head.
    With new = 1 (decode) nothing is masked; with new = total (prefill) it is the usual
    lower-triangular mask.
    """
    raise NotImplementedError("Exercise 03.2: Causal attention of the newest queries against all cached keys/values")


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int,
                   batch_size: int = 1, bytes_per_value: int = 2) -> int:
    """Exercise 03.3: Return the size in bytes of a full KV cache.

    Two tensors (K and V) per layer, each [batch, kv_heads, tokens, head_dim], every value
    taking bytes_per_value bytes (2 for fp16/bf16, 4 for fp32).
    Hint: Llama-2-7B (32 layers, 32 KV heads, head_dim 128) at 4096 tokens in fp16 is 2 GiB.
    """
    raise NotImplementedError("Exercise 03.3: Return the size in bytes of a full KV cache")


def sliding_window_mask(num_queries: int, num_keys: int, window: int | None) -> torch.Tensor:
    """Exercise 03.4: The causal mask of sliding-window attention, True where a query may look.

    Keys are positions 0 .. num_keys-1; the queries are the LAST num_queries of them, so
    query i sits at position p = num_keys - num_queries + i. It sees key j when j <= p
    (causal) and p - j < window (at most `window` keys, itself included); window=None
    means no window (plain causal attention). Returns bool [num_queries, num_keys].
    Hint: compare a column of query positions with a row of key positions (broadcasting).
    """
    raise NotImplementedError("Exercise 03.4: The causal mask of sliding-window attention, True where a query may look")
