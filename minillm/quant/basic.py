"""Round-to-nearest quantization: absmax (symmetric) and zero-point (asymmetric).

A b-bit integer grid stands in for a range of real numbers. With step (scale) Δ:

* **absmax / symmetric**: q = round(w / Δ), Δ = max|w| / (2^(b-1) - 1), q in
  [-(2^(b-1) - 1), 2^(b-1) - 1]; zero maps to zero exactly.
* **zero-point / asymmetric**: q = round(w / Δ) + z, Δ = (max w - min w) / (2^b - 1),
  z = round(-min w / Δ), q in [0, 2^b - 1]; the grid covers [min, max] exactly, which
  helps when the weights are not centred on zero.

Dequantizing gives Δ (q - z); for values inside the range the rounding error is at most
Δ/2. Two variations:

* ``float_zero=True`` keeps z as a real number, so the grid starts exactly at the minimum:
  w ≈ Δ q + min, llama.cpp's Q4_1. (An integer z, as GPTQ/AWQ kernels store it, shifts
  the grid by up to Δ/2.) SmolLM2's course weights were Q4_1 with groups of 32, so this
  scheme at 4 bits, group 32 reproduces them exactly and the integer one does not.
* ``clip_ratio < 1`` shrinks the range (max|w|, or min and max) before choosing Δ: the
  few largest weights are clipped, every other weight gets a finer grid. The best ratio
  minimises the mean squared error (:func:`clipping_mse`).

Scales can be shared by the whole tensor, by each output channel (row), or by groups
of ``group_size`` consecutive inputs in each row (what GPTQ/AWQ "g128" means). When the
row length is not a multiple of the group size (SmolLM2's 576 = 4.5 x 128), the last
group is shorter: we pad it by repeating its last column, which changes no min or max.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class QuantScheme:
    bits: int = 4
    symmetric: bool = False
    group_size: int | None = 128  # None: one scale per output channel (row)
    per_tensor: bool = False  # one scale for the whole tensor (overrides group_size)
    float_zero: bool = False  # asymmetric only: keep the zero point unrounded (Q4_1)
    clip_ratio: float = 1.0  # fraction of the range (absmax, or min and max) the grid covers

    def __post_init__(self):
        if not 2 <= self.bits <= 8:
            raise ValueError(f"bits must be between 2 and 8, got {self.bits}")
        if self.group_size is not None and self.group_size < 1:
            raise ValueError(f"group_size must be positive or None, got {self.group_size}")
        if not 0 < self.clip_ratio <= 1:
            raise ValueError(f"clip_ratio must be in (0, 1], got {self.clip_ratio}")


@dataclass
class Quantized:
    """Integer codes plus what is needed to map them back to real numbers."""

    codes: torch.Tensor  # int8/uint8 codes, shaped like the weight: [out, in]
    scales: torch.Tensor  # [out, groups] (or [1, 1] per tensor)
    zeros: torch.Tensor  # same shape as scales; all zero for symmetric schemes
    scheme: QuantScheme

    def dequantize(self) -> torch.Tensor:
        groups = _grouped(self.codes.float(), self.scheme)
        weight = (groups - self.zeros[..., None]) * self.scales[..., None]
        return _ungrouped(weight, self.codes.shape, self.scheme)


def _grouped(weight: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """View ``weight`` [out, in] as [rows, groups, group_size] for per-group statistics."""
    out, inp = weight.shape
    if scheme.per_tensor:
        return weight.reshape(1, 1, -1)
    size = min(scheme.group_size or inp, inp)
    short = -inp % size
    if short:  # a shorter last group: repeat its last column (no new min or max)
        weight = torch.cat([weight, weight[:, -1:].expand(out, short)], dim=1)
    return weight.reshape(out, -1, size)


def _ungrouped(groups: torch.Tensor, shape: torch.Size, scheme: QuantScheme) -> torch.Tensor:
    """The inverse of :func:`_grouped`: back to [out, in], dropping any padding."""
    rows, cols = (1, shape[0] * shape[1]) if scheme.per_tensor else shape
    return groups.reshape(rows, -1)[:, :cols].reshape(shape)


def quantize(weight: torch.Tensor, scheme: QuantScheme) -> Quantized:
    """Round ``weight`` [out, in] to ``scheme``'s integer grid (round to nearest)."""
    groups = _grouped(weight.float(), scheme)
    if scheme.symmetric:
        q_max = 2 ** (scheme.bits - 1) - 1
        scales = (groups.abs().amax(dim=-1) * scheme.clip_ratio).clamp(min=1e-12) / q_max
        zeros = torch.zeros_like(scales)
        codes = torch.clamp(torch.round(groups / scales[..., None]), -q_max, q_max)
        dtype = torch.int8
    else:
        q_max = 2**scheme.bits - 1
        low = groups.amin(dim=-1) * scheme.clip_ratio
        high = groups.amax(dim=-1) * scheme.clip_ratio
        scales = ((high - low) / q_max).clamp(min=1e-12)
        if scheme.float_zero:
            zeros = -low / scales
            codes = torch.round(groups / scales[..., None] + zeros[..., None])
        else:
            zeros = torch.round(-low / scales)
            codes = torch.round(groups / scales[..., None]) + zeros[..., None]
        codes = torch.clamp(codes, 0, q_max)
        dtype = torch.uint8
    return Quantized(_ungrouped(codes.to(dtype), weight.shape, scheme), scales, zeros, scheme)


def fake_quantize(weight: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """Quantize then dequantize: the weight the quantized model effectively uses."""
    return quantize(weight, scheme).dequantize().to(weight.dtype)


def clipping_mse(weight: torch.Tensor, scheme: QuantScheme,
                 ratios: torch.Tensor) -> torch.Tensor:
    """Mean squared error of :func:`fake_quantize` for each clip ratio in ``ratios``.

    Clipping trades a large error on the few weights beyond the range for a finer step on
    all the others; for bell-shaped weights at few bits the minimum lies below 1.
    """
    weight = weight.float()
    return torch.stack([
        (fake_quantize(weight, replace(scheme, clip_ratio=float(r))) - weight).pow(2).mean()
        for r in ratios])


def half_rounded_up(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp16, rounded up where rounding to nearest went down (for positive scales).

    A scale stored in fp16 must not shrink: ``max|w| / scale`` would then exceed the top
    code and the largest weights would be clipped.
    """
    half = x.half()
    return torch.where(half.float() < x, torch.nextafter(half, torch.full_like(half, torch.inf)),
                       half)
