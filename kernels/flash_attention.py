"""FlashAttention forward as a Triton kernel: causal, GQA, any length, returns log-sum-exp.

One program computes one block of BLOCK_M query rows of one (batch, head): it loads the
query block once, then streams key/value blocks of BLOCK_N rows through on-chip memory,
keeping the online-softmax state (running max ``m``, running sum ``l``, accumulator
``acc``) in registers, exactly as :func:`minillm.attention.tiled.online_softmax_step`
does in PyTorch. Nothing of size q_len x kv_len is ever written to memory.

* GQA: query head ``h`` reads key/value head ``h // GROUPS`` by pointer arithmetic; K and
  V are never repeated.
* Causal: queries are the last q_len positions of the kv sequence; key blocks entirely in
  the future are skipped, the diagonal block is masked element by element.
* Ragged edges: loads and stores are masked, so lengths need not be multiples of a block.
* An optional boolean mask [batch or 1, 1, q_len, kv_len] (padding, sliding windows: the
  masks minillm's model builds) is read tile by tile, like K and V.
* Dtypes: fp16/bf16/fp32 inputs; every tile is converted to fp32 right after loading
  (the Triton interpreter computes bf16 wrongly, and fp32 accumulation is what we want).

On a CPU, set ``TRITON_INTERPRET=1`` before importing this module: the same kernel then
runs in Triton's interpreter (slowly, but exactly), which is how the tests check it.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _flash_forward(
    Q, K, V, Out, Lse, Mask,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    stride_maskb, stride_maskm,
    num_heads, q_len, kv_len, scale,
    GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    block = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch, head = batch_head // num_heads, batch_head % num_heads
    kv_head = head // GROUPS

    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this program
    cols = tl.arange(0, HEAD_DIM)
    row_ok = rows < q_len
    q_ptrs = Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qm + cols[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    q = q * (scale * 1.4426950408889634)  # fold log2(e) in: exp(x) == exp2(x * log2(e))

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    offset = kv_len - q_len  # query row i sits at kv position offset + i
    end = kv_len
    if CAUSAL:
        end = tl.minimum(kv_len, offset + (block + 1) * BLOCK_M)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < kv_len
        k = tl.load(k_base + keys[:, None] * stride_kn + cols[None, :],
                    mask=key_ok[:, None], other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N], in log2 units
        allowed = key_ok[None, :]
        if CAUSAL:
            allowed = allowed & (keys[None, :] <= (offset + rows)[:, None])
        if HAS_MASK:
            tile = Mask + batch * stride_maskb + rows[:, None] * stride_maskm + keys[None, :]
            in_bounds = row_ok[:, None] & key_ok[None, :]
            allowed = allowed & (tl.load(tile, mask=in_bounds, other=0) != 0)
        scores = tl.where(allowed, scores, float("-inf"))

        m_new = tl.maximum(m, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padded rows see no key
        p = tl.math.exp2(scores - m_safe[:, None])
        rescale = tl.math.exp2(m - m_safe)
        l = l * rescale + tl.sum(p, axis=1)
        v = tl.load(v_base + keys[:, None] * stride_vn + cols[None, :],
                    mask=key_ok[:, None], other=0.0).to(tl.float32)
        acc = acc * rescale[:, None] + tl.dot(p, v)
        m = m_new

    l_safe = tl.where(l == 0.0, 1.0, l)
    out = acc / l_safe[:, None]
    o_ptrs = Out + batch * stride_ob + head * stride_oh + rows[:, None] * stride_om + cols[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    lse = (m + tl.math.log2(l_safe)) / 1.4426950408889634  # back to natural log
    tl.store(Lse + batch_head * q_len + rows, lse, mask=row_ok)


# On a GPU, let Triton time a few tile shapes per problem size and keep the fastest. The
# interpreter cannot autotune (and speed means nothing there), so it uses fixed tiles.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
    for bm, bn, warps, stages in [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4),
                                  (128, 32, 4, 4), (64, 128, 4, 3)]
]
_flash_forward_tuned = None if INTERPRETED else triton.autotune(
    configs=_GPU_CONFIGS, key=["q_len", "kv_len", "HEAD_DIM", "CAUSAL", "HAS_MASK"],
)(_flash_forward)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    mask: torch.Tensor | None = None, block_m: int | None = None,
                    block_n: int | None = None):
    """softmax(q kᵀ / √d) v with the Triton kernel; returns (out, lse [b, heads, q_len] fp32).

    q [b, heads, q_len, d]; k, v [b, kv_heads, kv_len, d]; heads % kv_heads == 0;
    d a power of two (64 and 128 are what Llama-family models use). ``mask``: bool,
    [b or 1, 1, q_len, kv_len], True where attending is allowed. ``block_m``/``block_n``
    fix the tile shape; by default the interpreter uses 64 x 64 and a GPU autotunes.
    """
    b, heads, q_len, d = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads evenly")
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k and v must be [{b}, kv_heads, kv_len, {d}], got {list(k.shape)}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    has_mask = mask is not None
    if has_mask:
        mask = mask.to(torch.int8).expand(-1, 1, q_len, kv_len).contiguous()
        mask_strides = (mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(2))
    else:
        mask, mask_strides = q, (0, 0)  # never read: HAS_MASK is False
    out = torch.empty_like(q)
    lse = torch.empty(b, heads, q_len, dtype=torch.float32, device=q.device)
    args = (
        q, k, v, out, lse, mask,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        *mask_strides,
        heads, q_len, kv_len, 1.0 / math.sqrt(d),
    )
    flags = dict(GROUPS=heads // kv_heads, HEAD_DIM=d, CAUSAL=causal, HAS_MASK=has_mask)
    if _flash_forward_tuned is not None and block_m is None and block_n is None:
        grid = lambda meta: (triton.cdiv(q_len, meta["BLOCK_M"]), b * heads)  # noqa: E731
        _flash_forward_tuned[grid](*args, **flags)
    else:
        block_m, block_n = block_m or 64, block_n or 64
        _flash_forward[(triton.cdiv(q_len, block_m), b * heads)](
            *args, **flags, BLOCK_M=block_m, BLOCK_N=block_n)
    return out, lse


def triton_attention(q, k, v, mask=None):
    """The backend interface (see :mod:`minillm.attention`): output only."""
    return flash_attention(q, k, v, mask=mask)[0]
