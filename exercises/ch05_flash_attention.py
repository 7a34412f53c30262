# Generated from solutions/ch05_flash_attention.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 05: FlashAttention — online softmax, tiling, and a first Triton kernel."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor,
                          scores: torch.Tensor, v_block: torch.Tensor):
    """Exercise 05.1: Fold one block of scores into the running softmax state.

    m, l: [..., rows] running max and running sum of exp(score - m); acc: [..., rows, d]
    running sum of exp(score - m) * v. scores: [..., rows, block] (may contain -inf);
    v_block: [..., block, d]. The leading dimensions (batch, heads) just come along.
    Returns the new (m, l, acc). After the last block, acc / l is softmax(all scores) @ V.
    Hint: m' = max(m, rowmax(scores)); everything accumulated so far is multiplied by
    exp(m - m'). Guard rows where m' is still -inf (exp(-inf - -inf) is nan). Index with
    [..., None] rather than [:, None] so any leading dimensions work.
    """
    raise NotImplementedError("Exercise 05.1: Fold one block of scores into the running softmax state")


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    block_size: int = 16, causal: bool = False) -> torch.Tensor:
    """Exercise 05.2: Attention that never builds the whole [n_q, n_k] score matrix.

    q: [..., n_q, d]; k, v: [..., n_k, d]. The leading dimensions broadcast as in a matmul:
    [batch, heads] for q, k and v alike, or q [batch, kv_heads, groups, n_q, d] with
    k, v [batch, kv_heads, 1, n_k, d] for grouped-query attention without copies.
    Walk over key/value blocks of block_size rows (n_k need not be a multiple of it):
    compute the block's scores q @ k_blockᵀ / √d and fold them in with
    online_softmax_update. Returns softmax(q kᵀ / √d) v, [..., n_q, d].
    causal=True: the queries are the LAST n_q of the n_k positions, so query i sits at
    position n_k - n_q + i and sees keys 0 .. n_k - n_q + i; later keys get score -inf.
    A prefill has n_q = n_k (the usual triangle), a decode step with a KV cache n_q = 1
    (every key visible): one function serves both, as an engine's attention backend.
    Hint: start from m = -inf and l = 0 shaped q.shape[:-1], acc = 0 shaped like the
    output; the answer is acc / l. For the mask, compare a column of query positions
    with the row of this block's key positions.
    """
    raise NotImplementedError("Exercise 05.2: Attention that never builds the whole [n_q, n_k] score matrix")


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """Exercise 05.3: A Triton program that softmaxes one row of a matrix.

    Program i handles row i: load the row (columns >= n_cols masked to -inf), subtract its
    max, exponentiate, divide by the sum, store. BLOCK is a power of two >= n_cols.
    Hint: row = tl.program_id(0); cols = tl.arange(0, BLOCK); pointers are
    x_ptr + row * row_stride + cols; use tl.load(..., mask=cols < n_cols, other=-inf),
    tl.max, tl.exp, tl.sum, tl.store(..., mask=...). Compute in fp32.
    """
    raise NotImplementedError("Exercise 05.3: A Triton program that softmaxes one row of a matrix")


def triton_softmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax of a 2-D fp32 tensor with softmax_kernel (given: the launcher)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    softmax_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0),
                                  BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
