"""FP8 E4M3 weights: one byte per weight, a floating-point grid instead of an integer one.

E4M3 (4 exponent bits, 3 mantissa bits, no infinities: ``torch.float8_e4m3fn``; chapter
02 draws its layout) spans ±448 with a *relative* step of 2⁻³: small weights get small
steps, large weights large ones, which suits bell-shaped weights better than the uniform
int8 grid. Hopper-class GPUs multiply FP8 natively; here we store FP8 and dequantize.

The formats are those of Micikevicius et al. 2022 ("FP8 formats for deep learning"), who
scale whole tensors; we give each output channel (row) a scale mapping its max|w| to 448,
the top of the format, so no weight overflows and the small rows use the fine end of the
grid too. The scale is stored in fp16, rounded up so that max|w| / scale never exceeds 448
(fp16 keeps full precision down to 2⁻¹⁴, i.e. for rows with max|w| ≥ 448 · 2⁻¹⁴ ≈ 0.027;
smaller rows never overflow either, but their top value lands a little below 448).
"""

from __future__ import annotations

import torch
from torch import nn

from ..linear import DEFAULT_SKIP, CompressedLinear, replace_linears
from .basic import half_rounded_up

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel scaled E4M3: (values float8_e4m3fn [out, in], scales fp16 [out])."""
    weight = weight.detach().float()
    scales = half_rounded_up(weight.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX)
    scaled = (weight / scales.float()[:, None]).clamp(-FP8_MAX, FP8_MAX)
    return scaled.to(FP8_DTYPE), scales


def dequantize_fp8(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 weight = fp8 value × its row's scale."""
    return values.float() * scales.float()[:, None]


class FP8Linear(CompressedLinear):
    """A linear layer stored as FP8 E4M3 (1 byte per weight) plus an fp16 scale per row."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(weight.shape[1], weight.shape[0], bias)
        values, scales = quantize_fp8(weight)
        self.register_buffer("values", values)
        self.register_buffer("scales", scales)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> FP8Linear:
        return cls(linear.weight, linear.bias)

    def dense_weight(self) -> torch.Tensor:
        return dequantize_fp8(self.values, self.scales)


def quantize_model_fp8(model: nn.Module, *, skip: tuple[str, ...] = DEFAULT_SKIP,
                       progress: bool = False) -> nn.Module:
    """Replace the model's ``nn.Linear`` layers (except ``skip``) by :class:`FP8Linear`."""
    return replace_linears(model, FP8Linear.from_linear, skip, progress="FP8" if progress else None)
