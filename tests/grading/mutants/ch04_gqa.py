"""Plausible wrong answers to chapter 04 (MHA, MQA, GQA); the graded tests must catch each
one. Each mutant replaces the solution function named before its ``__``."""

import math

import torch


def kv_bytes_per_token__keys_only(num_layers, num_kv_heads, head_dim, bytes_per_value=2):
    """Forgets the value vectors: half the bytes."""
    return num_layers * num_kv_heads * head_dim * bytes_per_value


def kv_bytes_per_token__returns_float(num_layers, num_kv_heads, head_dim, bytes_per_value=2):
    """Returns a float (KiB times 1024) instead of an int number of bytes."""
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_value / 1024 * 1024


def repeat_kv__tiles_heads(x, times):
    """Tiles the heads (0, 1, 2, 0, 1, 2) instead of repeating each (0, 0, 1, 1, 2, 2)."""
    return x.repeat(1, times, 1, 1)


def repeat_kv__repeats_positions(x, times):
    """Repeats along the sequence axis instead of the head axis."""
    b, kv_heads, seq, d = x.shape
    return x.repeat_interleave(times, dim=2).reshape(b, kv_heads * times, seq, d)


def grouped_attention__mask_positions_not_repeated(q, k, v, causal=True):
    """Builds the causal mask for rows 0..groups*seq-1 instead of each group's positions."""
    b, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    qg = q.reshape(b, kv_heads, groups * seq, d)
    scores = qg @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        future = torch.arange(seq)[None, :] > torch.arange(groups * seq)[:, None]
        scores = scores.masked_fill(future, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).reshape(b, heads, seq, d)


def grouped_attention__group_major_heads(q, k, v, causal=True):
    """Groups query heads h, h + kv_heads, ... (h % kv_heads) instead of adjacent heads."""
    b, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    qg = q.reshape(b, groups, kv_heads, seq, d).transpose(1, 2).reshape(b, kv_heads, -1, d)
    scores = qg @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        positions = torch.arange(seq).repeat(groups)
        scores = scores.masked_fill(torch.arange(seq)[None, :] > positions[:, None],
                                    float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.reshape(b, kv_heads, groups, seq, d).transpose(1, 2).reshape(b, heads, seq, d)


def grouped_attention__always_causal(q, k, v, causal=True):
    """Ignores causal=False and always masks the future."""
    b, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    qg = q.reshape(b, kv_heads, groups * seq, d)
    scores = qg @ k.transpose(-2, -1) / math.sqrt(d)
    positions = torch.arange(seq).repeat(groups)
    scores = scores.masked_fill(torch.arange(seq)[None, :] > positions[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).reshape(b, heads, seq, d)


def mean_pool_kv_projection__sum(weight, num_kv_heads, new_kv_heads, head_dim):
    """Sums the heads of a group instead of averaging them."""
    hidden = weight.shape[-1]
    r = num_kv_heads // new_kv_heads
    return weight.view(new_kv_heads, r, head_dim, hidden).sum(dim=1).reshape(-1, hidden)


def mean_pool_kv_projection__strided_heads(weight, num_kv_heads, new_kv_heads, head_dim):
    """Averages heads g, g + new, g + 2 new, ... instead of the adjacent heads g*r..g*r+r-1."""
    hidden = weight.shape[-1]
    r = num_kv_heads // new_kv_heads
    return weight.view(r, new_kv_heads, head_dim, hidden).mean(dim=0).reshape(-1, hidden)


def mean_pool_kv_projection__averages_rows(weight, num_kv_heads, new_kv_heads, head_dim):
    """Averages neighbouring rows (views [new, head_dim, r, hidden]) instead of whole heads."""
    hidden = weight.shape[-1]
    r = num_kv_heads // new_kv_heads
    return weight.view(new_kv_heads, head_dim, r, hidden).mean(dim=2).reshape(-1, hidden)
