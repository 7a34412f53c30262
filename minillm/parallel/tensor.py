"""Tensor parallelism as a transformation: a rank's model, with its slice of every weight.

Each of ``t`` processes keeps a slice of every weight and computes with it; a collective
puts the pieces back together where the math needs the whole (Megatron-LM, Shoeybi et
al. 2019). The layers that do so are in :mod:`.layers`: column-parallel q/k/v and gate/up
(no communication), row-parallel o_proj and down_proj (an all-reduce each: two per block,
Megatron §3, eq. 3), a vocabulary-parallel embedding (an all-reduce) and head (an
all-gather).

Attention splits by **KV-head groups**: rank r keeps KV heads [r·g, (r+1)·g) and the query
heads that read them, so each rank's attention is ordinary GQA on its own heads. SmolLM2
(9 query, 3 KV heads) therefore splits 3 ways, not 2. On 2 ranks, ``shard_attention=False``
keeps attention whole on every rank (each computes it redundantly, no all-reduce) and
shards only the MLP and the vocabulary — 61% of the block's weights.

The vocabulary splits too: rank r keeps the embedding rows of tokens [r·V/t, (r+1)·V/t)
and the tied LM head is the same shard. A row-parallel bias is kept by rank 0 only, so
the sum counts it once.

:func:`tensor_parallel` returns rank r's model and leaves the model it was given as it
was; :func:`minillm.parallel.loading.load_shard` builds the same rank model reading only
its slice of the safetensors file.

``layers=`` builds the rank model from other parallel layers: any object (a module, a
namespace) with the three parts of :class:`ParallelLayers`. Chapter 14's lab passes the
learner's, and the engine runs them (``LLM(..., parallel_layers=...)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from ..model import Transformer
from ..moe import MoE
from ..quant.basic import Quantized
from ..quant.qlinear import QuantLinear
from ..transform import copy_modules
from .experts import expert_parallel
from .layers import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding

ShardWeight = Callable[[torch.Tensor, int, int, int], torch.Tensor]


class ParallelLayers(Protocol):
    """What :func:`tensor_parallel` needs to build a rank model from other layers (the
    contracts are chapter 14's lab, ``solutions/ch14_tensor_parallel.py``):

    * ``parallel_block(block, rank, world, shard_attention)``: a new decoder layer
      computing the whole block's output from this rank's shards (the given one unchanged);
    * ``VocabParallelEmbedding(weight, rank, world)``: from the whole [vocab, hidden]
      embedding, a module mapping token ids to their whole embeddings; its ``weight`` is
      this rank's rows [r·V/t, (r+1)·V/t);
    * ``ParallelLMHead(weight)``: from this rank's rows of the head, a module mapping
      hidden states to the whole vocabulary's logits.
    """

    def parallel_block(self, block: nn.Module, rank: int, world: int,
                       shard_attention: bool = True) -> nn.Module: ...

    def VocabParallelEmbedding(self, weight: torch.Tensor, rank: int,  # noqa: N802
                               world: int) -> nn.Module: ...

    def ParallelLMHead(self, weight: torch.Tensor) -> nn.Module: ...  # noqa: N802

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")


def shard_weight(weight: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of ``weight`` along ``dim`` (one of ``world`` equal
    parts), as its own tensor: what the rank keeps when the rest is freed."""
    size = weight.shape[dim]
    if size % world:
        raise ValueError(f"{size} rows do not split into {world} equal shards")
    part = size // world
    return weight.narrow(dim, rank * part, part).clone()


def check_split(num_heads: int, num_kv_heads: int, intermediate: int, vocab: int,
                world: int, shard_attention: bool = True) -> None:
    """Refuse, with the reason, a model that does not split evenly ``world`` ways."""
    if world < 1:
        raise ValueError(f"the world size must be at least 1, got {world}")
    sizes = [("MLP columns", intermediate), ("vocabulary rows", vocab)]
    if shard_attention:
        sizes = [("KV heads", num_kv_heads), ("query heads", num_heads), *sizes]
    for what, size in sizes:
        if size % world:
            hint = (" or keep attention whole with shard_attention=False"
                    if what.endswith("heads") else "")
            raise ValueError(f"tensor parallelism over {world} ranks needs the {what} "
                             f"({size}) to divide evenly; choose a world size that divides "
                             f"{size}{hint}")


def _quantized_shard(layer: QuantLinear, dim: int, rank: int, world: int,
                     shard: ShardWeight) -> QuantLinear:
    """A quantized layer's slice: codes by rows or columns, with their scales and zeros. A
    column slice must hold whole quantization groups; one scale per row (or per tensor)
    is shared by every column slice."""
    scheme = layer.scheme
    codes, scales, zeros = layer.codes_unpacked(), layer.scales.float(), layer.zeros.float()
    if scheme.symmetric:  # back to signed codes (QuantLinear stores them shifted)
        half = 2 ** (scheme.bits - 1)
        codes, zeros = (codes.to(torch.int16) - half).to(torch.int8), zeros - half
    group = layer.in_features if scheme.per_tensor else \
        min(scheme.group_size or layer.in_features, layer.in_features)
    if dim == 1 and (layer.in_features // world) % group and group != layer.in_features:
        raise ValueError(f"a row-parallel shard of {layer.in_features // world} input columns "
                         f"must hold whole quantization groups of {group}; quantize with a "
                         "group size that divides it (e.g. 64) or per channel")
    if not scheme.per_tensor and (dim == 0 or group != layer.in_features):
        scales, zeros = shard(scales, dim, rank, world), shard(zeros, dim, rank, world)
    quantized = Quantized(shard(codes, dim, rank, world), scales, zeros, scheme)
    return QuantLinear(quantized, _bias_shard(layer.bias, dim, rank, world, shard))


def _bias_shard(bias, dim: int, rank: int, world: int, shard: ShardWeight):
    if bias is None:
        return None
    if dim == 0:
        return shard(bias.detach(), 0, rank, world)
    return bias.detach().clone() if rank == 0 else torch.zeros_like(bias)  # added once


def shard_linear(layer: nn.Module, dim: int, rank: int, world: int,
                 shard: ShardWeight = shard_weight) -> nn.Module:
    """The same kind of layer holding rank ``rank``'s slice: output rows (``dim=0``,
    column-parallel) or input columns (``dim=1``, row-parallel; its bias on rank 0 only)."""
    if isinstance(layer, QuantLinear):
        return _quantized_shard(layer, dim, rank, world, shard)
    if type(layer) is not nn.Linear:
        raise TypeError(f"cannot shard a {type(layer).__name__}: tensor parallelism handles "
                        "nn.Linear and QuantLinear layers (shard before other transformations)")
    weight = shard(layer.weight.detach(), dim, rank, world)
    sharded = nn.Linear(weight.shape[1], weight.shape[0], bias=layer.bias is not None,
                        device="meta").to(weight.dtype)
    sharded.weight = nn.Parameter(weight, requires_grad=False)
    if layer.bias is not None:
        sharded.bias = nn.Parameter(_bias_shard(layer.bias, dim, rank, world, shard),
                                    requires_grad=False)
    return sharded


def _shard_module(module: nn.Module, rank: int, world: int, shard: ShardWeight) -> None:
    """Make an Attention or MLP module's linears column- or row-parallel shards of
    themselves (``module`` is the rank model's own copy)."""
    for name in COLUMN_PARALLEL + ROW_PARALLEL:
        if hasattr(module, name):
            dim = 0 if name in COLUMN_PARALLEL else 1
            layer = shard_linear(getattr(module, name), dim, rank, world, shard)
            setattr(module, name, ColumnParallelLinear(layer) if dim == 0 else
                    RowParallelLinear(layer))


def tensor_parallel(model: Transformer, rank: int | None = None, world: int | None = None,
                    *, shard_attention: bool = True, shard: ShardWeight = shard_weight,
                    layers: ParallelLayers | None = None) -> Transformer:
    """Rank ``rank``'s model of ``world``: every weight of ``model`` cut to its slice and
    the collectives wired in (``model`` itself is not changed). ``rank`` / ``world``
    default to the initialised process group's.

    ``shard(weight, dim, rank, world)`` cuts every tensor (pass your own to check it). The
    rank model's ``config`` is the rank's: its query and KV heads (so KV caches are sized
    from them) and its MLP width. ``layers``: build it from these parallel layers instead
    of the library's (:class:`ParallelLayers`; float ``nn.Linear`` weights).

    A mixture-of-experts layer becomes its expert-parallel part
    (:func:`~minillm.parallel.experts.expert_parallel` over the replicated tokens: E/world
    experts per rank, one all-reduce), the router and shared experts whole on every rank."""
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    if dist.is_initialized() and world != dist.get_world_size():
        raise ValueError(f"asked for {world} shards but the process group has "
                         f"{dist.get_world_size()} ranks; shard over the group's size")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of the {world} ranks 0..{world - 1}")
    if any(isinstance(m, VocabParallelEmbedding) for m in model.modules()):
        raise ValueError("this model is already a tensor-parallel rank's model; shard the "
                         "whole model")
    config = model.config
    check_model_split(config, world, shard_attention, layers)
    heads = config.num_heads // world if shard_attention else config.num_heads
    kv_heads = config.num_kv_heads // world if shard_attention else config.num_kv_heads
    if layers is not None:
        ranked = _from_layers(model, rank, world, shard_attention, shard, layers)
        ranked.config = dataclasses.replace(
            config, num_heads=heads, num_kv_heads=kv_heads,
            intermediate_size=config.intermediate_size // world)
        return ranked
    ranked = copy_modules(model)
    for block in ranked.layers:
        if shard_attention:
            _shard_module(block.attn, rank, world, shard)
            block.attn.num_heads, block.attn.num_kv_heads = heads, kv_heads
        if isinstance(block.mlp, MoE):
            block.mlp = expert_parallel(block.mlp, rank, world, tokens="replicated")
        else:
            _shard_module(block.mlp, rank, world, shard)
    tied = model.lm_head.weight is model.embed_tokens.weight
    ranked.embed_tokens = VocabParallelEmbedding(
        shard(model.embed_tokens.weight.detach(), 0, rank, world), rank)
    ranked.lm_head = ParallelLMHead(ranked.embed_tokens.weight if tied else
                                    nn.Parameter(shard(model.lm_head.weight.detach(), 0,
                                                       rank, world), requires_grad=False))
    ranked.config = dataclasses.replace(config, num_heads=heads, num_kv_heads=kv_heads,
                                        intermediate_size=config.intermediate_size // world)
    return ranked


def check_model_split(config, world: int, shard_attention: bool = True,
                      layers: ParallelLayers | None = None) -> None:
    """:func:`check_split` for a model's config, and refuse, saying what to do, what these
    shards cannot compute: latent attention, a QK-norm over all heads split by head, a
    mixture-of-experts model built from dense parallel ``layers``, uneven experts."""
    dense = len(config.moe_layers or []) < config.num_layers  # else no dense MLP columns
    check_split(config.num_heads, config.num_kv_heads, config.intermediate_size if dense else 0,
                config.vocab_size, world, shard_attention)
    if config.moe is not None and config.moe["num_experts"] % world:
        raise ValueError(f"{config.moe['num_experts']} experts do not split evenly over "
                         f"{world} ranks; choose a world size that divides the expert count")
    if config.mla is not None:
        raise ValueError(f"tensor parallelism does not split this {config.family} model's "
                         "multi-head latent attention yet; run it in one process")
    if config.qk_norm_whole and shard_attention:
        raise ValueError(f"this {config.family} model's QK-norm spans every head of q and k, "
                         "which sharded attention splits; pass shard_attention=False")
    if config.moe is not None and layers is not None:
        raise ValueError("the parallel layers given build dense blocks; shard this "
                         "mixture-of-experts model with the library's (layers=None)")


def _from_layers(model: Transformer, rank: int, world: int, shard_attention: bool,
                 shard: ShardWeight, layers: ParallelLayers) -> Transformer:
    """Rank ``rank``'s model built from ``layers`` (its config is the caller's to set)."""
    ranked = copy_modules(model)
    ranked.layers = nn.ModuleList(layers.parallel_block(block, rank, world, shard_attention)
                                  for block in model.layers)
    ranked.embed_tokens = layers.VocabParallelEmbedding(model.embed_tokens.weight.detach(),
                                                        rank, world)
    tied = model.lm_head.weight is model.embed_tokens.weight
    ranked.lm_head = layers.ParallelLMHead(
        ranked.embed_tokens.weight if tied else
        nn.Parameter(shard(model.lm_head.weight.detach(), 0, rank, world), requires_grad=False))
    return ranked
