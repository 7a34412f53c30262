"""KV-cache quantization: the keys and values of the paged pool stored as int8.

At long contexts a decode step reads the whole KV cache: SmolLM2's float32 K/V is 30
layers x 3 KV heads x 64 x 2 x 4 B = 46 KB per token, 94 MB per sequence at 2,048 tokens,
read every step. Stored as int8 with one float32 scale per (token, KV head) it is
30 x 3 x (64 + 4) x 2 = 12 KB per token, 3.8x less to read and to hold.

Each head's 64 values are one group, rounded symmetrically by their absolute maximum
(llama.cpp's ``q8_0`` does the same per block of 32 values)::

    scale = max_i |x_i| / 127        code_i = round(x_i / scale)        x_i ~ code_i * scale

so the rounding error of each value is at most scale / 2 = max |x| / 254. An all-zero head
has scale 0 and codes 0. Rounding is to nearest, ties to even (``torch.round``; the C++
``quantize_head`` in ``csrc/paged_attention.h`` rounds the same way, so a token written by
the native step and one written here get the same codes).

The pool of one layer then holds codes ``[num_blocks, block_size, kv_heads, head_dim]``
int8 and scales ``[num_blocks, block_size, kv_heads]`` float32, for keys and for values;
:func:`write_int8` stores new tokens at their slots, :func:`gather_int8` reads
sequences' blocks back as float32 (dequantized on the gather), for attention.
"""

from __future__ import annotations

import torch

INT8_MAX = 127
KV_CACHE_DTYPES = ("float32", "int8", "int4")  # int4: minillm.attention.kv_int4


def kv_cache_dtype_of(name: str | None) -> str:
    """``name`` checked: one of :data:`KV_CACHE_DTYPES` (None: float32)."""
    name = name or "float32"
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)} (or "
                         f"None for float32), got {name!r}")
    return name


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (codes [..., head_dim] int8, scales [...] float32): each head
    rounded by its absolute maximum (module docstring)."""
    x = x.float()
    scales = x.abs().amax(-1) / INT8_MAX
    scaled = torch.where(scales[..., None] > 0, x / scales[..., None], 0.0)
    return scaled.round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scales


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes [..., head_dim], scales [...] -> float32 [..., head_dim]."""
    return codes.float() * scales[..., None]


def write_int8(codes: torch.Tensor, scales: torch.Tensor, x: torch.Tensor,
               slots: torch.Tensor) -> None:
    """Store new keys (or values) x [tokens, kv_heads, head_dim] at their ``slots`` of one
    layer's int8 pool (codes and scales)."""
    new_codes, new_scales = quantize_int8(x)
    codes.view(-1, *x.shape[1:]).index_copy_(0, slots, new_codes)
    scales.view(-1, x.shape[1]).index_copy_(0, slots, new_scales)


def gather_int8(codes: torch.Tensor, scales: torch.Tensor,
                block_tables: torch.Tensor) -> torch.Tensor:
    """Each sequence's blocks, in order, dequantized: [seqs, kv_heads, max_blocks *
    block_size, head_dim] float32 (:func:`~minillm.attention.paged.gather_kv`'s layout)."""
    blocks = dequantize_int8(codes[block_tables], scales[block_tables])
    return blocks.flatten(1, 2).transpose(1, 2)
