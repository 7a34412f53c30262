"""Weight-only int8 and int4 linear layers, laid out so CPU decoding reads fewer bytes.

Decoding one token multiplies a vector by every weight matrix, so a step takes about
``bytes of weights / memory bandwidth``. Stored as int8 a weight is 1 byte instead of 4
(fp32); as int4 half a byte, plus a scale and a zero point per group. That only buys speed
if turning codes back into numbers costs less than the memory traffic it saves, and the
way the computation is *written* decides it (``benchmarks/decode.py`` measures it):

* ``F.linear(x, codes.float() * scales)`` first writes the whole fp32 weight to memory and
  reads it back: slower than fp32 itself.
* The same numbers as one reduction per output row,

      y_o = Σ_i x_i · s_{o,g(i)} · q_{o,i}  −  Σ_g s_{o,g} z_{o,g} · X_g,   X_g = Σ_{i∈g} x_i

  (the group's scale multiplies inside the sum, the zero points become a small correction
  with the group sums of x), read each code byte once. ``torch.compile`` (Inductor) turns
  it into one vectorized C++ loop per layer: load 16 codes, convert, multiply, accumulate.

The layout serves that loop. int8 codes stay [out, in]. int4 codes are packed two per byte
*within each group*: the low nibbles of a group's ``g/2`` bytes hold its first ``g/2``
codes and the high nibbles its last ``g/2``, so unpacking is one AND and one shift on a
whole vector, matched by the first and second half of the group's inputs (no interleave).

Compiled, at batch 1 (and any small number of rows), :class:`WeightOnlyLinear` computes
the reduction above; for a prompt (many rows) the arithmetic dominates, so it dequantizes
the weight once and runs one matmul — as it also does when run eagerly, where the
reduction would materialise every product in memory. Both multiply by ``dense_weight()``:
the numbers of the :class:`~minillm.quant.qlinear.QuantLinear` or compact embedding the
layer was built from.
"""

from __future__ import annotations

import torch
from torch import nn

from ..linear import MAX_REDUCTION_ROWS, CompressedLinear
from ..transform import copy_modules
from .embedding import CompactEmbedding, TiedLMHead
from .qlinear import QuantLinear


def pack_int4_groups(codes: torch.Tensor, group_size: int) -> torch.Tensor:
    """uint8 codes in [0, 15], [out, in] -> [out, in / group_size, group_size / 2] bytes whose
    low nibbles hold each group's first half and high nibbles its second half."""
    out, inp = codes.shape
    groups = codes.reshape(out, inp // group_size, 2, group_size // 2)
    return groups[:, :, 0] | (groups[:, :, 1] << 4)


def unpack_int4_groups(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4_groups`: bytes [out, G, g/2] -> codes [out, G * g]."""
    return torch.cat([packed & 15, packed >> 4], dim=-1).flatten(1)


class WeightOnlyLinear(CompressedLinear):
    """An int8 or int4 weight with fp16 scales (and zero points) per group of inputs,
    multiplied without materialising it at batch 1. Build one from a :class:`QuantLinear`
    (:meth:`from_quant_linear`) or a tied int8 embedding (:meth:`from_int8_embedding`)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                 bits: int, bias: torch.Tensor | None = None):
        out_features, groups = scales.shape
        in_features = codes.shape[1] if bits == 8 else codes.shape[1] * codes.shape[2] * 2
        super().__init__(in_features, out_features, bias)
        self.bits, self.group_size = bits, in_features // groups
        self.register_buffer("codes", codes)  # int8/uint8 [out, in], or uint8 [out, G, g/2]
        self.register_buffer("scales", scales)  # fp16 [out, G]
        self.register_buffer("zeros", zeros)  # fp16 [out, G], or None when q = 0 means w = 0

    @classmethod
    def supports(cls, layer: QuantLinear) -> bool:
        """8-bit codes, or 4-bit codes in groups of an even size that divides the row."""
        scheme, inp = layer.scheme, layer.in_features
        if scheme.per_tensor or scheme.bits not in (4, 8):
            return False
        group = min(scheme.group_size or inp, inp)
        return inp % group == 0 and (scheme.bits == 8 or group % 2 == 0)

    @classmethod
    def from_quant_linear(cls, layer: QuantLinear) -> WeightOnlyLinear:
        """The same numbers as ``layer``, in the decode layout (see :meth:`supports`)."""
        if not cls.supports(layer):
            raise ValueError(f"no weight-only layout for {layer.scheme}: it needs 8 bits, or "
                             "4 bits in even groups that divide the row")
        codes, zeros = layer.codes_unpacked(), layer.zeros
        if layer.scheme.bits == 8 and layer.scheme.symmetric:  # back to signed, zero = 0
            codes, zeros = (codes.to(torch.int16) - 128).to(torch.int8), None
        elif layer.scheme.bits == 4:
            codes = pack_int4_groups(codes, layer.in_features // layer.scales.shape[1])
        return cls(codes, layer.scales, zeros, layer.scheme.bits, layer.bias)

    @classmethod
    def from_int8_embedding(cls, embedding: CompactEmbedding) -> WeightOnlyLinear:
        """A tied lm_head over an int8 embedding table, sharing its storage."""
        if embedding.fmt != "int8":
            raise ValueError(f"only an int8 embedding has a weight-only head, not {embedding.fmt}")
        return cls(embedding.table, embedding.scales, None, bits=8)

    def codes_unpacked(self) -> torch.Tensor:
        return self.codes if self.bits == 8 else unpack_int4_groups(self.codes)

    def dense_weight(self) -> torch.Tensor:
        codes = self.codes_unpacked().float().unflatten(1, (-1, self.group_size))
        if self.zeros is not None:
            codes = codes - self.zeros.float()[..., None]
        return (codes * self.scales.float()[..., None]).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > MAX_REDUCTION_ROWS or not torch.compiler.is_compiling():
            return super().forward(x)  # dequantize once, then one matmul
        y = self._reduce(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """y_o = Σ_i x_i s_{o,g(i)} q_{o,i} − Σ_g s_{o,g} z_{o,g} X_g, one sum per output row."""
        groups, scales = self.scales.shape[1], self.scales.to(x.dtype)[..., None]
        xg = x.unflatten(-1, (groups, self.group_size)).unsqueeze(-3)  # [..., 1, G, g]
        if self.bits == 8:
            products = xg * (self.codes.unflatten(1, (groups, -1)).to(x.dtype) * scales)
        else:
            half = self.group_size // 2
            low, high = (self.codes & 15).to(x.dtype), (self.codes >> 4).to(x.dtype)
            products = xg[..., :half] * (low * scales) + xg[..., half:] * (high * scales)
        y = products.sum((-2, -1))
        if self.zeros is not None:
            offsets = self.scales.to(x.dtype) * self.zeros.to(x.dtype)  # [out, G]
            y = y - (xg.sum(-1) * offsets).sum(-1)
        return y


def to_weight_only(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (sharing the tensors it does not change; ``model`` is left as it
    was) whose int8/int4 :class:`QuantLinear` layers and tied int8 head have the decode
    layout; it computes the same numbers."""
    model = copy_modules(model)
    for name, module in list(model.named_modules()):
        if isinstance(module, QuantLinear) and WeightOnlyLinear.supports(module):
            model.set_submodule(name, WeightOnlyLinear.from_quant_linear(module))
        elif isinstance(module, TiedLMHead) and module.embedding.fmt == "int8":
            model.set_submodule(name, WeightOnlyLinear.from_int8_embedding(module.embedding))
    return model
