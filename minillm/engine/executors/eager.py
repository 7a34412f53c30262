"""The eager executor: the model's own forward over the flat batch (any step)."""

from __future__ import annotations

import torch

from ...model import Transformer
from ..paged_cache import AttentionMetadata, PagedKVCache
from .batch import FlatBatch


class EagerExecutor:
    """``model.forward_flat`` with the pool bound to the step's metadata: prefill chunks,
    decodes and speculative verifications alike, through the model's attention backend.
    ``last_hidden``: the final hidden states of the rows it returned logits for."""

    name = "eager"

    def __init__(self, model: Transformer, cache: PagedKVCache):
        self.model, self.cache = model, cache
        self.last_hidden: torch.Tensor | None = None  # the last call's rows, before the norm

    def supports(self, metadata: AttentionMetadata) -> bool:
        return True

    def __call__(self, batch: FlatBatch) -> torch.Tensor:
        x = self.model.final_hidden_flat(batch.token_ids, batch.positions,
                                         self.cache.bind(batch.metadata))
        self.last_hidden = x[batch.logits_at]
        return self.model.head(self.last_hidden)
