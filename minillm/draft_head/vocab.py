"""The K tokens a draft head may propose: the ones the target emits most (FR-Spec,
Zhao et al. 2025).

A 49,152-row output layer is most of a one-block head's work; the tokens a chat model
actually writes are far fewer. Ranking token ids by how often the target emitted them
(its answers), ties and unseen tokens by their frequency in corpus text, and keeping the
top K covers nearly all of what the target says with a quarter or less of the rows.
:func:`coverage` measures it on held-out answers.
"""

from __future__ import annotations

import torch


def token_counts(sequences: list[list[int]] | list[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """How often each token id occurs in ``sequences`` [vocab_size]."""
    flat = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]
    if not flat:
        return torch.zeros(vocab_size, dtype=torch.long)
    return torch.bincount(torch.cat(flat), minlength=vocab_size)


def frequent_tokens(counts: torch.Tensor, k: int, fallback: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """The ``k`` most frequent token ids by ``counts``; ties (and tokens never counted)
    ranked by ``fallback`` counts (e.g. corpus text), then by id. -> [k], sorted by id."""
    if not 0 < k <= len(counts):
        raise ValueError(f"K must be in 1..{len(counts)}, got {k}")
    fallback = torch.zeros_like(counts) if fallback is None else fallback
    score = counts.double() * (fallback.max().double() + 1) + fallback.double()
    return torch.sort(torch.argsort(score, descending=True, stable=True)[:k]).values


def coverage(vocab: torch.Tensor, tokens: torch.Tensor) -> float:
    """The share of ``tokens`` that are in ``vocab``."""
    inside = torch.zeros(int(max(vocab.max(), tokens.max())) + 1, dtype=torch.bool)
    inside[vocab] = True
    return float(inside[tokens.reshape(-1)].float().mean())
