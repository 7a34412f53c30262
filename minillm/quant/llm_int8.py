"""LLM.int8(): int8 matrix multiplication with outlier decomposition (Dettmers et al. 2022).

**Vector-wise quantization** (§3.1, eq. 1–2): for Y = X Wᵀ with X [tokens, in] and
W [out, in], give every *row* of X (token) and every *row* of W (output channel) its own
absmax scale, s_x = max|X_i| / 127 and s_w = max|W_j| / 127. Then

    Y_ij ≈ s_x,i · s_w,j · Σ_k X8_ik W8_jk,

an integer dot product (int8 × int8, accumulated in int32) rescaled by an outer product.

**Outlier decomposition** (§3.2, eq. 3): in large models a few hidden *dimensions* carry
values far above the rest (|x| ≥ 6). One of them in a row makes s_x huge, and every other
value of that row rounds to a handful of levels. So the feature dimensions O where any
token has |x| ≥ threshold are multiplied in high precision, the rest in int8:

    Y ≈ X[:, O] W[:, O]ᵀ + S ∘ (X8[:, ¬O] W8[:, ¬O]ᵀ).

As in bitsandbytes, W is stored once in int8; its outlier columns are dequantized when
needed. PyTorch has no int8 matmul on the CPU, so we simulate it *exactly*: fp32 represents
every integer below 2²⁴, and a dot product of at most 1040 int8 pairs stays below
1040 · 127² < 2²⁴, so fp32 matmuls over chunks of 1040 inputs are exact, and the chunks
are added in float64, as int32 accumulation would be.
"""

from __future__ import annotations

import torch
from torch import nn

from ..linear import DEFAULT_SKIP, CompressedLinear, replace_linears
from .basic import half_rounded_up

DEFAULT_THRESHOLD = 6.0  # the paper's outlier magnitude (§3.2)
_EXACT_CHUNK = 2**24 // 127**2  # int8 dot products of this length are exact in fp32


def absmax_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise absmax quantization of ``x`` [rows, cols] to int8 in [-127, 127].

    Returns (codes int8 [rows, cols], scales float32 [rows]); an all-zero row gets scale 1.
    """
    absmax = x.abs().amax(dim=1).float()
    scales = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    codes = torch.round(x.float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return codes, scales


def int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact ``a @ b.T`` for int8 ``a`` [n, k] and ``b`` [m, k], as float64 [n, m]."""
    if a.dtype != torch.int8 or b.dtype != torch.int8:
        raise ValueError(f"int8_matmul takes int8 tensors, got {a.dtype} and {b.dtype}")
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    for start in range(0, a.shape[1], _EXACT_CHUNK):
        cols = slice(start, start + _EXACT_CHUNK)
        out += (a[:, cols].float() @ b[:, cols].float().T).double()
    return out


def outlier_columns(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """Bool [cols]: feature dimensions where some row of ``x`` [rows, cols] has |x| ≥
    ``threshold``."""
    return (x.abs() >= threshold).any(dim=0)


def llm_int8_matmul(x: torch.Tensor, weight_codes: torch.Tensor, weight_scales: torch.Tensor,
                    threshold: float | None = DEFAULT_THRESHOLD) -> torch.Tensor:
    """Y = X Wᵀ by LLM.int8() (eq. 3) for ``x`` [tokens, in], int8 ``weight_codes`` [out, in]
    with scales [out]. ``threshold=None``: no decomposition, every column in int8 (W8A8)."""
    weight_scales = weight_scales.float()
    outliers = (outlier_columns(x, threshold) if threshold is not None
                else torch.zeros(x.shape[1], dtype=torch.bool, device=x.device))
    regular = x.masked_fill(outliers, 0)
    x_codes, x_scales = absmax_int8(regular)
    y = int8_matmul(x_codes, weight_codes) * x_scales.double()[:, None] \
        * weight_scales.double()[None, :]
    if outliers.any():
        w_outliers = weight_codes[:, outliers].float() * weight_scales[:, None]
        y += (x[:, outliers].float() @ w_outliers.T).double()
    return y.to(x.dtype)


class Int8Linear(CompressedLinear):
    """A linear layer with an int8 weight (per-output-channel fp16 scales) that multiplies
    int8 activations, keeping outlier feature dimensions in high precision (LLM.int8())."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 threshold: float | None = DEFAULT_THRESHOLD):
        super().__init__(weight.shape[1], weight.shape[0], bias)
        if threshold is not None and threshold <= 0:
            raise ValueError(f"threshold must be positive (or None for plain W8A8), "
                             f"got {threshold}")
        self.threshold = threshold
        weight = weight.detach().float()
        scales = half_rounded_up(weight.abs().amax(dim=1).clamp(min=1e-12) / 127)
        codes = torch.round(weight / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_codes", codes)
        self.register_buffer("weight_scales", scales)

    @classmethod
    def from_linear(cls, linear: nn.Linear,
                    threshold: float | None = DEFAULT_THRESHOLD) -> Int8Linear:
        return cls(linear.weight, linear.bias, threshold)

    def format_config(self) -> dict:
        return {"threshold": self.threshold}

    def dense_weight(self) -> torch.Tensor:
        return self.weight_codes.float() * self.weight_scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        y = llm_int8_matmul(flat, self.weight_codes, self.weight_scales, self.threshold)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)


def quantize_model_llm_int8(model: nn.Module, *,
                            threshold: float | None = DEFAULT_THRESHOLD,
                            skip: tuple[str, ...] = DEFAULT_SKIP,
                            progress: bool = False) -> nn.Module:
    """Replace the model's ``nn.Linear`` layers (except ``skip``) by :class:`Int8Linear`."""
    return replace_linears(model, lambda linear: Int8Linear.from_linear(linear, threshold),
                           skip, progress="LLM.int8" if progress else None)
