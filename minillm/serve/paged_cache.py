"""The paged KV cache: one pool of blocks per layer, shared by every running sequence.

    keys, values: [layers, num_blocks, block_size, kv_heads, head_dim]

A forward pass of the engine runs a flat list of tokens from many sequences. Before it,
the runner describes that list (:class:`AttentionMetadata`): how many tokens each sequence
contributes, how long each sequence is once they are in, the pool slot of every new token,
and each sequence's block table. In every layer, :meth:`PagedKVCache.attend` then

1. writes the new keys and values at their slots;
2. computes each sequence's attention over its own cached tokens: the decodes (one query
   each) together, through the block tables; each prefill chunk with a causal mask aligned
   to the end of its keys (``causal_lower_right``: the chunk's queries are the sequence's
   last tokens), a structured mask that is never materialised.

On a GPU the decodes go to the Triton paged-decode kernel (``minillm.kernels``); on a CPU
to the PyTorch reference (:mod:`minillm.attention.paged`).
"""

from __future__ import annotations

from dataclasses import dataclass

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
        if all(n == 1 for n in meta.query_lens):  # decode only: one query per sequence
            out = self._decode(q[0].transpose(0, 1), key_pool, value_pool, meta)
            return out.transpose(0, 1)[None]
        outputs, start = [], 0
        for s, n in enumerate(meta.query_lens):
            q_s = q[:, :, start:start + n]
            outputs.append(self._prefill(q_s, key_pool, value_pool, meta, s))
            start += n
        return torch.cat(outputs, dim=2)

    @staticmethod
    def _decode(q: torch.Tensor, key_pool, value_pool, meta: AttentionMetadata):
        """q [seqs, heads, head_dim] -> [seqs, heads, head_dim]."""
        if q.is_cuda:
            from ..kernels.paged_attention import paged_decode_attention

            return paged_decode_attention(q, key_pool, value_pool, meta.block_tables,
                                          meta.context_lens)
        return paged_attention(q[:, :, None], key_pool, value_pool, meta.block_tables,
                               meta.context_lens)[:, :, 0]

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
