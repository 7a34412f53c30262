"""Draft models for speculative decoding, cut out of the target itself.

No smaller SmolLM2 exists, so a draft is made from SmolLM2-135M: keep a few of its layers
(a *layer-dropped student*), and optionally a head over only the most frequent tokens.
What a draft step costs, relative to a target step, is about the ratio of bytes read:

* the blocks: ``kept layers / all layers`` of the blocks' bytes;
* the tied embedding / lm_head, about a fifth of SmolLM2's bytes per step: a head over the
  8k most frequent tokens reads a sixth of it.

A reduced head keeps rejection sampling exact: tokens outside its vocabulary get q = 0, so
the draft never proposes them, and the target still emits them through the residual
max(0, p − q). An untrained layer-dropped student agrees with the target's greedy token
only a few percent of the time; distillation (:mod:`minillm.distill`) is what makes it a
useful draft.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from .model import Transformer
from .quant.qlinear import weight_bytes_per_token


def layer_dropped(model: Transformer, keep: Sequence[int]) -> Transformer:
    """A copy of ``model`` with only the blocks ``keep`` (in that order), weights shared
    nowhere (the student is trained on its own)."""
    if not keep or any(not 0 <= i < len(model.layers) for i in keep):
        raise ValueError(f"keep must name layers in 0..{len(model.layers) - 1}, got {keep}")
    student = copy.deepcopy(model)
    student.layers = nn.ModuleList(student.layers[i] for i in keep)
    for index, block in enumerate(student.layers):
        block.attn.layer_index = index
    student.config = copy.deepcopy(model.config)
    student.config.num_layers = len(keep)
    return student


class ReducedHead(nn.Module):
    """An lm_head over ``vocab`` token ids only; every other token's logit is -inf (q = 0)."""

    def __init__(self, weight: torch.Tensor, vocab: torch.Tensor, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.register_buffer("vocab", vocab)
        self.weight = nn.Parameter(weight[vocab].detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = x.new_full((*x.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy(-1, self.vocab, x @ self.weight.T)


def frequent_tokens(tokens: torch.Tensor, count: int, always: Sequence[int] = ()) -> torch.Tensor:
    """The ``count`` most frequent ids in ``tokens`` (plus ``always``, e.g. stop tokens),
    sorted."""
    frequency = torch.bincount(tokens.flatten())
    ranked = frequency.argsort(descending=True, stable=True)[:count]
    return torch.unique(torch.cat([ranked, torch.tensor(list(always), dtype=torch.long)]))


def reduce_head(model: Transformer, vocab: torch.Tensor) -> Transformer:
    """Give ``model`` a :class:`ReducedHead` over ``vocab`` (in place; the embedding stays)."""
    model.lm_head = ReducedHead(model.lm_head.weight, vocab, model.config.vocab_size)
    return model


def draft_cost(draft: Transformer, target: Transformer) -> float:
    """Bytes a draft step reads / bytes a target step reads (the embedding table is read
    one row per step unless it is the head)."""
    return weight_bytes_per_token(draft) / weight_bytes_per_token(target)
