"""The paged pool of a multi-head latent attention model (DeepSeek-V3): latents, not K and V.

An MLA layer caches one latent c (``kv_lora_rank`` numbers) and one shared rotary key
(``qk_rope_head_dim`` numbers) per token (:mod:`minillm.mla`). The pool keeps exactly
those, in the layout of a key pool with one KV head whose "head" is the pair
[c ; k_rot]: per layer [blocks, block_size, 1, rank + rope], and no value pool. A token
costs (rank + rope) × dtype bytes × layers: 576 × 2 × 61 = 70 KB for DeepSeek-V3 in
bf16, where its 128 heads' K and V would take 4.9 MB.

Each pass writes the new tokens' latents at their slots, then every sequence's queries
attend over its gathered latents in the absorbed form
(:meth:`~minillm.mla.LatentAttention.attend_absorbed`): causal, aligned to the end of
its context. Block tables, prefix sharing, copy-on-write and preemption are the
:class:`~minillm.engine.paged_cache.PagedKVCache`'s, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..mla import LatentAttention
from .paged_cache import AttentionMetadata, PagedKVCache


class LatentPagedCache(PagedKVCache):
    """A :class:`PagedKVCache` whose key pools hold latents and that has no value pools."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.kv_cache_dtype, self.decode_attention, self.int4 = "float32", None, None
        self.num_blocks, self.block_size = num_blocks, block_size
        self.rank = config.mla["kv_lora_rank"]
        width = self.rank + config.mla["qk_rope_head_dim"]
        self.windows = [None] * config.num_layers
        self.keys = [torch.zeros(num_blocks, block_size, 1, width, dtype=dtype, device=device)
                     for _ in range(config.num_layers)]
        self.values, self.key_scales, self.value_scales = [], [], []

    def bind(self, metadata: AttentionMetadata) -> PagedLatentAttention:
        return PagedLatentAttention(self, metadata)


@dataclass
class PagedLatentAttention:
    """The cache argument of an MLA model's layers in one engine forward pass."""

    cache: LatentPagedCache
    metadata: AttentionMetadata

    def attend_latent(self, attn: LatentAttention, x, cos, sin, mask=None) -> torch.Tensor:
        """Layer ``attn.layer_index`` over the flat batch x [1, tokens, hidden]: store the new
        latents, attend each sequence over its own; -> [1, tokens, hidden]."""
        meta, pool = self.metadata, self.cache.keys[attn.layer_index]
        q_nope, q_rot = attn.queries(x, cos, sin)  # [1, heads, tokens, ...]
        c, k_rot = attn.latents(x, cos, sin)  # [1, tokens, rank], [1, tokens, rope]
        latents = torch.cat([c, k_rot], -1)[0]
        pool.view(-1, latents.shape[-1]).index_copy_(0, meta.slot_mapping, latents.to(pool.dtype))
        out = q_nope.new_empty(*q_nope.shape[:3], attn.shape.v_head_dim)
        for s, start, n, length in self.sequences():
            rows = slice(start, start + n)
            cached = pool[meta.block_tables[s]].flatten(0, 2)[None, :length].to(x.dtype)
            steps = torch.arange(length, device=x.device)
            causal = steps[None] <= torch.arange(length - n, length, device=x.device)[:, None]
            out[:, :, rows] = attn.attend_absorbed(
                q_nope[:, :, rows], q_rot[:, :, rows], cached[..., :self.cache.rank],
                cached[..., self.cache.rank:], causal[None, None])
        return attn.o_proj(out.transpose(1, 2).reshape(1, x.shape[1], -1))

    def sequences(self) -> list[tuple[int, int, int, int]]:
        """(sequence, first row, rows, keys) of every sequence: decodes, then chunks."""
        lengths = self.metadata.context_lens.tolist()
        decodes = [(s, s, 1, lengths[s]) for s in range(self.metadata.num_decodes)]
        return decodes + self.metadata.chunks


def make_pool(config: ModelConfig, num_blocks: int, block_size: int, dtype, device,
              decode_attention=None, kv_cache_dtype: str | None = None) -> PagedKVCache:
    """The model's paged pool: latents for multi-head latent attention, else K and V."""
    if config.mla is None:
        return PagedKVCache(config, num_blocks, block_size, dtype, device, decode_attention,
                            kv_cache_dtype)
    if decode_attention is not None or kv_cache_dtype not in (None, "float32"):
        raise ValueError(f"this {config.family} model's latent pool is float and read by the "
                         "built-in attention: leave decode_attention and kv_cache_dtype unset")
    return LatentPagedCache(config, num_blocks, block_size, dtype, device)
