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


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes of ``bits`` bits, [..., n] -> a dense bit stream [..., n * bits / 8].

    Code i occupies stream bits i*bits ... i*bits + bits - 1, least significant first, so
    for ``bits=4`` this is exactly :func:`pack_int4`, and 3-bit codes take 3 bytes per 8.
    """
    n = codes.shape[-1]
    if not 1 <= bits <= 8 or (n * bits) % 8:
        raise ValueError(f"{n} codes of {bits} bits do not fill whole bytes")
    if codes.dtype != torch.uint8 or int(codes.max()) >= 2**bits:
        raise ValueError(f"pack_bits takes uint8 codes between 0 and {2**bits - 1}")
    planes = (codes[..., None] >> torch.arange(bits, dtype=torch.uint8)) & 1  # [..., n, bits]
    stream = planes.flatten(-2).unflatten(-1, (-1, 8))  # [..., bytes, 8 bits]
    return (stream << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of :func:`pack_bits`: [..., m] bytes -> [..., m * 8 / bits] uint8 codes."""
    stream = (packed[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1  # [..., m, 8]
    planes = stream.flatten(-2).unflatten(-1, (-1, bits))  # [..., codes, bits]
    return (planes << torch.arange(bits, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)
