# Generated from solutions/ch12_kv_quant.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 12, section 9: a smaller KV cache. Keys and values rounded to int8 with one scale
per token and KV head, and to KIVI's int4 (Liu et al. 2024: keys per channel over a block,
values per token), and back. The library's versions, which the engine runs with
``LLM(kv_cache_dtype="int8")`` and ``"int4"``, are ``minillm.attention.kv_quant`` and
``minillm.attention.kv_int4``; your codes must equal theirs bit for bit, because the pool
(and the C++ decode step that writes int8 tokens) stores exactly these."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Int4Block:
    """One full block of the engine's int4 pool (given), as ``minillm.engine.int4_cache``
    stores it, the codes packed two to a byte along ``head_dim``:

    * ``key_codes``, ``value_codes``: [block_size, kv_heads, head_dim // 2] uint8;
    * ``key_scales``, ``key_minimums``: [kv_heads, head_dim] float32, one per channel;
    * ``value_scales``, ``value_minimums``: [block_size, kv_heads] float32, one per token.
    """

    key_codes: torch.Tensor
    key_scales: torch.Tensor
    key_minimums: torch.Tensor
    value_codes: torch.Tensor
    value_scales: torch.Tensor
    value_minimums: torch.Tensor


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 12.6: Round keys or values to int8, one scale per token and KV head.

    ``x`` [..., head_dim], any float dtype, is converted to float32 first; all arithmetic is
    float32. Each row of ``head_dim`` values (one token's key or value in one KV head) is
    one group, rounded symmetrically by its own absolute maximum::

        scale = max_i |x_i| / 127        code_i = round(x_i / scale), ties to even

    Returns ``(codes [..., head_dim] int8 in -127..127, scales [...] float32)``. A row of
    zeros has scale 0 and codes 0, with no NaN on the way; a row of tiny values is still
    rounded by its own maximum. The pool stores these codes and scales, and the C++ decode
    step writes new tokens' with the same arithmetic, so compute the scale and the
    division as written: the grader compares them with the library's bit for bit.
    Hint: section 9 of the notebook; ``torch.round`` rounds ties to even.
    """
    raise NotImplementedError("Exercise 12.6: Round keys or values to int8, one scale per token and KV head")


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Exercise 12.6: The values int8 codes stand for.

    ``codes`` [..., head_dim] int8 and ``scales`` [...] float32, as :func:`quantize_int8`
    returns them -> float32 [..., head_dim], ``code * scale`` (the pool's gather does this
    before attention). Each value is then within scale / 2 of the one that was rounded.
    """
    raise NotImplementedError("Exercise 12.6: The values int8 codes stand for")


def quantize_int4(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exercise 12.7: Round to asymmetric 4-bit codes, the values along ``dim`` one group.

    ``x`` any shape and float dtype, converted to float32 first (all arithmetic float32);
    ``dim`` may be negative. Each group (the values along ``dim`` at one index of the other
    dimensions) is rounded onto 16 levels between its minimum and its maximum::

        scale = (max - min) / 15     code = round((x - min) / scale), ties to even, 0..15

    Returns ``(codes uint8 shaped like x, scales, minimums)``, the two float32 statistics
    shaped like x without ``dim``. A constant group (max == min) has scale 0, codes 0 and
    its value as minimum, with no NaN on the way. The grader compares all three with the
    library's (``minillm.attention.kv_int4``) bit for bit: compute them as written.
    Hint: KIVI §3 (asymmetric quantization, a zero point per group); section 9.
    """
    raise NotImplementedError("Exercise 12.7: Round to asymmetric 4-bit codes, the values along ``dim`` one group")


def dequantize_int4(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor,
                    dim: int) -> torch.Tensor:
    """Exercise 12.7: The float32 values of codes rounded along ``dim``.

    ``codes``, ``scales``, ``minimums`` as :func:`quantize_int4` returned them for the same
    ``dim`` -> float32 shaped like ``codes``: ``minimum + code * scale``, each group with
    its own statistics, so each value is within scale / 2 of the one rounded.
    """
    raise NotImplementedError("Exercise 12.7: The float32 values of codes rounded along ``dim``")


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Exercise 12.8: Two 4-bit codes to a byte.

    ``codes`` [..., n] uint8 in 0..15, n even -> uint8 [..., n // 2]: byte i holds code
    2i in its low four bits and code 2i + 1 in its high four (the pool's layout).
    """
    raise NotImplementedError("Exercise 12.8: Two 4-bit codes to a byte")


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Exercise 12.8: The codes of packed bytes.

    :func:`pack` undone: uint8 [..., n // 2] -> the codes [..., n], uint8 in 0..15.
    """
    raise NotImplementedError("Exercise 12.8: The codes of packed bytes")


def quantize_kv_block(keys: torch.Tensor, values: torch.Tensor) -> Int4Block:
    """Exercise 12.8: KIVI's int4 for one full block: keys per channel, values per token.

    ``keys``, ``values``: [block_size, kv_heads, head_dim] float, head_dim even, one full
    block of one layer's pool. A few key channels are large in every token (section 9
    measures them on SmolLM2), so each key channel of each KV head is one group over the
    block's ``block_size`` tokens, with a range of its own; each value row (one token in
    one KV head) is one group over its ``head_dim`` channels. Round both with your
    :func:`quantize_int4` and pack the codes with :func:`pack`: an :class:`Int4Block`
    equal, tensor for tensor, to what the engine's int4 pool stores for the block.
    """
    raise NotImplementedError("Exercise 12.8: KIVI's int4 for one full block: keys per channel, values per token")


def dequantize_kv_block(block: Int4Block) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 12.8: A rounded block's keys and values.

    :func:`quantize_kv_block` undone, up to the rounding: (keys, values), float32
    [block_size, kv_heads, head_dim] each, with your :func:`unpack` and
    :func:`dequantize_int4`.
    """
    raise NotImplementedError("Exercise 12.8: A rounded block's keys and values")
