"""Plausible wrong answers to chapter 05 (FlashAttention); the graded tests must catch each
one. Each mutant replaces the solution function named before its ``__``."""

import math

import torch
import triton
import triton.language as tl


def online_softmax_update__no_inf_guard(m, l, acc, scores, v_block):
    """Subtracts m' even where it is -inf: a fully masked row becomes nan."""
    m_new = torch.maximum(m, scores.amax(dim=-1))
    rescale = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[..., None])
    return m_new, l * rescale + p.sum(-1), acc * rescale[..., None] + p @ v_block


def online_softmax_update__acc_not_rescaled(m, l, acc, scores, v_block):
    """Rescales the running sum l but not the accumulator when the max grows."""
    m_new = torch.maximum(m, scores.amax(dim=-1))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    rescale = torch.exp(m - m_safe)
    p = torch.exp(scores - m_safe[..., None])
    return m_new, l * rescale + p.sum(-1), acc + p @ v_block


def online_softmax_update__rescale_inverted(m, l, acc, scores, v_block):
    """Multiplies the old state by exp(m' - m) instead of exp(m - m')."""
    m_new = torch.maximum(m, scores.amax(dim=-1))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    old = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    rescale = torch.exp(m_safe - old)
    p = torch.exp(scores - m_safe[..., None])
    return m_new, l * rescale + p.sum(-1), acc * rescale[..., None] + p @ v_block


def online_softmax_update__rows_on_first_axis(m, l, acc, scores, v_block):
    """Indexes with [:, None]: right for [rows], wrong once batch and heads lead."""
    m_new = torch.maximum(m, scores.amax(dim=-1))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    rescale = torch.exp(m - m_safe)
    p = torch.exp(scores - m_safe[:, None])
    return m_new, l * rescale + p.sum(-1), acc * rescale[:, None] + p @ v_block


def _tiled(q, k, v, block_size, causal, block_starts, query_positions, key_positions):
    """The solution's loop over key blocks, with replaceable block starts and positions."""
    from solutions.ch05_flash_attention import online_softmax_update

    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    query_pos = query_positions(n_q, n_k)[:, None]
    for start in block_starts(n_k, block_size):
        k_block, v_block = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
        scores = q @ k_block.transpose(-2, -1) / math.sqrt(d)
        if causal:
            key_pos = key_positions(start, k_block.shape[-2])[None, :]
            scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
        m, l, acc = online_softmax_update(m, l, acc, scores, v_block)
    return acc / l[..., None]


def _all_blocks(n_k, block_size):
    return range(0, n_k, block_size)


def _last_positions(n_q, n_k):
    return torch.arange(n_k - n_q, n_k)


def _block_positions(start, size):
    return torch.arange(start, start + size)


def tiled_attention__causal_from_position_zero(q, k, v, block_size=16, causal=False):
    """Puts query i at position i instead of n_k - n_q + i: wrong for a decode step."""
    return _tiled(q, k, v, block_size, causal, _all_blocks, lambda n_q, n_k: torch.arange(n_q),
                  _block_positions)


def tiled_attention__drops_the_partial_block(q, k, v, block_size=16, causal=False):
    """Loops over whole blocks only, losing the last n_k % block_size keys."""
    return _tiled(q, k, v, block_size, causal,
                  lambda n_k, size: range(0, n_k - size + 1, size), _last_positions,
                  _block_positions)


def tiled_attention__block_local_key_positions(q, k, v, block_size=16, causal=False):
    """Numbers the keys of every block from 0, forgetting the block's start."""
    return _tiled(q, k, v, block_size, causal, _all_blocks, _last_positions,
                  lambda start, size: torch.arange(size))


def tiled_attention__ignores_causal(q, k, v, block_size=16, causal=False):
    """Never masks: every query sees the future."""
    return _tiled(q, k, v, block_size, False, _all_blocks, _last_positions, _block_positions)


def tiled_attention__unshifted_exponentials(q, k, v, block_size=16, causal=False):
    """Sums exp(score) over blocks without a running max: overflows on large scores."""
    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    l = torch.zeros(q.shape[:-1], dtype=q.dtype)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    query_pos = torch.arange(n_k - n_q, n_k)[:, None]
    for start in range(0, n_k, block_size):
        k_block, v_block = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
        scores = q @ k_block.transpose(-2, -1) / math.sqrt(d)
        if causal:
            key_pos = torch.arange(start, start + k_block.shape[-2])[None, :]
            scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
        p = torch.exp(scores)
        l, acc = l + p.sum(-1), acc + p @ v_block
    return acc / l[..., None]


def tiled_attention__whole_score_matrix(q, k, v, block_size=16, causal=False):
    """Builds all n_q x n_k scores and softmaxes them at once: right numbers, no tiling."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        future = torch.arange(n_k)[None, :] > torch.arange(n_k - n_q, n_k)[:, None]
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@triton.jit
def softmax_kernel__no_max_subtraction(x_ptr, out_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """Exponentiates without subtracting the row's max: overflows (inf / inf) on large x."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * row_stride + cols, mask=inside, other=float("-inf"))
    e = tl.exp(x.to(tl.float32))
    tl.store(out_ptr + row * row_stride + cols, e / tl.sum(e, axis=0), mask=inside)


@triton.jit
def softmax_kernel__pads_with_zero(x_ptr, out_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """Loads the columns past n_cols as 0 instead of -inf: they join the max and the sum."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * row_stride + cols, mask=inside, other=0.0).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * row_stride + cols, e / tl.sum(e, axis=0), mask=inside)


@triton.jit
def softmax_kernel__exp2(x_ptr, out_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    """Uses the faster exp2 (2^x) without converting the scores to base 2."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * row_stride + cols, mask=inside, other=float("-inf"))
    x = x.to(tl.float32)
    e = tl.exp2(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * row_stride + cols, e / tl.sum(e, axis=0), mask=inside)
