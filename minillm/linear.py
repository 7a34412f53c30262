"""Linear-like layers: one contract for every way of storing a weight matrix.

The model is written with ``nn.Linear``: y = x Wᵀ + b. Later chapters change how W is
*stored* — transposed for the CPU (:mod:`minillm.weight_layout`), as integer codes
(:mod:`minillm.quant`), pruned and compressed (2:4) — but never what the layer computes.
So every format is a module that offers the same three things:

* ``in_features`` and ``out_features``;
* ``dense_weight()``: W as a float [out, in] tensor, the matrix the layer effectively
  multiplies by (what tests compare and analyses inspect);
* ``forward(x)``.

:class:`CompressedLinear` is the base of the compressed formats: it keeps the bias and,
unless a format has a faster kernel, computes the forward the simple way — rebuild W,
then one matmul. :func:`replace_linears` is the one function that swaps formats into a
model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

DEFAULT_SKIP = ("lm_head",)  # the tied lm_head is the embedding: compressed on its own
# Up to this many rows of x, a compiled product written as one sum per output row (each
# weight read once) beats a matmul: a decode step of one sequence. At 2 and 4 rows
# Inductor's loop for the sum read the weights once per row and ran slower than MKL's mm
# (SmolLM2 fp32 steps of 96 and 200 ms against 57 and 55: benchmarks/step_time.py).
MAX_REDUCTION_ROWS = 1


@runtime_checkable
class LinearLike(Protocol):
    """What every linear layer format provides (``nn.Linear`` itself: see :func:`dense_weight`)."""

    in_features: int
    out_features: int

    def dense_weight(self) -> torch.Tensor: ...

    def forward(self, x: torch.Tensor) -> torch.Tensor: ...


def dense_weight(layer: nn.Module) -> torch.Tensor:
    """The [out, in] weight of ``layer``: an ``nn.Linear``'s own, or any format's rebuilt one."""
    if isinstance(layer, nn.Linear):
        return layer.weight
    if isinstance(layer, LinearLike):
        return layer.dense_weight()
    raise TypeError(f"{type(layer).__name__} is not a linear layer (no dense_weight())")


class CompressedLinear(nn.Module):
    """Base of the compressed formats: stores the bias; the forward multiplies by
    :meth:`dense_weight`, which each format implements from its own buffers."""

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(),
                                                           requires_grad=False)

    def dense_weight(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dense_weight().to(x.dtype), self.bias)

    def nbytes(self) -> int:
        """Bytes of everything the layer stores (codes, scales, metadata, bias)."""
        return sum(t.nbytes for t in [*self.buffers(), *self.parameters()])

    @classmethod
    def from_linear(cls, linear: nn.Linear, **config) -> CompressedLinear:
        raise NotImplementedError

    def format_config(self) -> dict:
        """The options :meth:`from_linear` needs to build this layer's storage again, as
        JSON-friendly values (what a checkpoint records next to the tensors)."""
        return {}

    @classmethod
    def from_format_config(cls, linear: nn.Linear, config: dict) -> CompressedLinear:
        """A layer of this format and these options, for ``linear``'s shape (its tensors
        are then overwritten by a checkpoint's)."""
        return cls.from_linear(linear, **config)


def is_skipped(name: str, skip: tuple[str, ...]) -> bool:
    """Does the module ``name`` contain one of the ``skip`` substrings?"""
    return any(s in name for s in skip)


def replace_linears(model: nn.Module, convert: Callable[[nn.Linear], nn.Module],
                    skip: tuple[str, ...] = DEFAULT_SKIP, progress: str | None = None
                    ) -> nn.Module:
    """Swap every ``nn.Linear`` whose name contains none of ``skip`` for ``convert(linear)``,
    in place, and return the model. ``progress``: a label for a progress bar."""
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and not is_skipped(name, skip)]
    for name, linear in tqdm(targets, desc=progress, disable=progress is None):
        model.set_submodule(name, convert(linear))
    return model
