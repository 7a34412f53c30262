"""NF4: the 4-bit NormalFloat data type and double quantization (QLoRA, Dettmers et al. 2023).

Trained weights are roughly normal, so a uniform grid wastes levels in the tails where few
weights live. NF4 puts its 16 levels at *quantiles* of N(0, 1) instead (QLoRA §3, eq. 4):
each level then stands for about the same number of weights. The construction (appendix E
and bitsandbytes' ``create_normal_map``):

* 8 positive levels: Φ⁻¹ of 8 probabilities evenly spaced from δ down to 1/2 (the last,
  Φ⁻¹(1/2) = 0, is dropped), with δ = ½((1 - 1/30) + (1 - 1/32)) ≈ 0.9677, halfway between
  the outermost quantile of a 15- and a 16-level grid (Φ⁻¹(1) would be infinite);
* 7 negative levels: the same from 7 probabilities, mirrored;
* an exact zero (padding and zero weights survive), all divided by the largest: [-1, 1].

A weight tensor is flattened and cut into blocks of 64; each block is scaled by its absmax
c so it lies in [-1, 1], and each weight becomes the index of the nearest level (4 bits).
The fp32 constants c cost 32/64 = 0.5 bits per parameter. **Double quantization** (§3)
quantizes them again: subtract their mean (they are all positive), then 8-bit codes in
blocks of 256 with one fp32 scale each: 8/64 + 32/(64·256) ≈ 0.127 bits per parameter.
The paper uses 8-bit floats for that second step; we use symmetric int8 (absmax), the
simplest 8-bit grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..linear import DEFAULT_SKIP, CompressedLinear, replace_linears
from .packing import pack_int4, unpack_int4

NF4_OFFSET = 0.5 * ((1 - 1 / 30) + (1 - 1 / 32))  # δ: the outermost quantile's probability
DOUBLE_QUANT_BLOCK = 256  # absmax constants per second-level scale (QLoRA §3)


def nf4_levels() -> torch.Tensor:
    """The 16 NF4 levels in increasing order, from -1 to 1 with an exact 0 (float32)."""
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    positive = normal.icdf(torch.linspace(NF4_OFFSET, 0.5, 9, dtype=torch.float64)[:-1])
    negative = -normal.icdf(torch.linspace(NF4_OFFSET, 0.5, 8, dtype=torch.float64)[:-1])
    levels = torch.cat([negative, torch.zeros(1, dtype=torch.float64), positive]).sort().values
    return (levels / levels.max()).float()


_LEVELS = nf4_levels()


def _blocks(weight: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flatten ``weight`` and cut it into rows of ``block_size`` (the last padded with 0)."""
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    flat = weight.reshape(-1).float()
    return F.pad(flat, (0, -flat.numel() % block_size)).reshape(-1, block_size)


