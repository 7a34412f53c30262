"""int8 weights times int8 activations (W8A8, dynamic): the decode product in integers.

Weight-only int8 (:mod:`minillm.quant.weight_only`) reads a quarter of fp32's bytes but
still multiplies in fp32: every code is converted to a float first, and on a CPU whose
cache holds the whole model that conversion, not memory, sets the speed. llama.cpp's Q8_0
avoids it by rounding the *activation* vector to int8 as well and multiplying int8 by int8
into int32 with the CPU's integer dot-product instructions (AVX-512 VNNI / AVX2). This
module does the same.

Each token's activations x (one row) get their own asymmetric 8-bit grid, chosen from the
row's range when the token arrives ("dynamic"): with m = min(x, 0) and M = max(x, 0),

    s_x = (M − m) / 255,   z_x = round(−m / s_x),   q_x = clamp(round(x / s_x) + z_x, 0, 255)

(:func:`~minillm.ops.activation_qparams`, :func:`~minillm.ops.quantize_activations`; the
rule of PyTorch's and FBGEMM's dynamic quantization). A weight row o keeps its symmetric
per-channel int8 codes q_o and scale s_o. Then

    y_o ≈ s_x s_o Σ_i (q_x,i − z_x) q_o,i = s_x s_o (Σ_i q_x,i q_o,i − z_x Σ_i q_o,i),

an integer dot product (exact in int32) and one multiply per output. The rounding of x is
the price: greedy tokens drift from weight-only int8 after a dozen or so tokens, and
perplexity moves by the amount ``benchmarks/quantization.py`` reports for this row.

:class:`Int8ActivationLinear` computes this with a small C++ kernel (``csrc/int8_product.h``,
built with the machine's compiler on first use: :mod:`minillm.native`), the same arithmetic
in the same order as the readable reference, the op ``minillm::int8_linear`` written out in
:mod:`minillm.ops` (:meth:`Int8ActivationLinear.reference_product`: integer sums in
float64), so the two agree bit for bit. PyTorch ships a kernel for the same product (FBGEMM's
``quantized::linear_dynamic``); the tests check our rounding and products against it. We do
not call it in the decode step because each call costs ~13 µs before it reads a weight,
longer than a whole product of ours (``docs/benchmarks.md``).
"""

from __future__ import annotations

import torch

from .. import ops
from ..linear import CompressedLinear
from .w4a8 import W4A8Linear
from .weight_only import WeightOnlyLinear, to_weight_only


class Int8ActivationLinear(CompressedLinear):
    """Per-channel int8 weights; each input row rounded to int8 on the fly (module docstring)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(codes.shape[1], codes.shape[0], bias)
        self.register_buffer("codes", codes)  # int8 [out, in]
        self.register_buffer("scales", scales.float().reshape(-1))  # fp32 [out]
        # Σ_i q_o,i per row, for the zero-point term of the module docstring's equation.
        self.register_buffer("code_sums", codes.sum(1, dtype=torch.int32), persistent=False)

    @classmethod
    def supports(cls, layer: torch.nn.Module) -> bool:
        """Symmetric int8 codes with one scale per output row (a group spanning the row)."""
        return (isinstance(layer, WeightOnlyLinear) and layer.bits == 8
                and layer.zeros is None and layer.scales.shape[1] == 1)

    @classmethod
    def from_weight_only(cls, layer: WeightOnlyLinear) -> Int8ActivationLinear:
        if not cls.supports(layer):
            raise ValueError("int8 activations need per-channel symmetric int8 weights "
                             f"(bits=8, one scale per row), not bits={layer.bits} with "
                             f"{layer.scales.shape[1]} groups per row")
        return cls(layer.codes, layer.scales, layer.bias)

    def dense_weight(self) -> torch.Tensor:
        return self.codes.float() * self.scales[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ops.int8_linear(x.float(), self.codes, self.scales, self.code_sums)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def reference_product(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T the readable way (:func:`~minillm.ops.int8_linear_reference`)."""
        return ops.int8_linear_reference(x, self.codes, self.scales, self.code_sums)


def to_int8_activations(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` (``model`` is left as it was) whose per-channel int8 linears (and
    tied int8 head) take int8 activations (W8A8), and whose grouped int4 linears too (W4A8,
    :class:`~minillm.quant.w4a8.W4A8Linear`).

    Takes a model with int8/int4 :class:`~minillm.quant.qlinear.QuantLinear` layers (e.g.
    from ``quantize_model(model, "rtn", QuantScheme(8, symmetric=True, group_size=None))``)
    or their weight-only form; other layers are left as they are.
    """
    model = to_weight_only(model)  # a copy: the swaps below change only it
    for name, module in list(model.named_modules()):
        if Int8ActivationLinear.supports(module):
            model.set_submodule(name, Int8ActivationLinear.from_weight_only(module))
        elif W4A8Linear.supports(module):
            model.set_submodule(name, W4A8Linear.from_weight_only(module))
    return model
