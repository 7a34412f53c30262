"""Chapter 04: MHA, MQA and GQA — sharing key/value heads between query heads."""

from __future__ import annotations

import math

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       bytes_per_value: int = 2) -> int:
    """Exercise 04.1: Return how many bytes of KV cache one token costs.

    Every layer stores one key and one value vector of head_dim numbers per K/V head.
    Hint: Llama-2-7B (32 layers, 32 KV heads, head_dim 128, fp16) costs 512 KiB per token;
    Llama-2-70B has 80 layers but only 8 KV heads.
    """
    ### BEGIN SOLUTION
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_value
    ### END SOLUTION


def repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    """Exercise 04.2: Give every query head its own copy of its group's K/V head.

    x: [batch, kv_heads, seq, head_dim] -> [batch, kv_heads * times, seq, head_dim], where
    output head h is input head h // times (heads of one group are adjacent).
    Hint: index x[:, :, None] and expand, then reshape; or torch.repeat_interleave.
    """
    ### BEGIN SOLUTION
    b, kv_heads, seq, d = x.shape
    return x[:, :, None].expand(b, kv_heads, times, seq, d).reshape(b, kv_heads * times, seq, d)
    ### END SOLUTION


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      causal: bool = True) -> torch.Tensor:
    """Exercise 04.3: Attention where groups of query heads share a K/V head, without copies.

    q: [batch, heads, seq, d]; k, v: [batch, kv_heads, seq, d]; heads = kv_heads * groups.
    Returns [batch, heads, seq, d], equal to attention with repeat_kv(k), repeat_kv(v),
    but never materialises the repeated K and V.
    Hint: view q as [batch, kv_heads, groups * seq, d]: each K/V head then meets all its
    queries in one matmul. With causal=True, query position i sees keys 0..i.
    """
    ### BEGIN SOLUTION
    b, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    qg = q.reshape(b, kv_heads, groups * seq, d)
    scores = qg @ k.transpose(-2, -1) / math.sqrt(d)  # [b, kv_heads, groups * seq, seq]
    if causal:
        positions = torch.arange(seq, device=q.device).repeat(groups)  # query row -> position
        future = torch.arange(seq, device=q.device)[None, :] > positions[:, None]
        scores = scores.masked_fill(future, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.reshape(b, heads, seq, d)
    ### END SOLUTION


def mean_pool_kv_projection(weight: torch.Tensor, num_kv_heads: int, new_kv_heads: int,
                            head_dim: int) -> torch.Tensor:
    """Exercise 04.4: Merge K (or V) projection heads by averaging them (GQA paper, sec. 2.1).

    weight: [num_kv_heads * head_dim, hidden], the rows of head j are j*head_dim..(j+1)*head_dim.
    Returns [new_kv_heads * head_dim, hidden] where new head g is the mean of the old heads
    g * r .. (g + 1) * r - 1, with r = num_kv_heads // new_kv_heads.
    Hint: view the weight as [new_kv_heads, r, head_dim, hidden] and average over r.
    """
    ### BEGIN SOLUTION
    hidden = weight.shape[-1]
    r = num_kv_heads // new_kv_heads
    return weight.view(new_kv_heads, r, head_dim, hidden).mean(dim=1).reshape(-1, hidden)
    ### END SOLUTION
