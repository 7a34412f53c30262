"""One forward pass of the engine, laid out flat: what an executor computes (and what rank 0
of a tensor-parallel group broadcasts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..paged_cache import AttentionMetadata

SlotMapping = Callable[[list[int], int, int, int], list[int]]


@dataclass
class FlatBatch:
    """Everything one forward pass of the engine needs, sampling aside."""

    copies: list[tuple[int, int]]  # copy-on-write block copies to do first
    token_ids: torch.Tensor  # [tokens] the new tokens of every sequence, decodes first
    positions: torch.Tensor  # [tokens] each token's position in its sequence
    logits_at: torch.Tensor  # [rows] the tokens whose next-token logits are wanted
    metadata: AttentionMetadata


@dataclass
class SequenceWork:
    """One sequence's part of a forward pass: its new tokens, the position of the first, its
    block table, and how many of its last tokens want next-token logits (0: none)."""

    tokens: list[int]
    start: int
    block_table: list[int]
    logits_rows: int


def flat_batch(work: list[SequenceWork], copies: list[tuple[int, int]], block_size: int,
               slot_mapping: SlotMapping, device) -> FlatBatch:
    """``work`` as one flat batch; sequences with one new token (decodes) must come first."""
    tokens, positions, slots, rows = [], [], [], []
    for item in work:
        n = len(item.tokens)
        tokens += item.tokens
        positions += range(item.start, item.start + n)
        slots += slot_mapping(item.block_table, item.start, n, block_size)
        rows += range(len(tokens) - item.logits_rows, len(tokens))
    width = max(len(item.block_table) for item in work)
    metadata = AttentionMetadata(
        query_lens=[len(item.tokens) for item in work],
        num_decodes=sum(1 for item in work if len(item.tokens) == 1),
        context_lens=torch.tensor([item.start + len(item.tokens) for item in work],
                                  device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        block_tables=torch.tensor([[max(b, 0) for b in item.block_table]  # released: 0
                                   + [0] * (width - len(item.block_table))
                                   for item in work], dtype=torch.long, device=device))
    return FlatBatch(copies, torch.tensor(tokens, device=device),
                     torch.tensor(positions, device=device),
                     torch.tensor(rows, dtype=torch.long, device=device), metadata)
