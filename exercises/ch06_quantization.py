# Generated from solutions/ch06_quantization.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 06: quantization basics — absmax, zero-point, groups, int4 packing, NF4."""

from __future__ import annotations

import torch


def absmax_quantize(x: torch.Tensor, bits: int,
                    clip_ratio: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 06.1: Absmax (symmetric) quantization of a whole tensor to b-bit integers.

    Δ = clip_ratio · max|x| / (2^(b-1) - 1) and q = round(x / Δ), clamped to the symmetric
    range [-(2^(b-1) - 1), 2^(b-1) - 1] (not down to -2^(b-1): -x must dequantize to the
    negative of x). clip_ratio < 1 clips: the largest |x| saturate at the end codes and
    every other value gets a finer grid (the library's QuantScheme.clip_ratio).
    Returns (codes as int8, shaped like x; Δ as a 0-d float32 tensor).
    An all-zero x must not divide by zero: use max(clip_ratio · max|x|, 1e-12) in Δ
    (codes are then 0).
    Hint: torch.round rounds halves to even, as the library does.
    """
    raise NotImplementedError("Exercise 06.1: Absmax (symmetric) quantization of a whole tensor to b-bit integers")


def absmax_dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Exercise 06.1: Map absmax codes back to real numbers.

    Returns Δ q as float32, shaped like the codes.
    """
    raise NotImplementedError("Exercise 06.1: Map absmax codes back to real numbers")


def zeropoint_quantize(x: torch.Tensor, bits: int, clip_ratio: float = 1.0
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exercise 06.2: Zero-point (asymmetric) quantization of a whole tensor to b bits.

    With low = clip_ratio · min x and high = clip_ratio · max x (clip_ratio < 1 clips,
    as in 06.1): Δ = max(high - low, 1e-12 × (2^b - 1)) / (2^b - 1) (so a constant tensor
    does not divide by zero), z = round(-low / Δ), q = round(x / Δ) + z clamped to
    [0, 2^b - 1]. Returns (codes as uint8, shaped like x; Δ; z), Δ and z as 0-d float32
    tensors. The zero point is not clamped: an all-negative tensor gets z > 2^b - 1, and
    its grid still covers [low, high].
    """
    raise NotImplementedError("Exercise 06.2: Zero-point (asymmetric) quantization of a whole tensor to b bits")


def zeropoint_dequantize(codes: torch.Tensor, scale: torch.Tensor,
                         zero: torch.Tensor) -> torch.Tensor:
    """Exercise 06.2: Map zero-point codes back to real numbers.

    Returns Δ (q - z) as float32, shaped like the codes.
    """
    raise NotImplementedError("Exercise 06.2: Map zero-point codes back to real numbers")


def groupwise_fake_quantize(weight: torch.Tensor, bits: int, group_size: int,
                            symmetric: bool = False) -> torch.Tensor:
    """Exercise 06.3: Quantize then dequantize a weight [out, in] with one scale per group.

    Each row is cut into in / group_size groups of consecutive columns (in is a multiple of
    group_size); every group gets its own Δ (and z), with the formulas of 06.1
    (symmetric=True) or 06.2 (symmetric=False). Returns the dequantized float32 weight,
    shaped like ``weight``: what a model with this quantized weight computes with.
    Hint: view the weight as [out, in // group_size, group_size] and reduce over the last
    dimension with keepdim=True; divide by Δ (as the library does) rather than multiply by 1/Δ.
    """
    raise NotImplementedError("Exercise 06.3: Quantize then dequantize a weight [out, in] with one scale per group")


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Exercise 06.4: Pack uint8 codes in [0, 15] two to a byte, the first in the low nibble.

    codes [..., n] with n even -> uint8 [..., n // 2] where byte j = codes[2j] | codes[2j+1] << 4.
    """
    raise NotImplementedError("Exercise 06.4: Pack uint8 codes in [0, 15] two to a byte, the first in the low nibble")


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Exercise 06.4: Unpack bytes into two 4-bit codes each, low nibble first.

    packed uint8 [..., n] -> codes uint8 [..., 2n], the inverse of pack_int4.
    """
    raise NotImplementedError("Exercise 06.4: Unpack bytes into two 4-bit codes each, low nibble first")


def nf4_quantize(blocks: torch.Tensor, levels: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 06.5: Quantize each row of blocks [n, block_size] to the nearest of 16 levels.

    levels: the 16 sorted NF4 levels in [-1, 1]. Each row is divided by its absmax c
    (use max(c, 1e-12) so an all-zero row stays 0), then every value becomes the index of
    the nearest level. Returns (codes uint8 [n, block_size], absmax float32 [n]).
    Hint: |x[..., None] - levels| has a level axis to take the argmin over.
    """
    raise NotImplementedError("Exercise 06.5: Quantize each row of blocks [n, block_size] to the nearest of 16 levels")


def nf4_dequantize(codes: torch.Tensor, absmax: torch.Tensor,
                   levels: torch.Tensor) -> torch.Tensor:
    """Exercise 06.5: Map NF4 codes back to real numbers.

    codes uint8 [n, block_size], absmax [n] -> float32 levels[code] × the row's absmax.
    """
    raise NotImplementedError("Exercise 06.5: Map NF4 codes back to real numbers")
