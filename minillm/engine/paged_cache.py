"""The paged KV cache: one pool of blocks per layer, shared by every running sequence.

    keys[layer], values[layer]: [num_blocks, block_size, kv_heads, head_dim]

and, with ``kv_cache_dtype="int8"`` (:mod:`minillm.attention.kv_quant`), those hold int8
codes and ``key_scales[layer]``, ``value_scales[layer]``: [num_blocks, block_size,
kv_heads] their float32 scales, one per (token, KV head); the new tokens are rounded as
they are written and the blocks dequantized as they are gathered. ``kv_cache_dtype="int4"``
is KIVI's rounding (keys per channel over a block, values per token), in an
:class:`~.int4_cache.Int4Pool` with attention of its own (eager steps only).

Each layer's pool is a tensor of its own: a compiled step that writes into one layer of a
stacked [layers, ...] tensor would copy the whole stack at every layer.

A forward pass of the engine runs a flat list of tokens from many sequences. Before it,
the runner describes that list (:class:`AttentionMetadata`): how many tokens each sequence
contributes (the decodes, one token each, first), how long each sequence is once they are
in, the pool slot of every new token, and each sequence's block table. The model gets the
pool and the description together, as a :class:`PagedAttention`, and in every layer its
:meth:`~PagedAttention.attend`

1. writes the new keys and values at their slots;
2. computes each sequence's attention over its own cached tokens with the model's
   attention backend (so ``set_attention_backend`` and the learner's attention work in the
   engine): the decodes together, in one call over their gathered blocks, each prefill
   chunk on its own, with a causal mask aligned to the end of its keys (the chunk's
   queries are the sequence's last tokens). A layer with a sliding window (Mistral, Gemma
   3's local layers: :meth:`~minillm.config.ModelConfig.attention_kinds`) masks the keys
   more than its window behind each query too. With ``decode_attention`` (the lab of chapter
   12) one call of that function does this for every sequence, through the block tables.

This is the readable path, the eager executor's. The fast decode executors read the same
pool through the block tables without gathering (``minillm::paged_decode_attention`` and
the native step, :mod:`minillm.engine.executors`); on a GPU the decodes go to the Triton
paged-decode kernel (``minillm.kernels``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from ..attention.kv_quant import gather_int8, kv_cache_dtype_of, write_int8
from ..attention.paged import gather_kv, write_kv
from ..config import ModelConfig
from .int4_cache import Int4Pool

# (q [tokens, heads, head_dim], key_pool, value_pool, block_tables, query_lens, context_lens)
# -> [tokens, heads, head_dim]: every sequence's last query_lens[s] tokens, causal, over its
# first context_lens[s] cached tokens, read through its block table (chapter 12's lab).
DecodeAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]],
                            list[int], list[int]], torch.Tensor]


@dataclass
class AttentionMetadata:
    """How the flat tokens of one forward pass belong to sequences (in order; the first
    ``num_decodes`` sequences have one new token each)."""

    query_lens: list[int]  # new tokens of each sequence
    num_decodes: int  # the leading sequences with one new token (decodes)
    context_lens: torch.Tensor  # [seqs] int64, tokens each sequence attends to, new included
    slot_mapping: torch.Tensor  # [tokens] int64, pool slot of each new token (-1: write none)
    block_tables: torch.Tensor  # [seqs, width] int64, padded with block 0

    @property
    def decode_only(self) -> bool:
        return self.num_decodes == len(self.query_lens)

    @cached_property
    def chunks(self) -> list[tuple[int, int, int, int]]:
        """(sequence, first row in the flat token list, rows, keys) of every sequence after
        the decodes: prefill chunks and speculative verifications."""
        starts = list(itertools.accumulate(self.query_lens, initial=0))
        lengths = self.context_lens.tolist()
        return [(s, starts[s], self.query_lens[s], lengths[s])
                for s in range(self.num_decodes, len(self.query_lens))]


class PagedKVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 decode_attention: DecodeAttention | None = None,
                 kv_cache_dtype: str | None = None):
        """``decode_attention``: a function that computes every sequence's attention (the
        decodes, speculative verifications and prefill chunks of a step, in one call) by
        reading the pool through the block tables (the learner's, chapter 12), instead of
        gathering the blocks for the attention backend; it reads float pools only.
        ``kv_cache_dtype``: float32 (None: the model's ``dtype``), int8 or int4."""
        self.kv_cache_dtype = kv_cache_dtype_of(kv_cache_dtype)
        if self.quantized and decode_attention is not None:
            raise ValueError("decode_attention= reads a float pool: leave kv_cache_dtype at "
                             "None (float32) to run it")
        self.windows = [kind.window for kind in config.attention_kinds()]  # per layer
        if any(self.windows) and (decode_attention is not None or self.kv_cache_dtype == "int4"):
            raise ValueError(f"this {config.family} model has sliding-window layers, which "
                             f"{'decode_attention=' if decode_attention else 'the int4 KV cache'}"
                             " does not mask: use a float32 or int8 KV cache and the built-in "
                             "attention")
        self.decode_attention = decode_attention
        self.num_blocks, self.block_size = num_blocks, block_size
        self.int4 = Int4Pool(config, num_blocks, block_size, device) \
            if self.kv_cache_dtype == "int4" else None
        if self.int4 is not None:
            self.keys, self.values, self.key_scales, self.value_scales = [], [], [], []
            return
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        stored = torch.int8 if self.quantized else dtype
        self.keys, self.values = ([torch.zeros(shape, dtype=stored, device=device)
                                   for _ in range(config.num_layers)] for _ in range(2))
        scales = shape[:3] if self.quantized else None
        self.key_scales, self.value_scales = ([torch.zeros(scales, device=device)
                                               for _ in range(config.num_layers)]
                                              if scales else [] for _ in range(2))

    @property
    def quantized(self) -> bool:
        return self.kv_cache_dtype != "float32"

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the pool (indexed by block first)."""
        if self.int4 is not None:
            return self.int4.tensors()
        return [*self.keys, *self.values, *self.key_scales, *self.value_scales]

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors())

    def bytes_per_block(self) -> int:
        return self.nbytes() // self.num_blocks

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: give each destination block the source block's keys and values
        (and their scales)."""
        if copies:
            source, destination = (torch.tensor(ids, device=self.tensors()[0].device)
                                   for ids in zip(*copies, strict=True))
            for pool in self.tensors():
                pool[destination] = pool[source]
            if self.int4 is not None:
                self.int4.copy_staging(copies)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Store new keys and values [tokens, kv_heads, head_dim] at their slots."""
        if self.int4 is not None:
            self.int4.write(layer, k, v, slots)
        elif self.quantized:
            write_int8(self.keys[layer], self.key_scales[layer], k, slots)
            write_int8(self.values[layer], self.value_scales[layer], v, slots)
        else:
            write_kv(self.keys[layer], self.values[layer], k, v, slots)

    def gather(self, layer: int, block_tables: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of each sequence's blocks, in order, as floats: [seqs, kv_heads,
        max_blocks * block_size, head_dim] each."""
        if self.quantized:
            return (gather_int8(self.keys[layer], self.key_scales[layer], block_tables),
                    gather_int8(self.values[layer], self.value_scales[layer], block_tables))
        return (gather_kv(self.keys[layer], block_tables),
                gather_kv(self.values[layer], block_tables))

    def bind(self, metadata: AttentionMetadata) -> PagedAttention:
        """The pool as one forward pass sees it: with that pass's metadata."""
        return PagedAttention(self, metadata)


@dataclass
class PagedAttention:
    """The cache argument of the model's layers in one engine forward pass."""

    cache: PagedKVCache
    metadata: AttentionMetadata

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask=None, backend=None) -> torch.Tensor:
        """q [1, heads, tokens, head_dim], k/v [1, kv_heads, tokens, head_dim] of the flat
        batch; returns the attention output like q, computed by ``backend``."""
        meta, cache = self.metadata, self.cache
        cache.write(layer, k[0].transpose(0, 1), v[0].transpose(0, 1), meta.slot_mapping)
        q = q[0].transpose(0, 1)  # [tokens, heads, head_dim]
        out = torch.empty_like(q)
        if cache.decode_attention is not None:  # the learner's, for every sequence
            out = cache.decode_attention(q, cache.keys[layer], cache.values[layer],
                                         meta.block_tables.tolist(), list(meta.query_lens),
                                         meta.context_lens.tolist())
            return out.transpose(0, 1)[None]
        if cache.int4 is not None:
            return _attend_int4(q, cache.int4, layer, meta).transpose(0, 1)[None]
        decodes, window = meta.num_decodes, cache.windows[layer]
        if decodes:
            out[:decodes] = _attend_decodes(q[:decodes], cache, layer,
                                            meta.block_tables[:decodes],
                                            meta.context_lens[:decodes], backend, window)
        for s, start, n, length in meta.chunks:
            chunk = q[start:start + n].transpose(0, 1)[None]
            out[start:start + n] = _attend_chunk(chunk, cache, layer,
                                                 meta.block_tables[s:s + 1], length,
                                                 backend, window)[0].transpose(0, 1)
        return out.transpose(0, 1)[None]


def _attend_decodes(q: torch.Tensor, cache: PagedKVCache, layer: int, block_tables,
                    context_lens, backend, window: int | None = None) -> torch.Tensor:
    """One query per sequence, q [seqs, heads, head_dim], over its gathered blocks, keys
    past its length (and, with a ``window``, ``window`` or more behind it) masked;
    -> [seqs, heads, head_dim]."""
    if q.is_cuda and not cache.quantized and window is None:
        from ..kernels.paged_attention import paged_decode_attention  # Triton: on a GPU only

        return paged_decode_attention(q, cache.keys[layer], cache.values[layer], block_tables,
                                      context_lens)
    keys, values = cache.gather(layer, block_tables)
    steps = torch.arange(keys.shape[2], device=q.device)
    visible = steps < context_lens[:, None]
    if window is not None:
        visible &= steps > context_lens[:, None] - 1 - window
    return backend(q[:, :, None], keys.to(q.dtype), values.to(q.dtype),
                   visible[:, None, None])[:, :, 0]


def _attend_chunk(q: torch.Tensor, cache: PagedKVCache, layer: int, block_table,
                  length: int, backend, window: int | None = None) -> torch.Tensor:
    """A sequence's last n tokens' queries [1, heads, n, head_dim] over its first
    ``length`` cached tokens: causal, aligned to the end of the keys, and with a
    ``window``, each query sees its last ``window`` tokens only."""
    keys, values = (t[:, :, :length] for t in cache.gather(layer, block_table))
    n = q.shape[2]
    query_steps = torch.arange(length - n, length, device=q.device)[:, None]
    key_steps = torch.arange(length, device=q.device)[None]
    causal = key_steps <= query_steps
    if window is not None:
        causal &= key_steps > query_steps - window
    return backend(q, keys.to(q.dtype), values.to(q.dtype), causal[None, None])


def _attend_int4(q: torch.Tensor, pool: Int4Pool, layer: int,
                 meta: AttentionMetadata) -> torch.Tensor:
    """Every sequence's queries q [tokens, heads, head_dim] through the int4 pool's own
    attention: the decodes together, each chunk on its own."""
    out, decodes = torch.empty_like(q), meta.num_decodes
    lengths = meta.context_lens
    if decodes:
        last = lengths[:decodes, None] - 1
        out[:decodes] = pool.attend(layer, q[:decodes, :, None], meta.block_tables[:decodes],
                                    last, last[:, 0].tolist())[:, :, 0]
    for s, start, n, length in meta.chunks:
        positions = torch.arange(length - n, length, device=q.device)[None]
        chunk = q[start:start + n].transpose(0, 1)[None]
        out[start:start + n] = pool.attend(layer, chunk, meta.block_tables[s:s + 1], positions,
                                           [length - n])[0].transpose(0, 1)
    return out
