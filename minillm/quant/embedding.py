"""A compact token embedding, shared with a tied lm_head: fp16, or int8 with row scales.

SmolLM2-135M's embedding matrix (49152 x 576 = 28.3M numbers) is a fifth of its
parameters, and with tied embeddings the same matrix is the lm_head that every decode step
reads in full. Quantizing only the linear layers of the blocks therefore leaves a large
part of the model untouched. :func:`compact_embedding` stores it

* ``"fp16"``: half the bytes of fp32, no visible error;
* ``"int8"``: one byte per number plus one fp16 absmax scale per token row, the
  per-output-channel scheme of chapter 06 (each row of the lm_head is an output channel).

Looking a token up dequantizes only its row; the tied lm_head dequantizes the whole matrix
for its matmul (the simple CPU path, as in :class:`~minillm.quant.qlinear.QuantLinear`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .basic import QuantScheme, quantize

EMBEDDING_FORMATS = ("fp16", "int8")


class CompactEmbedding(nn.Module):
    """``nn.Embedding`` with its table stored in fp16, or in int8 with fp16 row scales."""

    def __init__(self, weight: torch.Tensor, fmt: str = "int8"):
        super().__init__()
        if fmt not in EMBEDDING_FORMATS:
            raise ValueError(f"unknown embedding format {fmt!r}; choose one of "
                             f"{', '.join(EMBEDDING_FORMATS)}")
        self.fmt = fmt
        weight = weight.detach()
        if fmt == "fp16":
            self.register_buffer("table", weight.half())
            self.register_buffer("scales", None)
        else:
            q = quantize(weight, QuantScheme(bits=8, symmetric=True, group_size=None))
            self.register_buffer("table", q.codes)  # int8 [vocab, hidden]
            self.register_buffer("scales", q.scales.half())  # [vocab, 1]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The fp32 embedding rows of token ``ids`` (any shape) -> [..., hidden]."""
        rows = self.table[ids].float()
        return rows if self.scales is None else rows * self.scales[ids].float()

    def dense_weight(self) -> torch.Tensor:
        """The whole table in fp32, [vocab, hidden]."""
        return self.rows(torch.arange(self.table.shape[0], device=self.table.device))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.rows(ids)


class TiedLMHead(nn.Module):
    """The output projection that reuses a :class:`CompactEmbedding`'s table (tied weights)."""

    def __init__(self, embedding: CompactEmbedding):
        super().__init__()
        self.embedding = embedding
        self.out_features, self.in_features = embedding.table.shape

    def dense_weight(self) -> torch.Tensor:
        return self.embedding.dense_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dense_weight().to(x.dtype))


def compact_embedding(model: nn.Module, fmt: str = "int8") -> nn.Module:
    """Store ``model``'s token embedding as ``fmt`` ("fp16" or "int8"), in place.

    With tied embeddings the lm_head becomes a :class:`TiedLMHead` over the same storage;
    an untied lm_head is left alone (quantize it like any linear layer).
    """
    tied = model.lm_head.weight is model.embed_tokens.weight
    model.embed_tokens = CompactEmbedding(model.embed_tokens.weight, fmt)
    if tied:
        model.lm_head = TiedLMHead(model.embed_tokens)
    return model
