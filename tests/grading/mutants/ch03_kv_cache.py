"""Plausible wrong answers to chapter 03 (the KV cache); the graded tests must catch each
one. Each mutant replaces the solution function named before its ``__``."""

import math

import torch


def cache_append__returns_copies(cache_k, cache_v, k, v, length):
    """Returns copies of the filled steps instead of views of the buffers."""
    end = length + k.shape[2]
    if end > cache_k.shape[2]:
        raise ValueError("the cache is full")
    cache_k[:, :, length:end] = k
    cache_v[:, :, length:end] = v
    return cache_k[:, :, :end].clone(), cache_v[:, :, :end].clone()


def cache_append__refuses_to_fill_the_last_slot(cache_k, cache_v, k, v, length):
    """Raises when the new tokens exactly fill the cache (>= instead of >)."""
    end = length + k.shape[2]
    if end >= cache_k.shape[2]:
        raise ValueError("the cache is full")
    cache_k[:, :, length:end] = k
    cache_v[:, :, length:end] = v
    return cache_k[:, :, :end], cache_v[:, :, :end]


def cache_append__returns_only_new_steps(cache_k, cache_v, k, v, length):
    """Returns the new steps only, not everything the new queries may attend to."""
    end = length + k.shape[2]
    if end > cache_k.shape[2]:
        raise ValueError("the cache is full")
    cache_k[:, :, length:end] = k
    cache_v[:, :, length:end] = v
    return cache_k[:, :, length:end], cache_v[:, :, length:end]


def attention_with_cache__mask_from_position_zero(q, k, v):
    """Places the new queries at positions 0..new-1 instead of the last ones."""
    new, total = q.shape[2], k.shape[2]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    future = torch.arange(total)[None, :] > torch.arange(new)[:, None]
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


def attention_with_cache__tiles_kv_heads(q, k, v):
    """Gives query head h the K/V head h % kv_heads (tiling) instead of h // groups."""
    new, total = q.shape[2], k.shape[2]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    future = torch.arange(total)[None, :] > torch.arange(total - new, total)[:, None]
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


def attention_with_cache__query_cannot_see_itself(q, k, v):
    """Masks the key at the query's own position too (>= instead of >)."""
    new, total = q.shape[2], k.shape[2]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    future = torch.arange(total)[None, :] >= torch.arange(total - new, total)[:, None]
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


def kv_cache_bytes__keys_only(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1,
                              bytes_per_value=2):
    """Forgets the values: counts one tensor per layer instead of two."""
    return num_layers * num_kv_heads * head_dim * num_tokens * batch_size * bytes_per_value


def kv_cache_bytes__returns_float(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1,
                                  bytes_per_value=2):
    """Returns a float (computed through bits / 8) instead of an int number of bytes."""
    bits = 2 * num_layers * num_kv_heads * head_dim * num_tokens * batch_size * 8 * bytes_per_value
    return bits / 8


def kv_cache_bytes__ignores_batch(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1,
                                  bytes_per_value=2):
    """Forgets that every sequence of the batch has its own cache."""
    return 2 * num_layers * num_kv_heads * head_dim * num_tokens * bytes_per_value


def sliding_window_mask__window_off_by_one(num_queries, num_keys, window):
    """Lets a query see window + 1 keys (p - j <= window)."""
    query_pos = torch.arange(num_keys - num_queries, num_keys)[:, None]
    key_pos = torch.arange(num_keys)[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed &= query_pos - key_pos <= window
    return allowed


def sliding_window_mask__queries_at_start(num_queries, num_keys, window):
    """Places the queries at positions 0..num_queries-1 instead of the last ones."""
    query_pos = torch.arange(num_queries)[:, None]
    key_pos = torch.arange(num_keys)[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed &= query_pos - key_pos < window
    return allowed


def sliding_window_mask__window_forgets_causality(num_queries, num_keys, window):
    """With a window, allows |p - j| < window: keys from the future too."""
    query_pos = torch.arange(num_keys - num_queries, num_keys)[:, None]
    key_pos = torch.arange(num_keys)[None, :]
    if window is None:
        return key_pos <= query_pos
    return (query_pos - key_pos).abs() < window
