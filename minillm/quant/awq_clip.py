"""AWQ's clipping search (the reference code's auto_clip; :mod:`minillm.quant.awq`): per
weight group, the ratio r that clamps it to ± r·max|w| with the least output error, scored
exactly on the per-group Gram blocks of all calibration tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .basic import QuantScheme, _grouped, _ungrouped, fake_quantize


def _group_width(scheme: QuantScheme, in_features: int) -> int:
    if scheme.per_tensor:
        raise ValueError("clipping is searched per group or per channel, not per tensor")
    return min(scheme.group_size or in_features, in_features)


def group_grams(x: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """[groups, size, size]: the mean over tokens of x_g x_gᵀ for each group g of input
    channels (the diagonal blocks of XᵀX/n). A shorter last group is zero-padded, so the
    padding columns of a grouped weight add nothing."""
    size = _group_width(scheme, x.shape[-1])
    x = torch.nn.functional.pad(x, (0, -x.shape[-1] % size))
    grouped = x.reshape(x.shape[0], -1, size).transpose(0, 1)  # [groups, tokens, size]
    return grouped.transpose(1, 2) @ grouped / x.shape[0]


def scale_grams(grams: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The Gram blocks of x / s, from those of x: H_g ÷ (s_g s_gᵀ)."""
    groups, size, _ = grams.shape
    padded = torch.nn.functional.pad(scales, (0, groups * size - scales.numel()), value=1.0)
    per_group = padded.reshape(groups, size)
    return grams / (per_group[:, :, None] * per_group[:, None, :])


def group_errors(weight: torch.Tensor, approx: torch.Tensor, grams: torch.Tensor,
                 scheme: QuantScheme) -> torch.Tensor:
    """[out, groups]: mean over tokens of (x_g · (w_g − ŵ_g))², each weight group's share
    of the output error (the reference's auto_clip objective), as d_gᵀ H_g d_g with the
    Gram blocks ``grams`` of :func:`group_grams`: every calibration token counts, at a
    cost that does not grow with their number."""
    _group_width(scheme, weight.shape[1])
    diff = _grouped(weight - approx, scheme).transpose(0, 1)  # [groups, out, size]
    return ((diff @ grams) * diff).sum(dim=-1).T


def clip_weight(weight: torch.Tensor, ratios: torch.Tensor, scheme: QuantScheme
                ) -> torch.Tensor:
    """Clamp each weight group to ± ratio × its max |w| (ratios: [out, groups]), as the
    reference code does: with an asymmetric grid only the side that reaches past the
    bound is clipped, and the grid then spans the clamped [min, max]."""
    groups = _grouped(weight, scheme)
    bound = groups.abs().amax(dim=-1, keepdim=True) * ratios[..., None]
    return _ungrouped(torch.minimum(torch.maximum(groups, -bound), bound), weight.shape, scheme)


@dataclass(frozen=True)
class ClipSearch:
    ratios: torch.Tensor  # [out, groups]: the shrink factor chosen for each group's range
    errors: torch.Tensor  # [out, groups]: group_errors with those ratios
    unclipped: torch.Tensor  # [out, groups]: group_errors of plain round to nearest


def search_clip(weight: torch.Tensor, grams: torch.Tensor, scheme: QuantScheme,
                grid: int = 20, max_shrink: float = 0.5) -> ClipSearch:
    """Per group, the ratio r in 1, 1 - 1/grid, ... (down to 1 - max_shrink, exclusive) whose
    clipped (:func:`clip_weight`) round-to-nearest weights have the least output error on
    the calibration inputs summarised by ``grams`` (:func:`group_grams`)."""
    groups = -(-weight.shape[1] // _group_width(scheme, weight.shape[1]))
    if grams.shape[0] != groups:
        raise ValueError(f"{grams.shape[0]} Gram blocks for a weight of {groups} groups: "
                         "build them with group_grams(x, scheme) for the same scheme")
    unclipped = group_errors(weight, fake_quantize(weight, scheme), grams, scheme)
    best, ratios = unclipped, torch.ones_like(unclipped)
    for step in range(1, int(max_shrink * grid)):
        trial = torch.full_like(ratios, 1 - step / grid)
        approx = fake_quantize(clip_weight(weight, trial, scheme), scheme)
        errors = group_errors(weight, approx, grams, scheme)
        better = errors < best
        best, ratios = torch.where(better, errors, best), torch.where(better, trial, ratios)
    return ClipSearch(ratios, best, unclipped)
