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
the tests hold the kernel to it (float32 rounding of the final sums). The op
``minillm::w4a8_linear``, its reference and the rounding of x
(:func:`~minillm.ops.quantize_symmetric`) live in :mod:`minillm.ops`.
"""

from __future__ import annotations

import torch

from .. import ops
from ..linear import CompressedLinear
from .weight_only import WeightOnlyLinear, unpack_int4_groups


class W4A8Linear(CompressedLinear):
    """Grouped int4 weights (the decode layout); each input row rounded to int8 on the fly."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 bias: torch.Tensor | None = None):
        groups, half = codes.shape[1], codes.shape[2]
        super().__init__(groups * 2 * half, codes.shape[0], bias)
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
        y = ops.w4a8_linear(x.float(), self.codes, self.scales, self.zeros)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def reference_product(self, x: torch.Tensor) -> torch.Tensor:
        """The module docstring's sums, written out (:func:`~minillm.ops.w4a8_linear_reference`)."""
        return ops.w4a8_linear_reference(x, self.codes, self.scales, self.zeros)
