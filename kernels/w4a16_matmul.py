"""W4A16 matmul as a Triton kernel: 4-bit weights, 16-bit (or 32-bit) activations.

``y = x @ Wᵀ`` where ``W = (codes - zeros) * scales`` is a weight quantized to 4 bits in
groups along its input dimension (what :class:`minillm.quant.qlinear.QuantLinear` stores):

* ``codes`` uint8 [N, K/2], two 4-bit codes a byte, the low nibble holds the even column
  (:func:`minillm.quant.packing.pack_int4`);
* ``scales``, ``zeros`` [N, ceil(K / group_size)], one pair per group of ``group_size``
  consecutive inputs of a row; column k belongs to group ``k // group_size`` (the last
  group may be shorter, as for SmolLM2's K = 576 with groups of 128).

**Why a kernel: decoding is memory-bound.** At batch 1 every weight is read once and used
for one multiply-add: 2 FLOPs per weight. An fp16 weight costs 2 bytes, so the product
does 1 FLOP per byte, while an H100 does ~990 fp16 TFLOP/s against ~3.35 TB/s of memory
bandwidth, ~300 FLOPs per byte: the math units idle and the time is bytes / bandwidth.
A 4-bit weight costs 0.5 byte plus 4 bytes of fp16 scale and zero per group (0.03 byte a
weight at group 128): ~3.8x fewer bytes, so up to ~3.8x faster, *if* the weight never
exists in memory at 16 bits. Dequantizing into a temporary fp16 matrix and calling cuBLAS
would read 0.5, write 2 and read 2 bytes per weight: slower than not quantizing at all.

So each program of this kernel computes a BLOCK_M x BLOCK_N tile of y and walks K in
steps of BLOCK_K: it loads BLOCK_K/2 packed bytes per output row, splits them into the
even-column (low nibble) and odd-column (high nibble) codes, dequantizes both in registers
and multiplies them with the even and odd columns of x:
``y += x_even @ W_evenᵀ + x_odd @ W_oddᵀ``. Accumulation is fp32; y has x's dtype.

* BLOCK_M == 1 (one token, decoding): a matrix-vector product written as a multiply and
  a sum over K (no tensor cores needed; all that matters is streaming the bytes).
* BLOCK_M >= 16 (a batch, a prefill): ``tl.dot`` on tensor cores, the dequantized tile in
  fp16 for fp16 inputs, in exact fp32 (``input_precision="ieee"``) for fp32 inputs.
* When BLOCK_K divides group_size a K tile lies in one group: one scale and zero per
  output row; otherwise they are gathered per column.

At large batch the product becomes compute-bound and the dequantization is extra work;
that is where a dense fp16 cuBLAS matmul catches up (see ``benchmarks/w4a16.py``).

On a CPU, set ``TRITON_INTERPRET=1`` before importing this module: the kernel then runs in
Triton's interpreter (slowly, but exactly), which is how the tests check it.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _w4a16_kernel(
    X, Codes, Scales, Zeros, Y,
    M, N, K,
    stride_xm, stride_cn, stride_sn, stride_ym,
    GROUP_SIZE: tl.constexpr, DOT_FP16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # output features = rows of W
    row_ok, col_ok = rows < M, cols < N

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # BLOCK_K / 2 packed bytes per output row; byte j holds columns 2j (low), 2j + 1 (high)
        byte = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        byte_ok = byte < K // 2
        w_ok = byte_ok[:, None] & col_ok[None, :]
        packed = tl.load(Codes + cols[None, :] * stride_cn + byte[:, None], mask=w_ok, other=0)
        low = (packed & 0xF).to(tl.float32)  # [BLOCK_K / 2, BLOCK_N]: W[n, 2j]
        high = (packed >> 4).to(tl.float32)  # W[n, 2j + 1]
        if GROUP_SIZE % BLOCK_K == 0:  # the whole K tile lies in one group
            group = k0 // GROUP_SIZE
            scale = tl.load(Scales + cols * stride_sn + group, mask=col_ok, other=0.0)
            zero = tl.load(Zeros + cols * stride_sn + group, mask=col_ok, other=0.0)
            scale, zero = scale.to(tl.float32)[None, :], zero.to(tl.float32)[None, :]
            w_even, w_odd = (low - zero) * scale, (high - zero) * scale
        else:  # groups change inside the tile: gather a scale and zero per column
            g_even = (2 * byte) // GROUP_SIZE
            g_odd = (2 * byte + 1) // GROUP_SIZE
            base = cols[None, :] * stride_sn
            s_even = tl.load(Scales + base + g_even[:, None], mask=w_ok, other=0.0)
            z_even = tl.load(Zeros + base + g_even[:, None], mask=w_ok, other=0.0)
            s_odd = tl.load(Scales + base + g_odd[:, None], mask=w_ok, other=0.0)
            z_odd = tl.load(Zeros + base + g_odd[:, None], mask=w_ok, other=0.0)
            w_even = (low - z_even.to(tl.float32)) * s_even.to(tl.float32)
            w_odd = (high - z_odd.to(tl.float32)) * s_odd.to(tl.float32)

        x_ptrs = X + rows[:, None] * stride_xm + 2 * byte[None, :]
        x_ok = row_ok[:, None] & byte_ok[None, :]
        x_even = tl.load(x_ptrs, mask=x_ok, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_K / 2]
        x_odd = tl.load(x_ptrs + 1, mask=x_ok, other=0.0).to(tl.float32)
        if BLOCK_M == 1:  # matrix-vector product: multiply, then sum over K
            acc += (tl.sum(tl.trans(x_even) * w_even, axis=0)
                    + tl.sum(tl.trans(x_odd) * w_odd, axis=0))[None, :]
        elif DOT_FP16:  # tensor cores on fp16 tiles, fp32 accumulation
            acc += tl.dot(x_even.to(tl.float16), w_even.to(tl.float16))
            acc += tl.dot(x_odd.to(tl.float16), w_odd.to(tl.float16))
        else:
            acc += tl.dot(x_even, w_even, input_precision="ieee")
            acc += tl.dot(x_odd, w_odd, input_precision="ieee")

    y_ptrs = Y + rows[:, None] * stride_ym + cols[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


# On a GPU, let Triton time a few tile shapes per problem and keep the fastest: narrow,
# deep tiles for the matrix-vector case (many programs, long contiguous reads), wider ones
# for tensor cores. The interpreter cannot autotune, so it uses fixed tiles.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages)
    for bn, bk, warps, stages in [(8, 512, 4, 3), (16, 256, 4, 3), (16, 512, 4, 2),
                                  (32, 256, 4, 3), (32, 128, 4, 4), (64, 128, 4, 3),
                                  (32, 64, 2, 4), (64, 64, 4, 3), (128, 64, 4, 3),
                                  (128, 128, 8, 3)]
]
_w4a16_tuned = None if INTERPRETED else triton.autotune(
    configs=_GPU_CONFIGS, key=["N", "K", "BLOCK_M", "GROUP_SIZE", "DOT_FP16"],
)(_w4a16_kernel)


def _check(x, codes, scales, zeros, group_size) -> None:
    """Clear errors for arguments the kernel would silently misread."""
    if x.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"x must be float16 or float32, got {x.dtype}")
    if codes.dtype != torch.uint8 or codes.dim() != 2:
        raise ValueError("codes must be a 2-D uint8 tensor [N, K/2] of packed 4-bit codes (see "
                         f"minillm.quant.packing.pack_int4), got {codes.dtype} "
                         f"{list(codes.shape)}")
    if x.dim() == 0 or x.shape[-1] != 2 * codes.shape[1]:
        raise ValueError(f"x's last dimension must be K = 2 x codes.shape[1] = "
                         f"{2 * codes.shape[1]} (two codes a byte), got {list(x.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be a positive number of inputs, got {group_size}")
    groups = (codes.shape[0], math.ceil(x.shape[-1] / group_size))
    for name, t in (("scales", scales), ("zeros", zeros)):
        if tuple(t.shape) != groups or not t.is_floating_point():
            raise ValueError(f"{name} must be floating point [N, ceil(K / group_size)] = "
                             f"{list(groups)}, got {t.dtype} {list(t.shape)}")
    devices = {t.device for t in (x, codes, scales, zeros)}
    if len(devices) > 1:
        raise ValueError(f"x, codes, scales and zeros must be on one device, got {devices}")


def _check_tile(block_n: int, block_k: int) -> None:
    for name, size, least in (("block_n", block_n, 1), ("block_k", block_k, 2)):
        if size < least or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= {least}, got {size}")


def w4a16_matmul(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor, group_size: int, block_n: int | None = None,
                 block_k: int | None = None) -> torch.Tensor:
    """``x @ ((codes - zeros) * scales)ᵀ`` without ever materialising the dequantized weight.

    x [..., K] fp16/fp32; codes uint8 [N, K/2] (low nibble = even column); scales, zeros
    [N, ceil(K / group_size)]. Returns [..., N] in x's dtype (fp32 accumulation).
    ``block_n``/``block_k`` (powers of two, block_k >= 32) fix the tile; by default the
    interpreter uses 32 x 64 and a GPU autotunes.
    """
    _check(x, codes, scales, zeros, group_size)
    n, k = codes.shape[0], x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    codes, scales, zeros = codes.contiguous(), scales.contiguous(), zeros.contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*x.shape[:-1], n)
    block_m = 1 if m == 1 else min(64, max(16, triton.next_power_of_2(m)))
    args = (x2, codes, scales, zeros, y, m, n, k,
            x2.stride(0), codes.stride(0), scales.stride(0), y.stride(0))
    flags = dict(GROUP_SIZE=group_size, DOT_FP16=x.dtype == torch.float16, BLOCK_M=block_m)
    if _w4a16_tuned is not None and block_n is None and block_k is None:
        grid = lambda meta: (triton.cdiv(m, block_m), triton.cdiv(n, meta["BLOCK_N"]))  # noqa: E731
        _w4a16_tuned[grid](*args, **flags)
    else:
        block_n, block_k = block_n or 32, block_k or 64
        _check_tile(block_n, block_k)
        _w4a16_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
            *args, **flags, BLOCK_N=block_n, BLOCK_K=block_k)
    return y.reshape(*x.shape[:-1], n)
