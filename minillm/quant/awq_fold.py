"""Folding AWQ's scales into the float model (:mod:`minillm.quant.awq`): 1/s goes into the
op that produces a layer's input (an RMSNorm, up_proj's rows, v_proj's rows), s into the
input columns of the linears reading it, so the float model computes the same function."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..model import Attention, Block, GemmaRMSNorm, RMSNorm


def tie_to_kv_heads(values: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """Average a per-channel vector over the query heads that share a KV head, and repeat
    it back: o_proj input statistics whose scales can fold into v_proj's rows."""
    if num_heads % num_kv_heads or values.numel() % num_heads:
        raise ValueError(f"{values.numel()} channels do not split into {num_heads} heads in "
                         f"groups over {num_kv_heads} KV heads")
    grouped = values.reshape(num_kv_heads, num_heads // num_kv_heads, -1)
    return grouped.mean(dim=1, keepdim=True).expand_as(grouped).reshape(-1)


def _check_scales(scales: torch.Tensor, linears: Sequence[nn.Linear]) -> None:
    for linear in linears:
        if linear.in_features != scales.numel():
            raise ValueError(f"{scales.numel()} scales for a layer with "
                             f"{linear.in_features} inputs: scales must be one per input")
    if not (scales > 0).all():
        raise ValueError("scales must be positive (awq_scales makes them so)")


@torch.no_grad()
def fold_into_norm(norm: RMSNorm, linears: Sequence[nn.Linear], scales: torch.Tensor) -> None:
    """In place: RMSNorm weight ÷ s, following linears' input columns × s. The float model
    computes the same function, (W·diag(s))·(x/s) = W·x."""
    _check_scales(scales, linears)
    if isinstance(norm, GemmaRMSNorm):
        raise ValueError("a Gemma norm multiplies by (1 + w): dividing w by the scales would "
                         "not divide its output; AWQ folds into Llama-style RMSNorms only")
    norm.weight.div_(scales)
    for linear in linears:
        linear.weight.mul_(scales)


@torch.no_grad()
def fold_into_linear(previous: nn.Linear, linears: Sequence[nn.Linear],
                     scales: torch.Tensor) -> None:
    """In place: ``previous``'s output rows (and bias) ÷ s, the next linears' columns × s
    (up_proj before down_proj: silu(gate)·up is linear in up's output)."""
    _check_scales(scales, linears)
    if previous.out_features != scales.numel():
        raise ValueError(f"{scales.numel()} scales for a layer with {previous.out_features} "
                         "outputs: for v_proj -> o_proj with GQA use fold_into_values")
    previous.weight.div_(scales[:, None])
    if previous.bias is not None:
        previous.bias.div_(scales)
    for linear in linears:
        linear.weight.mul_(scales)


@torch.no_grad()
def fold_into_values(attn: Attention, scales: torch.Tensor) -> None:
    """In place: o_proj's input columns × s, v_proj's rows ÷ the matching KV-head scales.

    With GQA each value channel feeds the same channel of g query heads' outputs, so the
    scales must be equal across those heads (build them from :func:`tie_to_kv_heads`).
    """
    _check_scales(scales, [attn.o_proj])
    groups = attn.num_heads // attn.num_kv_heads
    per_head = scales.reshape(attn.num_kv_heads, groups, attn.head_dim)
    if not torch.equal(per_head, per_head[:, :1].expand_as(per_head)):
        raise ValueError("o_proj scales differ between query heads sharing a KV head: "
                         "build them from tie_to_kv_heads(...) statistics")
    value_scales = per_head[:, 0].reshape(-1)
    attn.v_proj.weight.div_(value_scales[:, None])
    if attn.v_proj.bias is not None:
        attn.v_proj.bias.div_(value_scales)
    attn.o_proj.weight.mul_(scales)


def fold_group(block: Block, previous: str, names: Sequence[str], scales: torch.Tensor) -> None:
    """Fold ``scales`` between ``block.<previous>`` and the linears ``names`` reading it."""
    linears = [block.get_submodule(name) for name in names]
    source = block.get_submodule(previous)
    if isinstance(source, RMSNorm):
        fold_into_norm(source, linears, scales)
    elif previous == "attn.v_proj" and names == ("attn.o_proj",):
        fold_into_values(block.attn, scales)
    else:
        fold_into_linear(source, linears, scales)
