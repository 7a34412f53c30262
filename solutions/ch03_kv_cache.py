"""Chapter 03: the KV cache — store keys and values once, attend to them at every step."""

from __future__ import annotations

import math

import torch


def cache_append(cache_k: torch.Tensor, cache_v: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, length: int):
    """Exercise 03.1: Write new keys/values into preallocated buffers; return all stored so far.

    cache_k, cache_v: [batch, kv_heads, max_len, head_dim], of which the first `length`
    steps are filled. k, v: [batch, kv_heads, new, head_dim]. Write them at steps
    length .. length + new - 1 (in place) and return views (no copies) of steps
    0 .. length + new - 1 of both buffers. Raise ValueError if they do not fit.
    Hint: slice assignment cache_k[:, :, a:b] = k writes in place; slicing returns a view.
    """
    ### BEGIN SOLUTION
    end = length + k.shape[2]
    if end > cache_k.shape[2]:
        raise ValueError(f"cache holds {cache_k.shape[2]} steps; {end} needed")
    cache_k[:, :, length:end] = k
    cache_v[:, :, length:end] = v
    return cache_k[:, :, :end], cache_v[:, :, :end]
    ### END SOLUTION


def attention_with_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exercise 03.2: Causal attention of the newest queries against every cached key.

    q: [batch, heads, new, d], the queries of the last `new` positions of the sequence;
    k, v: [batch, kv_heads, total, d], keys/values of all `total` positions (cache + new).
    heads is a multiple of kv_heads: query head h uses K/V head h // (heads // kv_heads).
    Query i (0-based among the new ones) sits at position total - new + i and may attend
    to keys 0 .. total - new + i. Returns [batch, heads, new, d].
    Hint: repeat K/V heads with repeat_interleave on dim 1; mask the scores with -inf where
    key position > query position; for decode (new = 1) nothing is masked.
    """
    ### BEGIN SOLUTION
    new, total = q.shape[2], k.shape[2]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    query_pos = torch.arange(total - new, total, device=q.device)[:, None]
    future = torch.arange(total, device=q.device)[None, :] > query_pos
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
    ### END SOLUTION


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int,
                   batch_size: int = 1, bytes_per_value: int = 2) -> int:
    """Exercise 03.3: Return the size in bytes of a full KV cache.

    Two tensors (K and V) per layer, each [batch, kv_heads, tokens, head_dim].
    Hint: Llama-2-7B (32 layers, 32 KV heads, head_dim 128) at 4096 tokens in fp16 is 2 GiB.
    """
    ### BEGIN SOLUTION
    return 2 * num_layers * num_kv_heads * head_dim * num_tokens * batch_size * bytes_per_value
    ### END SOLUTION
