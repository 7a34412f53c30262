"""QuantLinear: a linear layer whose weight is stored as packed integers.

``quantize_model_rtn(model, scheme)`` swaps every ``nn.Linear`` (except those named in
``skip``, by default the lm_head) for a :class:`QuantLinear` holding

* ``codes``: the integer weights packed into a dense bit stream (``packing.py``): two
  4-bit codes per byte (low nibble first), eight 3-bit codes per three bytes; 8-bit codes
  (or rows whose bits do not fill whole bytes) one per byte;
* ``scales`` and ``zeros`` per group, in fp16 (they are counted in the model's size).

The forward pass dequantizes the weight and runs an ordinary matmul: the simple CPU path.
Memory is what shrinks; a fused dequant-matmul kernel is what makes it fast on a GPU.
"""

from __future__ import annotations

from dataclasses import asdict

import torch
from torch import nn

from ..linear import DEFAULT_SKIP, CompressedLinear, replace_linears
from .basic import Quantized, QuantScheme, quantize
from .packing import pack_bits, unpack_bits, unpack_int4


class QuantLinear(CompressedLinear):
    """A linear layer that stores its weight as integer codes plus fp16 group scales/zeros.

    Any quantizer that produces a :class:`~minillm.quant.basic.Quantized` weight (round to
    nearest, GPTQ, AWQ) builds one: ``QuantLinear(quantized, bias)``.
    """

    def __init__(self, quantized: Quantized, bias: torch.Tensor | None = None):
        out_features, in_features = quantized.codes.shape
        super().__init__(in_features, out_features, bias)
        scheme = quantized.scheme
        self.scheme = scheme
        codes, zeros = quantized.codes, quantized.zeros
        if scheme.symmetric:  # store as unsigned: shift codes and zero by the half range
            half = 2 ** (scheme.bits - 1)
            codes, zeros = (codes.to(torch.int16) + half).to(torch.uint8), zeros + half
        self.packed = scheme.bits < 8 and (self.in_features * scheme.bits) % 8 == 0
        self.register_buffer("codes", pack_bits(codes, scheme.bits) if self.packed else codes)
        self.register_buffer("scales", quantized.scales.half())
        self.register_buffer("zeros", zeros.half())

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: QuantScheme) -> QuantLinear:
        """Round-to-nearest quantization of ``linear``'s weight."""
        return cls(quantize(linear.weight.detach(), scheme), linear.bias)

    def format_config(self) -> dict:
        return {"scheme": asdict(self.scheme)}

    @classmethod
    def from_format_config(cls, linear: nn.Linear, config: dict) -> QuantLinear:
        return cls.from_linear(linear, QuantScheme(**config["scheme"]))

    def codes_unpacked(self) -> torch.Tensor:
        """The integer codes, one uint8/int8 per weight, [out, in]."""
        if not self.packed:
            return self.codes
        if self.scheme.bits == 4:  # the same layout; splitting nibbles is the fast path
            return unpack_int4(self.codes)
        return unpack_bits(self.codes, self.scheme.bits)

    def dense_weight(self) -> torch.Tensor:
        return Quantized(self.codes_unpacked(), self.scales.float(), self.zeros.float(),
                         self.scheme).dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """On a GPU, 4-bit nibble-packed codes with group or per-channel scales go
        through the fused Triton kernel (``minillm.kernels.w4a16_matmul``), which never
        writes the dequantized weight to memory; elsewhere: dequantize, then matmul."""
        scheme = self.scheme
        if x.is_cuda and scheme.bits == 4 and self.packed and not scheme.per_tensor \
                and x.dtype in (torch.float16, torch.float32):
            from ..kernels.w4a16_matmul import w4a16_matmul  # Triton: imported on GPU only

            group = min(scheme.group_size or self.in_features, self.in_features)
            y = w4a16_matmul(x, self.codes, self.scales, self.zeros, group)
            return y if self.bias is None else y + self.bias.to(y.dtype)
        return super().forward(x)


def quantize_model_rtn(model: nn.Module, scheme: QuantScheme, *,
                       skip: tuple[str, ...] = DEFAULT_SKIP, progress: bool = False) -> nn.Module:
    """Round every ``nn.Linear`` (except ``skip``) to ``scheme``'s grid: :class:`QuantLinear`
    layers, in place."""
    return replace_linears(model, lambda linear: QuantLinear.from_linear(linear, scheme), skip,
                           progress="RTN" if progress else None)


def model_nbytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers, each tensor counted once (tied weights once)."""
    tensors = {t.data_ptr(): t for t in [*model.parameters(), *model.buffers()]}
    tables = [getattr(model, name, None) for name in ("rope", "local_rope")]
    rope = {t.data_ptr() for table in tables if table is not None for t in (table.cos, table.sin)}
    return sum(t.nbytes for ptr, t in tensors.items() if ptr not in rope)


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every stored tensor once, except the embedding
    table, of which a step reads one row (unless the lm_head shares it: then it is read in
    full). Works for any storage format (fp32, transposed, quantized, compact embedding)."""
    embedding = _stored_tensors(model.embed_tokens)
    shared_with_head = embedding.keys() & _stored_tensors(model.lm_head).keys()
    total = model_nbytes(model)
    if not shared_with_head:
        total -= sum(t.nbytes for t in embedding.values())
    return total


def _stored_tensors(module: torch.nn.Module) -> dict[int, torch.Tensor]:
    return {t.data_ptr(): t for t in [*module.parameters(), *module.buffers()]}
