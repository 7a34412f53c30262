"""Tensor parallelism as a transformation of the plain model (Megatron-LM, Shoeybi et al. 2019).

Each of ``t`` processes keeps a slice of every weight and computes with it; an all-reduce
puts the pieces back together where the math needs the whole. For a linear y = x Wᵀ:

* **column-parallel** (W split by output rows): rank r computes y[..., its columns] from
  the whole x — no communication; used for q/k/v and for gate/up;
* **row-parallel** (W split by input columns): rank r computes a partial sum from its
  slice of x; the all-reduce (sum) gives y — used for o_proj and down_proj, right after
  the column-parallel layer whose output slice is exactly its input slice.

So attention and the MLP each cost one all-reduce per layer (Megatron §3): two per block.
Attention splits by **KV-head groups**: rank r keeps KV heads [r·g, (r+1)·g) and the query
heads that read them, so each rank's attention is ordinary GQA on its own heads. SmolLM2
(9 query, 3 KV heads) therefore splits 3 ways, not 2.

The vocabulary splits too: rank r keeps the embedding rows of tokens [r·V/t, (r+1)·V/t);
a lookup zeroes the tokens it does not own and an all-reduce completes it. The tied LM
head is the same shard (logits for its own tokens), and an all-gather joins the logits.
A row-parallel bias is added by rank 0 only, so the sum counts it once.

:func:`tensor_parallel` transforms a loaded model in place on every rank (each rank loads
the checkpoint, then keeps its slice); every all-reduce and all-gather goes through
:func:`all_reduce` / :func:`all_gather_last`, which count them (:data:`COLLECTIVES`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn

from ..model import Transformer

COLLECTIVES: Counter = Counter()  # "all_reduce" / "all_gather" calls on this rank


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over every rank (in place), counted."""
    COLLECTIVES["all_reduce"] += 1
    dist.all_reduce(x)
    return x


def all_gather_last(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x`` along the last dimension, in rank order, counted."""
    COLLECTIVES["all_gather"] += 1
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def check_split(num_heads: int, num_kv_heads: int, intermediate: int, vocab: int,
                world: int) -> None:
    """Refuse, with the reason, a model that does not split evenly ``world`` ways."""
    for what, size in (("KV heads", num_kv_heads), ("query heads", num_heads),
                       ("MLP columns", intermediate), ("vocabulary rows", vocab)):
        if size % world:
            raise ValueError(f"tensor parallelism over {world} ranks needs the {what} "
                             f"({size}) to divide evenly; choose a world size that divides "
                             f"{size}")


def _rows(weight: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Output rows (dim 0) of ``weight`` owned by ``rank``."""
    return weight.chunk(world, dim=0)[rank].clone()


class ColumnParallelLinear(nn.Linear):
    """A slice of a linear's output features: y[..., shard] = x W[shard]ᵀ (+ b[shard])."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world: int) -> ColumnParallelLinear:
        layer = cls(linear.in_features, linear.out_features // world,
                    bias=linear.bias is not None)
        with torch.no_grad():
            layer.weight.copy_(_rows(linear.weight, rank, world))
            if linear.bias is not None:
                layer.bias.copy_(_rows(linear.bias, rank, world))
        return layer.to(linear.weight.dtype)


class RowParallelLinear(nn.Linear):
    """A slice of a linear's input features; the partial products are summed over ranks."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, world: int) -> RowParallelLinear:
        layer = cls(linear.in_features // world, linear.out_features,
                    bias=linear.bias is not None)
        with torch.no_grad():
            layer.weight.copy_(_rows(linear.weight.T, rank, world).T)
            if linear.bias is not None:  # added once: by rank 0
                layer.bias.copy_(linear.bias if rank == 0 else torch.zeros_like(linear.bias))
        return layer.to(linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(super().forward(x))


class VocabParallelEmbedding(nn.Module):
    """Embedding rows of the tokens [start, start + rows); other tokens look up zeros, and
    the all-reduce fills them in from their owners."""

    def __init__(self, embedding: nn.Embedding, rank: int, world: int):
        super().__init__()
        self.rows = embedding.num_embeddings // world
        self.start = rank * self.rows
        self.weight = nn.Parameter(_rows(embedding.weight.detach(), rank, world))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        local = token_ids - self.start
        owned = (local >= 0) & (local < self.rows)
        x = nn.functional.embedding(local.clamp(0, self.rows - 1), self.weight)
        return all_reduce(x * owned[..., None])


class VocabParallelHead(nn.Module):
    """Logits of this rank's tokens, gathered into the full vocabulary."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = weight  # the embedding shard's parameter when they are tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last(x @ self.weight.T)


def tensor_parallel(model: Transformer, rank: int | None = None,
                    world: int | None = None) -> Transformer:
    """Keep this rank's slice of every weight of ``model`` (in place) and wire in the
    collectives; ``rank`` / ``world`` default to the initialised process group's. The
    model's ``config`` becomes the rank's: its query and KV heads (so KV caches are sized
    from them) and its MLP width."""
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    config = model.config
    check_split(config.num_heads, config.num_kv_heads, config.intermediate_size,
                config.vocab_size, world)
    for block in model.layers:
        attn, mlp = block.attn, block.mlp
        if attn.qkv_proj is not None or mlp.gate_up_proj is not None:
            raise ValueError("shard the model before fuse_projections()")
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(attn, name, ColumnParallelLinear.from_linear(getattr(attn, name), rank,
                                                                 world))
        attn.o_proj = RowParallelLinear.from_linear(attn.o_proj, rank, world)
        attn.num_heads, attn.num_kv_heads = config.num_heads // world, config.num_kv_heads // world
        mlp.gate_proj = ColumnParallelLinear.from_linear(mlp.gate_proj, rank, world)
        mlp.up_proj = ColumnParallelLinear.from_linear(mlp.up_proj, rank, world)
        mlp.down_proj = RowParallelLinear.from_linear(mlp.down_proj, rank, world)
    tied = model.lm_head.weight is model.embed_tokens.weight
    head = model.lm_head.weight.detach()
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens, rank, world)
    model.lm_head = VocabParallelHead(model.embed_tokens.weight if tied
                                      else nn.Parameter(_rows(head, rank, world)))
    model.config = dataclasses.replace(config, num_heads=config.num_heads // world,
                                       num_kv_heads=config.num_kv_heads // world,
                                       intermediate_size=config.intermediate_size // world)
    return model
