"""KIVI-style int4 KV cache (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit
Quantization for KV Cache"): keys per channel, values per token, the newest keys in full
precision until their group fills.

Keys have a few channels of large magnitude (outliers that stay in the same channels from
token to token), so rounding each token's key by its own range wastes the grid on those
channels; KIVI rounds each channel over a group of tokens instead. Values have no such
channels and are rounded per token. Both are asymmetric 4-bit, with a float minimum::

    scale = (max - min) / 15     code = round((x - min) / scale) in 0..15     x ~ min + code scale

* **values**, per (token, KV head), over its ``head_dim`` channels: rounded as written;
* **keys**, per (block, KV head, channel), over the block's ``block_size`` tokens (a group
  is a block of the paged pool). A block can be rounded only once it is full, so its keys
  are kept in float32 in a small **staging** buffer while the sequence fills it, and
  rounded into the pool when a read needs it rounded.

Which keys a query reads rounded is a function of positions only, so batching, chunking,
preemption and speculation cannot change a token: the query of position ``p`` reads the
keys of every block that was full before it (``(i + 1) * block_size <= p``) rounded, and
the keys of its own block (the partial one) in float32, from the staging buffer. A block
leaves the staging buffer once the sequence's accepted tokens (those computed before the
step: a speculative guess may still be rejected and written again) have filled it.

Codes are packed two per byte along ``head_dim``. Per token and KV head of SmolLM2
(``head_dim`` 64, blocks of 16): keys 32 B of codes + 2 x 64 float32 per block / 16 = 32 B,
values 32 B + 8 B; 104 B against float32's 512 (4.9x).
"""

from __future__ import annotations

import torch

INT4_MAX = 15


def quantize_int4(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x rounded along ``dim`` (one group): (codes 0..15 uint8 like x, scales, minimums), the
    statistics with ``dim`` removed. A constant group has scale 0 and codes 0."""
    x = x.float()
    low, high = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    scales = (high - low) / INT4_MAX
    scaled = torch.where(scales > 0, (x - low) / scales, 0.0)
    codes = scaled.round().clamp(0, INT4_MAX).to(torch.uint8)
    return codes, scales.squeeze(dim), low.squeeze(dim)


def dequantize_int4(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor,
                    dim: int) -> torch.Tensor:
    """The float32 values of codes rounded along ``dim``."""
    return minimums.unsqueeze(dim) + codes.float() * scales.unsqueeze(dim)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 [..., n] (n even) -> bytes [..., n / 2]: channel 2i low, 2i + 1 high."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack` undone: [..., n / 2] bytes -> [..., n] codes."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)
