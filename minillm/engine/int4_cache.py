"""The int4 (KIVI) paged pool: its tensors, its staging buffer, and attention over it.

The rounding (keys per channel over a block, values per token) and the rule for which keys
a query reads rounded are :mod:`minillm.attention.kv_int4`'s. Per layer:

    keys[layer], values[layer]: [num_blocks, block_size, kv_heads, head_dim / 2] uint8
    key_scales[layer], key_minimums[layer]: [num_blocks, kv_heads, head_dim]
    value_scales[layer], value_minimums[layer]: [num_blocks, block_size, kv_heads]
    staging[layer]: {block: float32 keys [block_size, kv_heads, head_dim]}

Only the eager executor reads this pool, through :meth:`Int4Pool.attend` (its own
attention: which keys each query reads rounded depends on the query's position, which no
attention backend's single key tensor can express).
"""

from __future__ import annotations

import math

import torch

from ..attention.kv_int4 import dequantize_int4, pack, quantize_int4, unpack
from ..config import ModelConfig


class Int4Pool:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int,
                 device: torch.device | str = "cpu"):
        if config.head_dim % 2:
            raise ValueError(f"an int4 KV cache packs two channels a byte: head_dim "
                             f"{config.head_dim} is odd; use kv_cache_dtype='int8'")
        self.block_size, layers = block_size, range(config.num_layers)
        codes = (num_blocks, block_size, config.num_kv_heads, config.head_dim // 2)
        per_channel = (num_blocks, config.num_kv_heads, config.head_dim)
        per_token = codes[:3]

        def zeros(shape, dtype=torch.float32):
            return [torch.zeros(shape, dtype=dtype, device=device) for _ in layers]

        self.keys, self.values = zeros(codes, torch.uint8), zeros(codes, torch.uint8)
        self.key_scales, self.key_minimums = zeros(per_channel), zeros(per_channel)
        self.value_scales, self.value_minimums = zeros(per_token), zeros(per_token)
        self.staging: list[dict[int, torch.Tensor]] = [{} for _ in layers]

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the pool (indexed by block first); staging apart."""
        return [*self.keys, *self.values, *self.key_scales, *self.key_minimums,
                *self.value_scales, *self.value_minimums]

    def copy_staging(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of the staged float32 keys (the pool's tensors are copied with the
        other dtypes')."""
        for staging in self.staging:
            for source, destination in copies:
                if source in staging:
                    staging[destination] = staging[source].clone()

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """New keys (to staging) and values (rounded per token) [tokens, kv_heads, head_dim]
        at their slots."""
        codes, scales, minimums = quantize_int4(v, dim=-1)
        self.values[layer].view(-1, *codes.shape[1:-1], codes.shape[-1] // 2).index_copy_(
            0, slots, pack(codes))
        self.value_scales[layer].view(-1, v.shape[1]).index_copy_(0, slots, scales)
        self.value_minimums[layer].view(-1, v.shape[1]).index_copy_(0, slots, minimums)
        staging = self.staging[layer]
        for block, offset, key in zip((slots // self.block_size).tolist(),
                                      (slots % self.block_size).tolist(), k, strict=True):
            if block not in staging:
                staging[block] = k.new_zeros(self.block_size, *k.shape[1:], dtype=torch.float32)
            staging[block][offset] = key

    def _round_full_blocks(self, layer: int, block_tables: torch.Tensor,
                           last_positions: list[int], accepted: list[int]) -> None:
        """Round the staged blocks some query will read rounded (full before its position),
        and drop from staging those the accepted tokens have filled."""
        staging = self.staging[layer]
        for table, last, done in zip(block_tables.tolist(), last_positions, accepted,
                                     strict=True):
            for i in range(last // self.block_size):
                if (block := table[i]) in staging:
                    codes, scales, minimums = quantize_int4(staging[block], dim=0)
                    self.keys[layer][block] = pack(codes)
                    self.key_scales[layer][block] = scales
                    self.key_minimums[layer][block] = minimums
                    if (i + 1) * self.block_size <= done:
                        del staging[block]

    def _gather(self, layer: int, block_tables: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rounded keys, keys with staged blocks in float32, values), each [seqs, kv_heads,
        width * block_size, head_dim] float32."""
        keys = dequantize_int4(unpack(self.keys[layer][block_tables]),
                               self.key_scales[layer][block_tables],
                               self.key_minimums[layer][block_tables], dim=2)
        staged = keys.clone()
        for s, table in enumerate(block_tables.tolist()):
            for i, block in enumerate(table):
                if block in self.staging[layer]:
                    staged[s, i] = self.staging[layer][block]
        values = dequantize_int4(unpack(self.values[layer][block_tables]),
                                 self.value_scales[layer][block_tables],
                                 self.value_minimums[layer][block_tables], dim=-1)
        return tuple(t.flatten(1, 2).transpose(1, 2) for t in (keys, staged, values))

    def attend(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
               query_positions: torch.Tensor, accepted: list[int]) -> torch.Tensor:
        """q [seqs, heads, n, head_dim] at ``query_positions`` [seqs, n], each over its
        sequence's keys up to its own position (``accepted``: each sequence's tokens
        computed before this step) -> [seqs, heads, n, head_dim]."""
        self._round_full_blocks(layer, block_tables, query_positions.amax(1).tolist(),
                                accepted)
        keys, staged, values = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1)
                                for t in self._gather(layer, block_tables))
        root = math.sqrt(q.shape[-1])
        rounded_scores, staged_scores = (q.float() @ k.transpose(-1, -2) / root
                                         for k in (keys, staged))
        key_positions = torch.arange(keys.shape[2], device=q.device)
        rounded = (key_positions // self.block_size)[None, None, None] < \
            (query_positions // self.block_size)[:, None, :, None]
        scores = torch.where(rounded, rounded_scores, staged_scores)
        future = key_positions[None, None, None] > query_positions[:, None, :, None]
        weights = scores.masked_fill(future, -torch.inf).softmax(-1)
        return (weights @ values).to(q.dtype)
