"""The layers of a tensor-parallel model: each calls its collective in its own forward.

Megatron-LM's split of a linear layer y = x Wᵀ + b over ``t`` ranks (Shoeybi et al. 2019,
§3):

* :class:`ColumnParallelLinear` holds W's rows for this rank's outputs (``dim=0``): it
  computes its slice of y from the whole x, with no communication (q/k/v, gate/up);
* :class:`RowParallelLinear` holds W's columns for this rank's inputs (``dim=1``): from
  its slice of x it computes a partial sum of y, and ``reduce`` (an all-reduce) adds the
  ranks' parts (o_proj, down_proj: their input slice is exactly the column-parallel
  output before them). The bias is kept by rank 0 only, so the sum counts it once;
* :class:`VocabParallelEmbedding` holds the embedding rows of this rank's tokens; a
  lookup zeroes the tokens it does not own, and ``reduce`` fills them in from their
  owners;
* :class:`ParallelLMHead` computes the logits of this rank's tokens and gathers the
  whole vocabulary.

Each wraps the rank's shard as an ordinary layer of any format (``nn.Linear``, a
quantized ``QuantLinear``, an int8-activation layer...), so a format needs no parallel
version of its own. The collectives go through :func:`all_reduce` and
:func:`all_gather_last`, which count every call (:data:`COLLECTIVES`): that is how the
tests check Megatron's two all-reduces per block. Sequence parallelism
(:mod:`.sequence`) builds the same layers with a reduce-scatter as ``reduce``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

COLLECTIVES: Counter = Counter()  # "all_reduce" / "all_gather" calls on this rank
Reduce = Callable[[torch.Tensor], torch.Tensor]


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over every rank (in place), counted."""
    COLLECTIVES["all_reduce"] += 1
    dist.all_reduce(x)
    return x


def all_gather_last(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x`` along the last dimension, in rank order, counted."""
    COLLECTIVES["all_gather"] += 1
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


class ColumnParallelLinear(nn.Module):
    """This rank's output columns of a linear layer: ``shard`` holds W's rows for them."""

    def __init__(self, shard: nn.Module):
        super().__init__()
        self.shard = shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shard(x)


class RowParallelLinear(nn.Module):
    """A linear layer fed this rank's slice of the input: ``shard`` holds W's columns for
    it (and the bias on rank 0 only); ``reduce`` sums the ranks' partial outputs."""

    def __init__(self, shard: nn.Module, reduce: Reduce = all_reduce):
        super().__init__()
        self.shard, self.reduce = shard, reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(self.shard(x))


class VocabParallelEmbedding(nn.Module):
    """Embedding rows of the tokens [start, start + rows); other tokens look up zeros, and
    ``reduce`` fills them in from their owners."""

    def __init__(self, weight: torch.Tensor, rank: int, reduce: Reduce = all_reduce):
        super().__init__()
        self.rows = weight.shape[0]
        self.start = rank * self.rows
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.reduce = reduce

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        local = token_ids - self.start
        owned = (local >= 0) & (local < self.rows)
        x = nn.functional.embedding(local.clamp(0, self.rows - 1), self.weight)
        return self.reduce(x * owned[..., None])


class ParallelLMHead(nn.Module):
    """Logits of this rank's tokens, gathered into the full vocabulary."""

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight  # the embedding shard's parameter when they are tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last(x @ self.weight.T)
