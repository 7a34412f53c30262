"""minillm's three torch ops, in one place: their schemas, shapes and readable references.

A *torch op* is a function PyTorch's dispatcher knows by name (``torch.ops.minillm.int8_linear``),
so a ``torch.compile`` graph can call it without looking inside. It has a schema (argument
types, and which arguments it writes), a *fake* implementation that only says the output's
shape and dtype (what the compiler traces with), and kernels registered per *dispatch key*:

* ``minillm::int8_linear``: int8 weights times activations rounded to uint8 per row (the
  math: :mod:`minillm.quant.int8_activations`);
* ``minillm::w4a8_linear``: grouped int4 weights times activations rounded to int8 per row
  (:mod:`minillm.quant.w4a8`);
* ``minillm::paged_decode_attention``: a decode step's attention over the paged KV pool
  (:mod:`minillm.attention.paged`, where its reference lives with the other paged code).

Each op has two kernels. Its readable reference is registered here under
``CompositeExplicitAutograd``, the key that fills in every device without a kernel of its
own. minillm's C++ kernels (:mod:`minillm.native`) are registered for the ``CPU`` key when
that library is loaded, and the dispatcher prefers a device's own kernel to the composite
one: on the CPU the C++ kernel runs once it is loaded, the reference before (or where it
cannot be built: the same numbers for int8 bit for bit, int4 to float32 rounding, slower).

Call the ops through the wrappers at the bottom (:func:`int8_linear`, :func:`w4a8_linear`,
:func:`paged_decode_attention`): they try to load the C++ library first, once; not while
``torch.compile`` traces, because Dynamo must not trace a compiler run.
"""

from __future__ import annotations

import torch

from .attention.paged import paged_decode_reference
from .native import native_kernels

UINT8_MAX = 255
INT8_MAX = 127
SMALLEST_SCALE = 6.1e-5  # FBGEMM's floor on an activation scale

_LIBRARY = torch.library.Library("minillm", "DEF")
_LIBRARY.define("int8_linear(Tensor x, Tensor codes, Tensor scales, Tensor code_sums) -> Tensor")
_LIBRARY.define("w4a8_linear(Tensor x, Tensor codes, Tensor scales, Tensor zeros) -> Tensor")
# Writes k and v into the pools (in place: the (a!) and (b!) marks), then attends.
_LIBRARY.define("paged_decode_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) key_pool, "
                "Tensor(b!) value_pool, Tensor slots, Tensor block_tables, Tensor context_lens)"
                " -> Tensor")


@torch.library.register_fake("minillm::int8_linear")
def _int8_linear_shape(x, codes, scales, code_sums):
    return x.new_empty(*x.shape[:-1], codes.shape[0])


@torch.library.register_fake("minillm::w4a8_linear")
def _w4a8_linear_shape(x, codes, scales, zeros):
    return x.new_empty(*x.shape[:-1], codes.shape[0])


@torch.library.register_fake("minillm::paged_decode_attention")
def _paged_decode_attention_shape(q, k, v, key_pool, value_pool, slots, block_tables,
                                  context_lens):
    return torch.empty_like(q)


# Activation rounding, the first half of both integer products.

