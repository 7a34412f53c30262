"""Sparsity: pruning weights to zero, unstructured or in the 2:4 pattern GPUs accelerate.

Pruning sets a fraction of a layer's weights to zero and keeps the rest unchanged. Which
weights go is decided by a *score*:

* **magnitude** (Han et al. 2015): score |W_ij|; the smallest weights of the whole layer
  go, on the idea that they contribute least.
* **Wanda** (Sun et al. 2023, "pruning by Weights AND Activations", eq. 1):
  S_ij = |W_ij| · ||X_j||₂, where ||X_j||₂ is the norm of input feature j over a few
  calibration tokens. LLMs have a few input features with huge activations; a small weight
  on such a feature matters more than a big one on a quiet feature. Wanda compares weights
  within each output row (sec. 3) and needs no weight update, no gradient, one pass.

Two patterns:

* **unstructured**: any weights may go. Fine-grained, so the least damage at a given
  sparsity, but the zeros are scattered: storing them takes indices, and neither GPUs nor
  CPUs multiply an irregular 50%-sparse matrix faster than a dense one.
* **N:M structured** (2:4): in every group of M = 4 consecutive inputs of a row, keep the
  N = 2 with the highest score. Exactly half the weights go, in a pattern NVIDIA's sparse
  tensor cores (Ampere and later, Mishra et al. 2021) execute at up to 2x the dense math
  throughput: they store the 2 kept values of each group plus a 2-bit position for each
  (:class:`Sparse24Linear` stores exactly that: fp16 values + metadata = 56% of dense fp16
  bytes) and skip the zeros in hardware. CPUs have no such unit: on a CPU 2:4 sparsity
  saves memory (and memory-bound time, with a suitable kernel), not arithmetic.

:func:`sparsify_model` prunes a model in place; with ``compress=True`` its 2:4 layers
become :class:`Sparse24Linear`, and with a :class:`~minillm.quant.basic.QuantScheme` the
kept values are also quantized (sparse + quantized, as in SparseGPT's 2:4 + 4-bit results).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import torch
from torch import nn

from ..linear import DEFAULT_SKIP, CompressedLinear, is_skipped, replace_linears
from .basic import QuantScheme, quantize
from .calibration import blocks_with_inputs, linear_layers
from .packing import pack_bits, unpack_bits
from .qlinear import QuantLinear

METHODS = ("magnitude", "wanda")


def _check_sparsity(sparsity: float) -> None:
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity is the fraction of weights to prune, in [0, 1); "
                         f"got {sparsity}")


def unstructured_mask(scores: torch.Tensor, sparsity: float,
                      per_row: bool = False) -> torch.Tensor:
    """Boolean keep-mask that prunes the ``round(sparsity * n)`` lowest ``scores``.

    ``per_row=False``: n counts the whole matrix (magnitude pruning's per-layer threshold);
    ``per_row=True``: each output row loses the same fraction (Wanda's comparison group).
    The count is exact even when scores tie at the threshold (SmolLM2's weights take only
    16 values per group of 32): tied scores go first come, first served.
    """
    _check_sparsity(sparsity)
    rows = scores if per_row else scores.reshape(1, -1)
    num_pruned = round(sparsity * rows.shape[1])
    if num_pruned == 0:
        return torch.ones_like(scores, dtype=torch.bool)
    threshold = rows.kthvalue(num_pruned, dim=1, keepdim=True).values  # a selection, no sort
    below, tied = rows < threshold, rows == threshold
    still_needed = num_pruned - below.sum(dim=1, keepdim=True)
    pruned = below | (tied & (tied.cumsum(dim=1) <= still_needed))
    return (~pruned).reshape(scores.shape)


def magnitude_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Keep-mask of magnitude pruning: the smallest ``sparsity`` fraction of |W| goes."""
    return unstructured_mask(weight.abs(), sparsity)


def nm_mask(scores: torch.Tensor, n: int = 2, m: int = 4) -> torch.Tensor:
    """Keep-mask with the N:M pattern: in each group of ``m`` consecutive inputs of a row,
    the ``n`` highest ``scores`` stay (2:4 by default: exactly half). Among equal scores the
    earlier input stays (a stable sort), so masks of tied weights are reproducible."""
    out, inp = scores.shape
    if not 0 < n < m or inp % m:
        raise ValueError(f"N:M needs 0 < N < M and in_features ({inp}) a multiple of M; "
                         f"got {n}:{m}")
    groups = scores.reshape(out, inp // m, m)
    keep = groups.argsort(dim=-1, descending=True, stable=True)[..., :n]
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True).reshape(out, inp)


def input_norms(block: nn.Module, inputs) -> dict[str, torch.Tensor]:
    """||X_j||₂ of every input feature j of each linear layer in ``block``, over all the
    calibration tokens (``inputs`` from :func:`~minillm.quant.calibration.blocks_with_inputs`)."""
    squares: dict[str, torch.Tensor] = {}

    def record(name: str, x: torch.Tensor) -> None:
        total = x.float().pow(2).sum(dim=0)
        squares[name] = squares[name] + total if name in squares else total

    inputs.capture(block, record)
    return {name: total.sqrt() for name, total in squares.items()}


def wanda_scores(weight: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """S_ij = |W_ij| · ||X_j||₂ (Wanda, eq. 1): weight [out, in], norms [in]."""
    return weight.abs() * norms[None, :]


def _positions_table() -> tuple[torch.Tensor, torch.Tensor]:
    """For each 4-bit pattern of non-zeros in a group of 4: the 2 positions to store (the
    non-zeros, then the lowest zero positions), and whether the pattern is 2:4 at all."""
    table = torch.zeros(16, 2, dtype=torch.long)
    valid = torch.zeros(16, dtype=torch.bool)
    for pattern in range(16):
        nonzero = [p for p in range(4) if pattern >> p & 1]
        if len(nonzero) <= 2:
            filler = [p for p in range(4) if p not in nonzero][:2 - len(nonzero)]
            table[pattern] = torch.tensor(sorted(nonzero + filler))
            valid[pattern] = True
    return table, valid


_POSITIONS, _IS_24 = _positions_table()


def compress_24(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2:4-sparse [out, in] matrix -> (values [out, in/2], indices [out, in/2] uint8).

    For each group of 4 inputs: the 2 kept values and their positions 0..3, in increasing
    order (the layout of NVIDIA's sparse tensor cores). The kept values are the non-zeros;
    a group with fewer than 2 keeps zeros as well; one with more is not 2:4 and raises.
    The group's pattern of non-zeros (4 bits) indexes a table of positions: no sorting.
    """
    out, inp = weight.shape
    if inp % 4:
        raise ValueError(f"2:4 needs in_features to be a multiple of 4, got {inp}")
    groups = weight.reshape(out, inp // 4, 4)
    nonzero = (groups != 0).to(torch.uint8)
    pattern = (nonzero[..., 0] | nonzero[..., 1] << 1 | nonzero[..., 2] << 2
               | nonzero[..., 3] << 3).long()
    if not _IS_24.to(weight.device)[pattern].all():
        raise ValueError("the weight is not 2:4 sparse (a group of 4 has more than 2 "
                         "non-zeros): multiply it by nm_mask(weight.abs()) first")
    indices = _POSITIONS.to(weight.device)[pattern]
    values = groups.gather(-1, indices)
    return values.reshape(out, inp // 2), indices.reshape(out, inp // 2).to(torch.uint8)


def decompress_24(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`compress_24`: (values, indices) [out, in/2] -> dense [out, in]."""
    out, half = values.shape
    dense = torch.zeros(out, half // 2, 4, dtype=values.dtype, device=values.device)
    dense.scatter_(-1, indices.reshape(out, half // 2, 2).long(), values.reshape(out, half // 2, 2))
    return dense.reshape(out, 2 * half)


class Sparse24Linear(CompressedLinear):
    """A linear layer stored in the compressed 2:4 form of NVIDIA's sparse tensor cores.

    Buffers: ``values`` [out, in/2] fp16 (the kept weights) and ``metadata`` [out, in/8]
    uint8 (each kept weight's 2-bit position in its group of 4, four positions a byte):
    2 + 0.25 bytes per pair of dense weights, 56% of fp16. With ``scheme`` the kept values
    are quantized too (round to nearest, held in a :class:`QuantLinear` of shape
    [out, in/2] whose groups count *kept* values: group 64 spans 128 dense inputs).

    On a GPU with sparse tensor cores the compressed form feeds the hardware directly
    (``torch.sparse.to_sparse_semi_structured``); here the forward decompresses exactly and
    runs a dense matmul: memory shrinks, arithmetic does not.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 scheme: QuantScheme | None = None):
        super().__init__(weight.shape[1], weight.shape[0], bias)
        if self.in_features % 8:
            raise ValueError(f"Sparse24Linear needs in_features to be a multiple of 8 (whole "
                             f"metadata bytes), got {self.in_features}")
        values, indices = compress_24(weight.detach())
        self.scheme = scheme
        self.register_buffer("metadata", pack_bits(indices, 2))
        if scheme is None:
            self.register_buffer("values", values.half())
            self.quantized_values = None
        else:
            self.register_buffer("values", None)
            self.quantized_values = QuantLinear(quantize(values.float(), scheme))

    @classmethod
    def from_linear(cls, linear: nn.Linear, mask: torch.Tensor | None = None,
                    scheme: QuantScheme | None = None) -> Sparse24Linear:
        """Prune ``linear`` with a 2:4 ``mask`` (default: magnitude) and compress it."""
        weight = linear.weight.detach()
        mask = nm_mask(weight.abs()) if mask is None else mask
        return cls(weight * mask, linear.bias, scheme)

    def format_config(self) -> dict:
        return {"scheme": None if self.scheme is None else asdict(self.scheme)}

    @classmethod
    def from_format_config(cls, linear: nn.Linear, config: dict) -> Sparse24Linear:
        scheme = config["scheme"]
        return cls.from_linear(linear, scheme=None if scheme is None else QuantScheme(**scheme))

    def kept_values(self) -> torch.Tensor:
        if self.quantized_values is not None:  # contiguous: group padding leaves a view
            return self.quantized_values.dense_weight().contiguous()
        return self.values.float()

    def dense_weight(self) -> torch.Tensor:
        return decompress_24(self.kept_values(), unpack_bits(self.metadata, 2))


def _parse_pattern(pattern: str | None, sparsity: float | None) -> tuple[int, int] | None:
    """"N:M" -> (N, M); None (unstructured, needs ``sparsity``) -> None."""
    if (pattern is None) == (sparsity is None):
        raise ValueError("give either pattern='2:4' (N:M structured) or sparsity=0.5 "
                         "(unstructured), not both")
    if pattern is None:
        _check_sparsity(sparsity)
        return None
    try:
        n, m = (int(part) for part in pattern.split(":"))
    except ValueError:
        raise ValueError(f"pattern must look like '2:4', got {pattern!r}") from None
    return n, m


def _pruned(linear: nn.Linear, mask: torch.Tensor, compress: bool,
            scheme: QuantScheme | None) -> nn.Module:
    """``linear`` with its pruned weights zeroed in place, or its compressed 2:4 layer."""
    if compress:
        return Sparse24Linear.from_linear(linear, mask, scheme)
    linear.weight.data.mul_(mask)
    return linear


def sparsify_model(model: nn.Module, pattern: str | None = None, sparsity: float | None = None,
                   method: str = "magnitude", windows: torch.Tensor | None = None,
                   compress: bool = False, scheme: QuantScheme | None = None,
                   skip: tuple[str, ...] = DEFAULT_SKIP, batch_size: int = 8,
                   progress: bool = True) -> nn.Module:
    """Prune every ``nn.Linear`` of ``model`` (except names containing ``skip``) in place.

    * ``pattern="2:4"`` (any "N:M") or ``sparsity=0.5`` (unstructured), one of the two;
    * ``method="magnitude"`` (|W|, per layer) or ``"wanda"`` (|W| · ||X||₂, per output
      row), which needs calibration ``windows`` [n, seq] of token ids: block by block, the
      inputs each block's linear layers see are recorded, its layers pruned, and the
      pruned block's outputs feed the next block (Wanda's procedure);
    * ``compress=True`` (2:4 only) stores the layers as :class:`Sparse24Linear`, and a
      ``scheme`` quantizes their kept values as well.
    """
    nm = _parse_pattern(pattern, sparsity)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "wanda" and windows is None:
        raise ValueError("Wanda needs calibration inputs: pass windows="
                         "minillm.quant.calibration.calibration_windows(tokenizer, 16)")
    if (compress or scheme is not None) and nm != (2, 4):
        raise ValueError("only the 2:4 pattern has a compressed form: use pattern='2:4' "
                         "with compress=True or a scheme")
    compress = compress or scheme is not None

    def mask_for(scores: torch.Tensor, per_row: bool) -> torch.Tensor:
        return unstructured_mask(scores, sparsity, per_row) if nm is None else nm_mask(scores, *nm)

    if method == "magnitude":
        return replace_linears(
            model, lambda linear: _pruned(linear, mask_for(linear.weight.detach().abs(), False),
                                          compress, scheme),
            skip, progress="pruning" if progress else None)
    for index, block, inputs in blocks_with_inputs(model, windows, batch_size, progress,
                                                   desc="wanda"):
        norms = input_norms(block, inputs)
        for name, linear in linear_layers(block).items():
            if not is_skipped(f"layers.{index}.{name}", skip):
                mask = mask_for(wanda_scores(linear.weight.detach(), norms[name]), per_row=True)
                block.set_submodule(name, _pruned(linear, mask, compress, scheme))
    return model


def quantize_model_sparse24(model: nn.Module, scheme: QuantScheme | None = None, *,
                            prune: str = "magnitude", windows: torch.Tensor | None = None,
                            skip: tuple[str, ...] = DEFAULT_SKIP,
                            progress: bool = True) -> nn.Module:
    """Prune every linear layer to 2:4 and store it compressed (:class:`Sparse24Linear`),
    its kept values quantized by ``scheme`` if one is given: the registry's ``"sparse24"``.
    ``prune``: ``"magnitude"``, or ``"wanda"`` (needs ``windows``)."""
    return sparsify_model(model, pattern="2:4", method=prune, windows=windows, compress=True,
                          scheme=scheme, skip=skip, progress=progress)


def zeros_keeper(model: nn.Module) -> Callable[[], None]:
    """Remember where the dense linear weights of a pruned ``model`` are zero; the function
    returned puts those zeros back. A fine-tune calls it after every optimizer step (the
    gradient of a pruned weight is not zero, so a step would revive it): the model learns
    with its sparsity pattern fixed, as SparseGPT and Wanda fine-tune their pruned models.
    """
    masks = [(module.weight, module.weight != 0) for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and name != "lm_head"]

    @torch.no_grad()
    def put_zeros_back() -> None:
        for weight, kept in masks:
            weight.mul_(kept)

    return put_zeros_back


def weight_sparsity(model: nn.Module) -> float:
    """Fraction of exact zeros among the weights of the model's linear layers (dense and
    :class:`Sparse24Linear`), the tied lm_head/embedding excluded."""
    zeros = total = 0
    for name, module in model.named_modules():
        if isinstance(module, Sparse24Linear):
            weight = module.dense_weight()
        elif isinstance(module, nn.Linear) and name != "lm_head":
            weight = module.weight
        else:
            continue
        zeros += int((weight == 0).sum())
        total += weight.numel()
    return zeros / total
