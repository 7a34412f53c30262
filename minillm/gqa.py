"""Changing how many key/value heads a trained model has: MHA <-> GQA <-> MQA.

With ``num_kv_heads`` key/value heads shared by ``num_heads`` query heads, the KV cache
per token is ``2 * layers * num_kv_heads * head_dim`` values: MQA (one K/V head) and GQA
(a few) shrink it by ``num_heads / num_kv_heads`` compared with MHA.

* :func:`expand_kv_heads` turns a GQA model into an exactly equivalent MHA model by
  copying each K/V head's projection for every query head of its group: same logits,
  more cache. It shows GQA *is* MHA with tied K/V heads.
* :func:`pool_kv_heads` goes the other way with the recipe of the GQA paper (Ainslie et
  al. 2023, sec. 2.1): the new K (and V) projection of a group is the *mean* of the
  projections of the heads it merges. The model then needs "uptraining" to recover; here
  we measure how much it loses without it.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import nn

from .model import Transformer


def regroup_kv_projection(proj: nn.Linear, old_heads: int, new_heads: int,
                          head_dim: int) -> nn.Linear:
    """Rows of a K or V projection, [old_heads * head_dim, hidden] -> [new_heads * ...]."""
    weight = proj.weight.detach().view(old_heads, head_dim, -1)
    if new_heads > old_heads:
        weight = weight.repeat_interleave(new_heads // old_heads, dim=0)
    else:
        weight = weight.view(new_heads, old_heads // new_heads, head_dim, -1).mean(dim=1)
    bias = None
    if proj.bias is not None:
        b = proj.bias.detach().view(old_heads, head_dim)
        b = (b.repeat_interleave(new_heads // old_heads, 0) if new_heads > old_heads
             else b.view(new_heads, -1, head_dim).mean(1))
        bias = b.reshape(-1)
    new = nn.Linear(weight.shape[-1], new_heads * head_dim, bias=bias is not None,
                    dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        new.weight.copy_(weight.reshape(new_heads * head_dim, -1))
        if bias is not None:
            new.bias.copy_(bias)
    return new


def with_kv_heads(model: Transformer, num_kv_heads: int) -> Transformer:
    """A copy of ``model`` with ``num_kv_heads`` K/V heads (more: exact copies; fewer: means)."""
    config = model.config
    old = config.num_kv_heads
    if config.num_heads % num_kv_heads or (old % num_kv_heads and num_kv_heads % old):
        raise ValueError(
            f"cannot go from {old} to {num_kv_heads} K/V heads with {config.num_heads} query "
            "heads: the new count must divide the query heads, and the old count must "
            "divide it or be divided by it.")
    new_model = copy.deepcopy(model)
    new_model.config = replace(config, num_kv_heads=num_kv_heads)
    for layer in new_model.layers:
        attn = layer.attn
        for name in ("k_proj", "v_proj"):
            setattr(attn, name, regroup_kv_projection(getattr(attn, name), old, num_kv_heads,
                                                      config.head_dim))
        attn.num_kv_heads = num_kv_heads
    return new_model


def expand_kv_heads(model: Transformer) -> Transformer:
    """GQA/MQA -> MHA, exactly: every query head gets its own copy of its group's K/V head."""
    return with_kv_heads(model, model.config.num_heads)


def pool_kv_heads(model: Transformer, num_kv_heads: int) -> Transformer:
    """Merge K/V heads by mean-pooling their projections (GQA paper, sec. 2.1)."""
    if num_kv_heads > model.config.num_kv_heads:
        raise ValueError("pooling reduces the number of K/V heads; use expand_kv_heads to add")
    return with_kv_heads(model, num_kv_heads)
