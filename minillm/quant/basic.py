"""Round-to-nearest quantization: absmax (symmetric) and zero-point (asymmetric).

A b-bit integer grid stands in for a range of real numbers. With step (scale) Δ:

* **absmax / symmetric**: q = round(w / Δ), Δ = max|w| / (2^(b-1) - 1), q in
  [-(2^(b-1) - 1), 2^(b-1) - 1]; zero maps to zero exactly.
* **zero-point / asymmetric**: q = round(w / Δ) + z, Δ = (max w - min w) / (2^b - 1),
  z = round(-min w / Δ), q in [0, 2^b - 1]; the grid covers [min, max] exactly, which
  helps when the weights are not centred on zero.

Dequantizing gives Δ (q - z); for values inside the range the rounding error is at most
Δ/2. Scales can be shared by the whole tensor, by each output channel (row), or by groups
of ``group_size`` consecutive inputs in each row (what GPTQ/AWQ "g128" means). When the
row length is not a multiple of the group size (SmolLM2's 576 = 4.5 x 128), the last
group is shorter: we pad it by repeating its last column, which changes no min or max.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantScheme:
    bits: int = 4
    symmetric: bool = False
    group_size: int | None = 128  # None: one scale per output channel (row)
    per_tensor: bool = False  # one scale for the whole tensor (overrides group_size)

    def __post_init__(self):
        if not 2 <= self.bits <= 8:
            raise ValueError(f"bits must be between 2 and 8, got {self.bits}")
        if self.group_size is not None and self.group_size < 1:
            raise ValueError(f"group_size must be positive or None, got {self.group_size}")


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
        scales = groups.abs().amax(dim=-1).clamp(min=1e-12) / q_max
        zeros = torch.zeros_like(scales)
        codes = torch.clamp(torch.round(groups / scales[..., None]), -q_max, q_max)
        dtype = torch.int8
    else:
        q_max = 2**scheme.bits - 1
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        scales = ((high - low) / q_max).clamp(min=1e-12)
        zeros = torch.round(-low / scales)
        codes = torch.clamp(torch.round(groups / scales[..., None]) + zeros[..., None], 0, q_max)
        dtype = torch.uint8
    return Quantized(_ungrouped(codes.to(dtype), weight.shape, scheme), scales, zeros, scheme)


def fake_quantize(weight: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """Quantize then dequantize: the weight the quantized model effectively uses."""
    return quantize(weight, scheme).dequantize().to(weight.dtype)
