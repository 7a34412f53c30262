"""int4 weights times int8 activations (W4A8): llama.cpp's Q4_1 x Q8 product.

The int4 decode layout (:mod:`minillm.quant.weight_only`) stores, per output row o and
group g of inputs, codes q in [0, 15], a scale s_og and a zero point z_og: w = s_og (q − z_og).
Compiled as a float loop, every code is unpacked, converted and multiplied in fp32, and
that arithmetic, not memory, limits it. Rounding the activations to int8 as well, one
symmetric grid per token,

    s_x = max|x| / 127,   c = round(x / s_x) ∈ [−127, 127],

turns each group into one integer dot product:

    y_o ≈ s_x Σ_g s_og (S_og − z_og C_g),   S_og = Σ_{i∈g} q_i c_i,   C_g = Σ_{i∈g} c_i.

:class:`W4A8Linear` computes it with minillm's C++ kernel (``csrc/int4_product.h``: per
group of 32, one dot-product instruction over 32 byte pairs);
:meth:`W4A8Linear.reference_product` writes it out with the integer sums in float64, and
the tests hold the kernel to it (float32 rounding of the final sums).
"""

from __future__ import annotations

import torch

from ..linear import CompressedLinear
from ..native import native_kernels
from .weight_only import WeightOnlyLinear, unpack_int4_groups

INT8_MAX = 127


def quantize_symmetric(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale) of each row of x on a symmetric int8 grid: x ≈ scale · codes, codes in
    [−127, 127] (as floats), scale [..., 1]; an all-zero row gets scale 1."""
    largest = x.float().abs().amax(-1, keepdim=True)
    scale = torch.where(largest > 0, largest / INT8_MAX, 1.0)
    codes = (x.float() * (1 / scale)).round().clamp(-INT8_MAX, INT8_MAX)
    return codes, scale


class W4A8Linear(CompressedLinear):
    """Grouped int4 weights (the decode layout); each input row rounded to int8 on the fly."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 bias: torch.Tensor | None = None):
        groups, half = codes.shape[1], codes.shape[2]
        super().__init__(groups * 2 * half, codes.shape[0], bias)
        native_kernels()  # minillm::w4a8_linear
        self.group_size = 2 * half
        self.register_buffer("codes", codes)  # uint8 [out, G, g/2], two codes per byte
        self.register_buffer("scales", scales.half())  # fp16 [out, G]
        self.register_buffer("zeros", zeros.half())  # fp16 [out, G]

    @classmethod
    def supports(cls, layer: torch.nn.Module) -> bool:
        return isinstance(layer, WeightOnlyLinear) and layer.bits == 4 and layer.zeros is not None

    @classmethod
    def from_weight_only(cls, layer: WeightOnlyLinear) -> W4A8Linear:
        if not cls.supports(layer):
            raise ValueError("W4A8 needs int4 weight-only layers with zero points")
        return cls(layer.codes, layer.scales, layer.zeros, layer.bias)

    def dense_weight(self) -> torch.Tensor:
        codes = unpack_int4_groups(self.codes).float().unflatten(1, (-1, self.group_size))
        return ((codes - self.zeros.float()[..., None]) * self.scales.float()[..., None]).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.minillm.w4a8_linear(x.float(), self.codes, self.scales, self.zeros)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def reference_product(self, x: torch.Tensor) -> torch.Tensor:
        """The module docstring's sums, written out (:func:`w4a8_linear_reference`)."""
        return w4a8_linear_reference(x, self.codes, self.scales, self.zeros)


def w4a8_linear_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                          zeros: torch.Tensor) -> torch.Tensor:
    """``minillm::w4a8_linear`` written out, S and C exact in float64 (the kernel agrees to
    float32 rounding; this is also what runs where the C++ kernels cannot be built)."""
    group = 2 * codes.shape[2]
    x_codes, scale = quantize_symmetric(x)
    groups = x_codes.double().unflatten(-1, (-1, group))  # [..., G, g]
    weights = unpack_int4_groups(codes).double().unflatten(1, (-1, group))
    sums = torch.einsum("...gi,ogi->...og", groups, weights)  # S [..., out, G]
    per_group = sums - zeros.double() * groups.sum(-1).unsqueeze(-2)
    y = scale.double() * (scales.double() * per_group).sum(-1)
    return y.to(x.dtype)
