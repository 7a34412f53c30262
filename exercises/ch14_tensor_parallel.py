# Generated from solutions/ch14_tensor_parallel.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 14 lab: tensor-parallel layers — column- and row-parallel linears, a
vocabulary-parallel embedding and LM head that call ``torch.distributed`` themselves, and
the decoder layer built from them, which the engine runs on several processes
(``LLM(..., tensor_parallel_size=2, parallel_layers=this_module)``).

Every rank of a ``torch.distributed`` group builds the same layers from the same whole
weights, keeping only its part; each layer's ``forward`` runs on every rank at once, with
the same input, and calls its collective on the default group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from minillm.model import Block
from minillm.transform import copy_modules


def _part(size: int, rank: int, world: int, what: str) -> slice:
    """Exercise 14.7: Rank ``rank``'s contiguous run of ``size`` indices (one of ``world``).

    A helper for the layers below (yours to shape as you like): ``slice(r·n, (r + 1)·n)``
    with ``n = size / world``; a ``size`` that does not divide raises ValueError naming
    ``what`` was being split.
    """
    raise NotImplementedError("Exercise 14.7: Rank ``rank``'s contiguous run of ``size`` indices (one of ``world``)")


class ColumnParallelLinear(nn.Module):
    """Exercise 14.7: A linear layer's output features split over the ranks (column-parallel).

    ``ColumnParallelLinear(linear, rank, world)``: from the whole ``nn.Linear``
    ``linear`` (y = x Wᵀ + b, W [out, in]), rank r keeps what it needs to compute output
    features [r·out/t, (r + 1)·out/t) — the same contiguous block the weight loader and
    ``shard_weight`` give it — as tensors of its own (copies: the rank frees the rest),
    in the weight's dtype. ``out`` must divide by ``world``, else ValueError.

    ``forward(x)``: x [..., in], the whole input, the same on every rank -> this rank's
    block of y, [..., out/t]. The ranks' outputs side by side (rank order) are y.
    No communication. ``linear`` is left as it was.
    Hint: Megatron-LM (Shoeybi et al. 2019) §3, eq. 3; the notebook's section 1.
    """

    def __init__(self, linear: nn.Linear, rank: int, world: int):
        super().__init__()
        raise NotImplementedError("Exercise 14.7: A linear layer's output features split over the ranks (column-parallel)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Exercise 14.7: A linear layer's output features split over the ranks (column-parallel)")


class RowParallelLinear(nn.Module):
    """Exercise 14.7: A linear layer fed a slice of its input features (row-parallel).

    ``RowParallelLinear(linear, rank, world)``: from the whole ``nn.Linear`` ``linear``,
    rank r keeps what it needs for input features [r·in/t, (r + 1)·in/t) (its own copies,
    the weight's dtype). ``in`` must divide by ``world``, else ValueError.

    ``forward(x_r)``: x_r [..., in/t], this rank's slice of the input (exactly a
    column-parallel layer's output before it) -> the whole y = x Wᵀ + b, [..., out], the
    same on every rank. Exactly one ``torch.distributed`` collective per call, on the
    default group; the bias counts once, however many ranks. ``linear`` is left as it was.
    Hint: Megatron-LM §3 (the ``g`` operator); ``torch.distributed.all_reduce``.
    """

    def __init__(self, linear: nn.Linear, rank: int, world: int):
        super().__init__()
        raise NotImplementedError("Exercise 14.7: A linear layer fed a slice of its input features (row-parallel)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Exercise 14.7: A linear layer fed a slice of its input features (row-parallel)")


class VocabParallelEmbedding(nn.Module):
    """Exercise 14.8: An embedding table split over the ranks by vocabulary rows.

    ``VocabParallelEmbedding(weight, rank, world)``: from the whole table ``weight``
    [vocab, hidden], rank r keeps rows [r·V/t, (r + 1)·V/t) as its own parameter
    ``self.weight`` (a copy, the table's dtype; the tied LM head uses it). ``vocab`` must
    divide by ``world``, else ValueError.

    ``forward(token_ids)``: any shape of ids in [0, vocab), the same on every rank -> their
    whole embeddings [..., hidden], equal to ``F.embedding(token_ids, weight)``, on every
    rank, whichever rank owns each token. Exactly one collective per call.
    Hint: Megatron-LM §3 (input embedding); the notebook's section 3.
    """

    def __init__(self, weight: torch.Tensor, rank: int, world: int):
        super().__init__()
        raise NotImplementedError("Exercise 14.8: An embedding table split over the ranks by vocabulary rows")

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Exercise 14.8: An embedding table split over the ranks by vocabulary rows")


class ParallelLMHead(nn.Module):
    """Exercise 14.8: The LM head over a vocabulary split by rows: every rank gets all logits.

    ``ParallelLMHead(weight)``: ``weight`` is this rank's rows [r·V/t, (r + 1)·V/t) of the
    output embedding, [V/t, hidden] (with tied embeddings, the embedding's own
    ``weight`` parameter: keep it, do not copy it). ``forward(x)``: x [..., hidden], the
    same on every rank -> the logits of the whole vocabulary [..., V], equal to
    ``x @ W_wholeᵀ``, on every rank. Exactly one collective per call.
    Hint: ``torch.distributed.all_gather`` fills a list in rank order.
    """

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        raise NotImplementedError("Exercise 14.8: The LM head over a vocabulary split by rows: every rank gets all logits")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Exercise 14.8: The LM head over a vocabulary split by rows: every rank gets all logits")


def parallel_block(block: Block, rank: int, world: int, shard_attention: bool = True) -> Block:
    """Exercise 14.9: One decoder layer as rank ``rank`` of ``world`` runs it, from your layers.

    Returns a new :class:`~minillm.model.Block` (``block`` itself, its modules and their
    attributes stay as they were; unchanged tensors may be shared) whose ``forward``, run
    on every rank with the same input, gives every rank the whole block's output. It
    holds this rank's part of every weight of the MLP (SwiGLU: gate, up, down) and, with
    ``shard_attention``, of attention, split by **KV-head groups**: rank r keeps KV heads
    [r·g, (r + 1)·g), g = kv_heads / t, and the query heads that read them; its
    ``attn.num_heads`` / ``attn.num_kv_heads`` are the rank's own. Without
    ``shard_attention``, attention stays whole on every rank. Exactly two all-reduces per
    call (one without ``shard_attention``) and no other collective. A head count that does
    not divide by ``world`` raises ValueError (``Block`` reads only the attributes above;
    the norms are whole on every rank).
    Hint: ``minillm.transform.copy_modules``; the notebook's section 2; Megatron-LM §3
    (Fig. 3).
    """
    raise NotImplementedError("Exercise 14.9: One decoder layer as rank ``rank`` of ``world`` runs it, from your layers")