def nearest_level(x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Index (uint8) of the nearest of the sorted ``levels`` for every element of ``x``."""
    midpoints = (levels[1:] + levels[:-1]) / 2
    return torch.bucketize(x, midpoints).to(torch.uint8)


def quantize_blockwise(weight: torch.Tensor, levels: torch.Tensor, block_size: int = 64
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise absmax quantization to a codebook of ``levels`` in [-1, 1].

    Returns (codes uint8 [blocks, block_size], absmax float32 [blocks]); the weight's
    elements in flat order fill the blocks, the last block is padded with zeros.
    """
    blocks = _blocks(weight, block_size)
    absmax = blocks.abs().amax(dim=1)
    normalised = blocks / absmax.clamp(min=1e-12)[:, None]
    return nearest_level(normalised, levels), absmax


def dequantize_blockwise(codes: torch.Tensor, absmax: torch.Tensor, levels: torch.Tensor,
                         shape: torch.Size) -> torch.Tensor:
    """The inverse of :func:`quantize_blockwise`: levels[code] × absmax, back to ``shape``."""
    values = levels[codes.long()] * absmax[:, None]
    return values.reshape(-1)[:shape.numel()].reshape(shape)


@dataclass
class DoubleQuantized:
    """The absmax constants, quantized again: int8 codes, fp32 scale per block, fp32 mean."""

    codes: torch.Tensor  # int8 [n]
    scales: torch.Tensor  # float32 [ceil(n / block_size)]
    mean: torch.Tensor  # float32 [1]
    block_size: int

    def dequantize(self) -> torch.Tensor:
        n = self.codes.numel()
        padded = F.pad(self.codes.float(), (0, -n % self.block_size))
        values = padded.reshape(-1, self.block_size) * self.scales[:, None]
        return values.reshape(-1)[:n] + self.mean

    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes + self.mean.nbytes


def double_quantize(absmax: torch.Tensor, block_size: int = DOUBLE_QUANT_BLOCK) -> DoubleQuantized:
    """Quantize the (positive) absmax constants: subtract the mean, then symmetric int8 in
    blocks of ``block_size`` (QLoRA §3, "Double Quantization")."""
    mean = absmax.float().mean().reshape(1)
    blocks = _blocks(absmax - mean, block_size)
    scales = blocks.abs().amax(dim=1).clamp(min=1e-12) / 127
    codes = torch.round(blocks / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return DoubleQuantized(codes.reshape(-1)[:absmax.numel()], scales, mean, block_size)


def scale_bits_per_parameter(block_size: int = 64, double_quant: bool = True,
                             double_quant_block: int = DOUBLE_QUANT_BLOCK) -> float:
    """Bits the quantization constants add to each parameter: 32/64 = 0.5 with fp32 absmax,
    8/64 + 32/(64·256) ≈ 0.127 with double quantization (QLoRA §3)."""
    if not double_quant:
        return 32 / block_size
    return 8 / block_size + 32 / (block_size * double_quant_block)


class NF4Linear(CompressedLinear):
    """A linear layer stored as NF4: packed 4-bit level indices plus per-block absmax
    constants (fp32, or double-quantized). Forward: dequantize, then an ordinary matmul."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 block_size: int = 64, double_quant: bool = True):
        super().__init__(weight.shape[1], weight.shape[0], bias)
        self.block_size, self.double_quant = block_size, double_quant
        codes, absmax = quantize_blockwise(weight.detach(), _LEVELS, block_size)
        codes = codes.reshape(-1)[:weight.numel()]
        self.register_buffer("codes", pack_int4(F.pad(codes, (0, codes.numel() % 2))))
        if double_quant:
            dq = double_quantize(absmax)
            self.register_buffer("absmax_codes", dq.codes)
            self.register_buffer("absmax_scales", dq.scales)
            self.register_buffer("absmax_mean", dq.mean)
        else:
            self.register_buffer("absmax", absmax)

    @classmethod
    def from_linear(cls, linear: nn.Linear, block_size: int = 64,
                    double_quant: bool = True) -> NF4Linear:
        return cls(linear.weight, linear.bias, block_size, double_quant)

    def format_config(self) -> dict:
        return {"block_size": self.block_size, "double_quant": self.double_quant}

    def block_absmax(self) -> torch.Tensor:
        """The absmax of every block, as the forward pass uses it (after double quant)."""
        if not self.double_quant:
            return self.absmax
        return DoubleQuantized(self.absmax_codes, self.absmax_scales, self.absmax_mean,
                               DOUBLE_QUANT_BLOCK).dequantize()

    def dense_weight(self) -> torch.Tensor:
        shape = torch.Size((self.out_features, self.in_features))
        codes = unpack_int4(self.codes)[:shape.numel()]
        codes = F.pad(codes, (0, -codes.numel() % self.block_size)).reshape(-1, self.block_size)
        return dequantize_blockwise(codes, self.block_absmax(), _LEVELS, shape)


def quantize_model_nf4(model: nn.Module, *, block_size: int = 64, double_quant: bool = True,
                       skip: tuple[str, ...] = DEFAULT_SKIP, progress: bool = False) -> nn.Module:
    """Replace the model's ``nn.Linear`` layers (except ``skip``) by :class:`NF4Linear`."""
    return replace_linears(
        model, lambda linear: NF4Linear.from_linear(linear, block_size, double_quant), skip,
        progress="NF4" if progress else None)