def activation_qparams(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (scale, zero point) of the asymmetric uint8 grid, [..., 1] each.

    The range always includes 0, so 0 is exact (as zero padding needs). FBGEMM's rule
    (``ChooseQuantizationParams``): computed in float64; an all-zero row gets scale 0.1; a
    range narrower than 255 · 6.1e-5 is widened to that, the zero point staying put.
    """
    low = x.amin(-1, keepdim=True).clamp(max=0).double()
    high = x.amax(-1, keepdim=True).clamp(min=0).double()
    scale = torch.where(high > low, (high - low) / UINT8_MAX, 0.1)
    zero = (-low / scale).round().clamp(0, UINT8_MAX)
    return scale.clamp(min=SMALLEST_SCALE).float(), zero.float()


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, scale, zero point) of x on its per-row uint8 grid, so x ≈ scale · (codes − zero).

    Multiply by the float32 reciprocal of the scale, add the zero point, then round half to
    even (FBGEMM's order; its vector code rounds about one value in a million the other way,
    where the product lands within float error of a tie). Codes are floats.
    """
    scale, zero = activation_qparams(x)
    codes = (x.float() * (1 / scale) + zero).round().clamp(0, UINT8_MAX)
    return codes, scale, zero


def quantize_symmetric(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale) of each row of x on a symmetric int8 grid: x ≈ scale · codes, codes in
    [−127, 127] (as floats), scale [..., 1]; an all-zero row gets scale 1."""
    largest = x.float().abs().amax(-1, keepdim=True)
    scale = torch.where(largest > 0, largest / INT8_MAX, 1.0)
    codes = (x.float() * (1 / scale)).round().clamp(-INT8_MAX, INT8_MAX)
    return codes, scale


# The references: each op written out, the integer sums exact in float64.

def int8_linear_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                          code_sums: torch.Tensor | None = None) -> torch.Tensor:
    """``minillm::int8_linear`` written out: the integer sums Σ_i (q_x,i − z_x) q_o,i, exact
    in float64, then times s_x · s_o in float32, in the kernel's order (so the two agree bit
    for bit). ``code_sums`` (Σ_i q_o,i, the kernel's shortcut) is not needed here."""
    x_codes, scale, zero = quantize_activations(x)
    sums = (x_codes - zero).double() @ codes.double().T
    return (sums.float() * (scale * scales)).to(x.dtype)


def w4a8_linear_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                          zeros: torch.Tensor) -> torch.Tensor:
    """``minillm::w4a8_linear`` written out, S and C exact in float64 (the kernel agrees to
    float32 rounding). ``codes`` [out, G, g/2] hold each group's first half in the low
    nibbles and its second half in the high ones (:mod:`minillm.quant.weight_only`)."""
    x_codes, scale = quantize_symmetric(x)
    weights = torch.cat([codes & 15, codes >> 4], dim=-1).double()  # [out, G, g]
    groups = x_codes.double().unflatten(-1, (-1, weights.shape[-1]))  # [..., G, g]
    sums = torch.einsum("...gi,ogi->...og", groups, weights)  # S [..., out, G]
    per_group = sums - zeros.double() * groups.sum(-1).unsqueeze(-2)
    y = scale.double() * (scales.double() * per_group).sum(-1)
    return y.to(x.dtype)


# The fallback on every device; the C++ library's CPU kernels take precedence on the CPU.
_LIBRARY.impl("int8_linear", int8_linear_reference, "CompositeExplicitAutograd")
_LIBRARY.impl("w4a8_linear", w4a8_linear_reference, "CompositeExplicitAutograd")
_LIBRARY.impl("paged_decode_attention", paged_decode_reference, "CompositeExplicitAutograd")


# The calls.

def _try_native_kernels() -> None:
    """Load the C++ kernels the first time (cached after that), except while Dynamo traces:
    a compiled graph records only the op, which the loaded library then runs."""
    if not torch.compiler.is_compiling():
        native_kernels()


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                code_sums: torch.Tensor) -> torch.Tensor:
    """x [..., in] float32 times int8 ``codes`` [out, in] with float32 ``scales`` [out] and
    int32 ``code_sums`` [out], the activations rounded per row: float32 [..., out]."""
    _try_native_kernels()
    return torch.ops.minillm.int8_linear(x, codes, scales, code_sums)


def w4a8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                zeros: torch.Tensor) -> torch.Tensor:
    """x [..., in] float32 times int4 ``codes`` [out, G, g/2] (uint8, two per byte) with
    fp16 ``scales`` and ``zeros`` [out, G], the activations rounded per row: [..., out]."""
    _try_native_kernels()
    return torch.ops.minillm.w4a8_linear(x, codes, scales, zeros)


def paged_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           key_pool: torch.Tensor, value_pool: torch.Tensor, slots: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    """Write k, v [seqs, kv_heads, head_dim] at ``slots`` in the pools, then attend: q
    [seqs, heads, head_dim] -> like q (:func:`~minillm.attention.paged.paged_decode_reference`)."""
    _try_native_kernels()
    return torch.ops.minillm.paged_decode_attention(q, k, v, key_pool, value_pool, slots,
                                                    block_tables, context_lens)
