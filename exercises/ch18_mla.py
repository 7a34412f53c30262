# Generated from solutions/ch18_mla.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 18: multi-head latent attention. The cache holds one latent vector and one shared
rotary key per token; a decode step attends over them without ever expanding a head's keys
or values (DeepSeek-V2 §2.1.2, "absorbed" matrices). The library's version is
:meth:`minillm.mla.LatentAttention.attend_absorbed`; the graded tests compare yours with it
and with the expanded form."""

from __future__ import annotations

import torch


def split_up_projection(kv_b_weight: torch.Tensor, num_heads: int, nope_dim: int,
                        v_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 18.4: Cut the checkpoint's ``kv_b_proj`` weight into each head's W_UK and W_UV.

    kv_b_weight: [num_heads * (nope_dim + v_dim), kv_lora_rank], the ``nn.Linear`` weight
        that maps a latent c to every head's non-rotary key and value, laid out head by head:
        rows h*(nope_dim + v_dim) ... are head h's key rows, then its value rows.
    Returns (w_uk [num_heads, nope_dim, rank], w_uv [num_heads, v_dim, rank]) such that head
    h's key is ``w_uk[h] @ c`` and its value ``w_uv[h] @ c``. Views are fine; do not copy
    more than needed. A weight whose rows do not match the sizes is a ValueError that says so.
    """
    raise NotImplementedError("Exercise 18.4: Cut the checkpoint's ``kv_b_proj`` weight into each head's W_UK and W_UV")


def absorbed_decode(q_nope: torch.Tensor, q_rot: torch.Tensor, latents: torch.Tensor,
                    rope_keys: torch.Tensor, context_lens: torch.Tensor, w_uk: torch.Tensor,
                    w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """Exercise 18.5: One decode step of MLA for a batch of sequences, read from the latent cache.

    q_nope [seqs, heads, nope_dim], q_rot [seqs, heads, rope_dim]: each sequence's new query
        (rope already applied to q_rot).
    latents [seqs, slots, rank], rope_keys [seqs, slots, rope_dim]: the cache; sequence s
        owns its first ``context_lens[s]`` slots (its new token included); later slots hold
        garbage (any finite values) and must not change the output.
    w_uk [heads, nope_dim, rank], w_uv [heads, v_dim, rank]: from :func:`split_up_projection`.
    scale: the softmax scale (1/sqrt(nope_dim + rope_dim) for DeepSeek without YaRN).
    Returns [seqs, heads, v_dim]: softmax(scale * (q_nope . k_nope + q_rot . k_rot)) @ v per
    head, equal to attention over the expanded keys [W_UK c ; k_rot] and values W_UV c, but
    without ever forming a [seqs, heads, slots, ...] key or value tensor. Every
    context_lens[s] >= 1. Works in the inputs' dtype (float32 or float64).
    Hint: DeepSeek-V2 eq. (10) and the chapter's section "Absorbing the up-projections".
    """
    raise NotImplementedError("Exercise 18.5: One decode step of MLA for a batch of sequences, read from the latent cache")
