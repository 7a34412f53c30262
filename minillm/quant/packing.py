"""Packing 4-bit codes two to a byte (low nibble first), and unpacking them.

PyTorch has no 4-bit dtype, so int4 weights live in uint8 tensors holding two codes each:
byte = low | (high << 4). This halves memory; the kernels unpack on the fly.
"""

from __future__ import annotations

import torch


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes in [0, 15], [..., n] with n even -> packed bytes [..., n // 2]."""
    if codes.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even to pack pairs, got {codes.shape[-1]}")
    if codes.dtype != torch.uint8 or int(codes.max()) > 15:
        raise ValueError("pack_int4 takes uint8 codes between 0 and 15")
    low, high = codes[..., 0::2], codes[..., 1::2]
    return low | (high << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Packed bytes [..., n] -> uint8 codes [..., 2n], the inverse of :func:`pack_int4`."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)
