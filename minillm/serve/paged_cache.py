"""The paged KV cache: one pool of blocks per layer, shared by every running sequence.

    keys, values: [layers, num_blocks, block_size, kv_heads, head_dim]

A forward pass of the engine runs a flat list of tokens from many sequences. Before it,
the runner describes that list (:class:`AttentionMetadata`): how many tokens each sequence
contributes, how long each sequence is once they are in, the pool slot of every new token,
and each sequence's block table. In every layer, :meth:`PagedKVCache.attend` then

1. writes the new keys and values at their slots;
2. computes each sequence's attention over its own cached tokens: the decodes (one query
   each) together in one call, through the block tables, even when prefill chunks share the
   step; each prefill chunk on its own, with a causal mask aligned
   to the end of its keys (``causal_lower_right``: the chunk's queries are the sequence's
   last tokens), a structured mask that is never materialised.

On a GPU the decodes go to the Triton paged-decode kernel (``minillm.kernels``); on a CPU
to the PyTorch reference (:mod:`minillm.attention.paged`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ..attention.paged import gather_kv, paged_attention, write_kv
from ..config import ModelConfig


@dataclass
class AttentionMetadata:
    """How the flat tokens of one forward pass belong to sequences (in order)."""

    query_lens: list[int]  # new tokens of each sequence
    context_lens: torch.Tensor  # [seqs] tokens each sequence attends to, the new ones included
    slot_mapping: torch.Tensor  # [tokens] pool slot of each new token
    block_tables: torch.Tensor  # [seqs, max_blocks], padded with block 0

    @cached_property
    def sequence_rows(self) -> list[tuple[int, int, int]]:
        """(sequence, its first row in the flat token list, its rows) for every sequence."""
        starts = itertools.accumulate(self.query_lens, initial=0)  # one more than sequences
        return [(s, start, n) for s, (start, n)
                in enumerate(zip(starts, self.query_lens, strict=False))]

    @cached_property
    def single_queries(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequences with one new token (decodes) and that token's row in the flat list:
        they share one batched attention call, whatever else is in the step."""
        singles = [(s, start) for s, start, n in self.sequence_rows if n == 1]
        device = self.context_lens.device
        return (torch.tensor([s for s, _ in singles], dtype=torch.long, device=device),
                torch.tensor([row for _, row in singles], dtype=torch.long, device=device))

    @cached_property
    def chunks(self) -> list[tuple[int, int, int]]:
        """(sequence, first row, rows) of every sequence with more than one new token."""
        return [(s, start, n) for s, start, n in self.sequence_rows if n > 1]


class PagedKVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads,
                 config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.metadata: AttentionMetadata | None = None

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def bytes_per_block(self) -> int:
        return self.nbytes() // self.keys.shape[1]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: give each destination block the source block's keys and values."""
        if copies:
            source, destination = (torch.tensor(ids, device=self.keys.device)
                                   for ids in zip(*copies, strict=True))
            self.keys[:, destination] = self.keys[:, source]
            self.values[:, destination] = self.values[:, source]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask=None, backend=None) -> torch.Tensor:
        """q [1, heads, tokens, head_dim], k/v [1, kv_heads, tokens, head_dim] of the flat
        batch described by :attr:`metadata`; returns the attention output like q."""
        meta = self.metadata
        key_pool, value_pool = self.keys[layer], self.values[layer]
        write_kv(key_pool, value_pool, k[0].transpose(0, 1), v[0].transpose(0, 1),
                 meta.slot_mapping)
        q = q[0].transpose(0, 1)  # [tokens, heads, head_dim]
        if not meta.chunks:  # decode only: one query per sequence, in order
            return self._decode(q, key_pool, value_pool, meta.block_tables,
                                meta.context_lens).transpose(0, 1)[None]
        out = torch.empty_like(q)
        seqs, rows = meta.single_queries
        if len(rows):
            out[rows] = self._decode(q[rows], key_pool, value_pool, meta.block_tables[seqs],
                                     meta.context_lens[seqs])
        for s, start, n in meta.chunks:
            chunk = q[start:start + n].transpose(0, 1)[None]
            out[start:start + n] = self._prefill(chunk, key_pool, value_pool, meta, s)[0] \
                .transpose(0, 1)
        return out.transpose(0, 1)[None]

    @staticmethod
    def _decode(q: torch.Tensor, key_pool, value_pool, block_tables, context_lens):
        """One query per sequence: q [seqs, heads, head_dim] -> [seqs, heads, head_dim]."""
        if q.is_cuda:
            from ..kernels.paged_attention import paged_decode_attention

            return paged_decode_attention(q, key_pool, value_pool, block_tables, context_lens)
        return paged_attention(q[:, :, None], key_pool, value_pool, block_tables,
                               context_lens)[:, :, 0]

    @staticmethod
    def _prefill(q: torch.Tensor, key_pool, value_pool, meta: AttentionMetadata, s: int):
        """One sequence's chunk of queries [1, heads, n, head_dim] over its cached keys."""
        length = int(meta.context_lens[s])
        table = meta.block_tables[s:s + 1]
        keys = gather_kv(key_pool, table)[:, :, :length]
        values = gather_kv(value_pool, table)[:, :, :length]
        n = q.shape[2]
        causal = causal_lower_right(n, length) if n < length else None
        return F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype),
                                              attn_mask=causal, is_causal=causal is None,
                                              enable_gqa=keys.shape[1] != q.shape[1])
