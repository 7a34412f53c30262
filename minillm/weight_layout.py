"""Weight layout for fast CPU decoding: store linear weights transposed, as [in, out].

Decoding one token is a chain of matrix-vector products, so its speed is the speed at
which weights stream from memory. ``nn.Linear`` keeps W as [out, in] and computes
``x @ W.T``; for a single row x, PyTorch's CPU path for that layout reads memory at
about half the rate of ``x @ W_t`` with ``W_t`` stored [in, out] contiguous (measured
in ``benchmarks/decode.py``). Same numbers, same math, different order in memory.

This is an optimization written as a transformation of the plain model (as in
gpt-fast): ``transpose_linear_weights(model)`` swaps every ``nn.Linear`` for a
:class:`TransposedLinear` holding the same weights. A tied lm_head gets its own
transposed copy (the embedding must stay [vocab, hidden] for row lookups), which costs
vocab x hidden more memory.
"""

from __future__ import annotations

import torch
from torch import nn

from .linear import replace_linears


class TransposedLinear(nn.Module):
    """``y = x @ weight_t + bias`` with ``weight_t`` [in_features, out_features]."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = linear.bias

    def dense_weight(self) -> torch.Tensor:
        """The usual [out, in] view (the linear-layer contract of :mod:`minillm.linear`)."""
        return self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight_t
        return y if self.bias is None else y + self.bias


def transpose_linear_weights(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` in ``model`` by a :class:`TransposedLinear` (in place)."""
    return replace_linears(model, TransposedLinear, skip=())
