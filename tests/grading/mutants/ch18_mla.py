"""Plausible wrong answers to chapter 18's MLA lab; the graded tests must catch each one.
Each mutant replaces the solution function named before its ``__``."""

import torch


def split_up_projection__values_first(kv_b_weight, num_heads, nope_dim, v_dim):
    """Takes each head's value rows before its key rows."""
    per_head = kv_b_weight.view(num_heads, nope_dim + v_dim, -1)
    return per_head[:, v_dim:], per_head[:, :v_dim]


def split_up_projection__all_keys_then_all_values(kv_b_weight, num_heads, nope_dim, v_dim):
    """Reads the weight as every head's keys, then every head's values."""
    keys, values = kv_b_weight.split([num_heads * nope_dim, num_heads * v_dim])
    return keys.view(num_heads, nope_dim, -1), values.view(num_heads, v_dim, -1)


def absorbed_decode__no_rope_term(q_nope, q_rot, latents, rope_keys, context_lens, w_uk,
                                  w_uv, scale):
    """Forgets the decoupled rotary part of the score."""
    scores = torch.einsum("shd,hdr,str->sht", q_nope, w_uk, latents) * scale
    beyond = torch.arange(latents.shape[1])[None, None] >= context_lens[:, None, None]
    weights = scores.masked_fill(beyond, float("-inf")).softmax(-1)
    return torch.einsum("sht,str,hvr->shv", weights, latents, w_uv)


def absorbed_decode__reads_past_the_length(q_nope, q_rot, latents, rope_keys, context_lens,
                                           w_uk, w_uv, scale):
    """Attends over every slot, the garbage past each sequence's length included."""
    scores = (torch.einsum("shd,hdr,str->sht", q_nope, w_uk, latents)
              + torch.einsum("shd,std->sht", q_rot, rope_keys)) * scale
    return torch.einsum("sht,str,hvr->shv", scores.softmax(-1), latents, w_uv)


def absorbed_decode__off_by_one_length(q_nope, q_rot, latents, rope_keys, context_lens, w_uk,
                                       w_uv, scale):
    """Treats the new token's slot as outside the context (a strict < on the wrong side)."""
    scores = (torch.einsum("shd,hdr,str->sht", q_nope, w_uk, latents)
              + torch.einsum("shd,std->sht", q_rot, rope_keys)) * scale
    beyond = torch.arange(latents.shape[1])[None, None] >= (context_lens - 1)[:, None, None]
    beyond[..., 0] = False
    weights = scores.masked_fill(beyond, float("-inf")).softmax(-1)
    return torch.einsum("sht,str,hvr->shv", weights, latents, w_uv)


def absorbed_decode__first_head_weights_for_all(q_nope, q_rot, latents, rope_keys,
                                                context_lens, w_uk, w_uv, scale):
    """Absorbs head 0's W_UK and W_UV into every head."""
    heads = q_nope.shape[1]
    w_uk, w_uv = w_uk[:1].expand(heads, -1, -1), w_uv[:1].expand(heads, -1, -1)
    scores = (torch.einsum("shd,hdr,str->sht", q_nope, w_uk, latents)
              + torch.einsum("shd,std->sht", q_rot, rope_keys)) * scale
    beyond = torch.arange(latents.shape[1])[None, None] >= context_lens[:, None, None]
    weights = scores.masked_fill(beyond, float("-inf")).softmax(-1)
    return torch.einsum("sht,str,hvr->shv", weights, latents, w_uv)


def absorbed_decode__scale_after_softmax(q_nope, q_rot, latents, rope_keys, context_lens,
                                         w_uk, w_uv, scale):
    """Applies the softmax scale to the output instead of the scores."""
    scores = (torch.einsum("shd,hdr,str->sht", q_nope, w_uk, latents)
              + torch.einsum("shd,std->sht", q_rot, rope_keys))
    beyond = torch.arange(latents.shape[1])[None, None] >= context_lens[:, None, None]
    weights = scores.masked_fill(beyond, float("-inf")).softmax(-1)
    return torch.einsum("sht,str,hvr->shv", weights, latents, w_uv) * scale


def absorbed_decode__softmax_over_heads(q_nope, q_rot, latents, rope_keys, context_lens, w_uk,
                                        w_uv, scale):
    """Normalises across heads instead of across cached tokens."""
    scores = (torch.einsum("shd,hdr,str->sht", q_nope, w_uk, latents)
              + torch.einsum("shd,std->sht", q_rot, rope_keys)) * scale
    beyond = torch.arange(latents.shape[1])[None, None] >= context_lens[:, None, None]
    weights = scores.masked_fill(beyond, -1e9).softmax(1).masked_fill(beyond, 0.0)
    return torch.einsum("sht,str,hvr->shv", weights, latents, w_uv)
