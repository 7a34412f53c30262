"""Plausible wrong answers to chapter 14's lab (tensor-parallel layers); the graded tests
must catch each one. Each mutant replaces the solution class or function named before its
``__``; the helpers below are the parts a mutant gets right."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from minillm.transform import copy_modules


def _block(size, rank, world):
    if size % world:
        raise ValueError(f"{size} does not split into {world} equal parts")
    part = size // world
    return slice(rank * part, (rank + 1) * part)


def _kept(tensor):
    return None if tensor is None else nn.Parameter(tensor.detach().clone(), requires_grad=False)


class _Linear(nn.Module):
    """A layer holding ``weight`` and ``bias`` (either may be a shard)."""

    def __init__(self, weight, bias):
        super().__init__()
        self.weight, self.bias = _kept(weight), _kept(bias)


# -- 14.7 column- and row-parallel linears ---------------------------------------------------

class ColumnParallelLinear__all_reduces_its_output(_Linear):
    """All-reduces its block of outputs, as if it were a row-parallel layer (the wrong
    collective: it sums the ranks' different output features)."""

    def __init__(self, linear, rank, world):
        rows = _block(linear.out_features, rank, world)
        super().__init__(linear.weight[rows], None if linear.bias is None else linear.bias[rows])

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        dist.all_reduce(y)
        return y


class ColumnParallelLinear__interleaved_rows(_Linear):
    """Keeps every world-th output row (weight[rank::world]) instead of a contiguous block:
    not the rows the weight loader gives the rank, nor the order of the outputs."""

    def __init__(self, linear, rank, world):
        _block(linear.out_features, rank, world)
        super().__init__(linear.weight[rank::world],
                         None if linear.bias is None else linear.bias[rank::world])

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear__view_of_the_weight(nn.Module):
    """Keeps narrow()'s views: every rank holds the whole weight's storage alive."""

    def __init__(self, linear, rank, world):
        super().__init__()
        rows = _block(linear.out_features, rank, world)
        self.register_buffer("weight", linear.weight.detach()[rows])
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach()[rows])

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear__bias_on_every_rank(_Linear):
    """Every rank adds the whole bias to its partial sum before the all-reduce: the bias
    is counted world times."""

    def __init__(self, linear, rank, world):
        columns = _block(linear.in_features, rank, world)
        super().__init__(linear.weight[:, columns], linear.bias)

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        dist.all_reduce(y)
        return y


class RowParallelLinear__no_all_reduce(_Linear):
    """Returns this rank's partial sum: the all-reduce is left out."""

    def __init__(self, linear, rank, world):
        columns = _block(linear.in_features, rank, world)
        super().__init__(linear.weight[:, columns], linear.bias)

    def forward(self, x):
        y = F.linear(x, self.weight)
        return y if self.bias is None else y + self.bias


class RowParallelLinear__input_rows(_Linear):
    """Cuts the weight's output rows (dim 0) as a column-parallel layer would, then sums the
    ranks' outputs: shapes that do not fit the input slice."""

    def __init__(self, linear, rank, world):
        rows = _block(linear.in_features, rank, world)
        super().__init__(linear.weight[rows], linear.bias)

    def forward(self, x):
        y = F.linear(x, self.weight)
        dist.all_reduce(y)
        return y if self.bias is None else y + self.bias


# -- 14.8 the vocabulary-parallel embedding and LM head ---------------------------------------

class _Embedding(nn.Module):
    def __init__(self, weight, rank, world):
        super().__init__()
        rows = _block(weight.shape[0], rank, world)
        self.start, self.rows = rows.start, rows.stop - rows.start
        self.weight = _kept(weight[rows])


class VocabParallelEmbedding__no_zeroing(_Embedding):
    """Clamps the ids into its range and looks them up, but never zeroes the tokens it does
    not own: the all-reduce adds every rank's wrong row."""

    def forward(self, token_ids):
        x = F.embedding((token_ids - self.start).clamp(0, self.rows - 1), self.weight)
        dist.all_reduce(x)
        return x


class VocabParallelEmbedding__inclusive_end(_Embedding):
    """Owns ids [start, start + rows] with the end included: the first token of the next
    rank's range is counted twice (as this rank's last row and as its owner's)."""

    def forward(self, token_ids):
        local = token_ids - self.start
        owned = (local >= 0) & (local <= self.rows)
        x = F.embedding(local.clamp(0, self.rows - 1), self.weight) * owned[..., None]
        dist.all_reduce(x)
        return x


class VocabParallelEmbedding__ids_not_shifted(_Embedding):
    """Masks by the right range but looks up the global id (clamped into its rows), not the
    id minus its range's first token: right on rank 0 only."""

    def forward(self, token_ids):
        local = token_ids - self.start
        owned = (local >= 0) & (local < self.rows)
        x = F.embedding(token_ids.clamp(0, self.rows - 1), self.weight) * owned[..., None]
        dist.all_reduce(x)
        return x


class ParallelLMHead__gathered_along_tokens(nn.Module):
    """All-gathers the local logits and joins them along the first dimension (the batch),
    not the vocabulary."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        local = (x @ self.weight.T).contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        return torch.cat(parts, dim=0)


class ParallelLMHead__reversed_ranks(nn.Module):
    """Joins the gathered logits last rank first: each rank's vocabulary block lands where
    another's belongs."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        local = (x @ self.weight.T).contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        return torch.cat(parts[::-1], dim=-1)


class ParallelLMHead__copies_the_tied_weight(nn.Module):
    """Keeps a copy of the weight it is given: a tied head holds a second copy of the
    embedding's shard."""

    def __init__(self, weight):
        super().__init__()
        self.weight = _kept(weight)

    def forward(self, x):
        local = (x @ self.weight.T).contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        return torch.cat(parts, dim=-1)


# -- 14.9 the decoder layer -------------------------------------------------------------------

def _mlp(mlp, whole, rank, world, column, row):
    mlp.gate_proj = column(whole.gate_proj, rank, world)
    mlp.up_proj = column(whole.up_proj, rank, world)
    mlp.down_proj = row(whole.down_proj, rank, world)


def _layers():
    """The solution's own layers (a 14.9 mutant gets 14.7 right)."""
    from minillm.grading import load_impl  # the solutions, whichever impl is being graded

    solutions = load_impl("ch14_tensor_parallel", "solutions")
    return solutions.ColumnParallelLinear, solutions.RowParallelLinear


def parallel_block__heads_not_updated(block, rank, world, shard_attention=True):
    """Shards q, k, v and o but leaves attn.num_heads and num_kv_heads at the whole
    model's."""
    column, row = _layers()
    ranked = copy_modules(block)
    if shard_attention:
        _block(block.attn.num_kv_heads, rank, world)
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(ranked.attn, name, column(getattr(block.attn, name), rank, world))
        ranked.attn.o_proj = row(block.attn.o_proj, rank, world)
    _mlp(ranked.mlp, block.mlp, rank, world, column, row)
    return ranked


def parallel_block__keys_and_values_whole(block, rank, world, shard_attention=True):
    """Splits the query heads but keeps every KV head on every rank: the rank's queries are
    grouped over the wrong keys and values."""
    column, row = _layers()
    ranked = copy_modules(block)
    if shard_attention:
        _block(block.attn.num_kv_heads, rank, world)
        ranked.attn.q_proj = column(block.attn.q_proj, rank, world)
        ranked.attn.o_proj = row(block.attn.o_proj, rank, world)
        ranked.attn.num_heads //= world
    _mlp(ranked.mlp, block.mlp, rank, world, column, row)
    return ranked


def parallel_block__in_place(block, rank, world, shard_attention=True):
    """Swaps the given block's own layers for the rank's: the caller's model is changed
    (and a second rank cut from it is cut from a shard)."""
    column, row = _layers()
    if shard_attention:
        _block(block.attn.num_kv_heads, rank, world)
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(block.attn, name, column(getattr(block.attn, name), rank, world))
        block.attn.o_proj = row(block.attn.o_proj, rank, world)
        block.attn.num_heads //= world
        block.attn.num_kv_heads //= world
    _mlp(block.mlp, block.mlp, rank, world, column, row)
    return block


def parallel_block__mlp_down_not_reduced(block, rank, world, shard_attention=True):
    """Makes down_proj column-parallel like gate and up: the MLP's output is never summed
    (and its shape no longer fits the residual stream)."""
    column, row = _layers()
    ranked = copy_modules(block)
    if shard_attention:
        _block(block.attn.num_kv_heads, rank, world)
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(ranked.attn, name, column(getattr(block.attn, name), rank, world))
        ranked.attn.o_proj = row(block.attn.o_proj, rank, world)
        ranked.attn.num_heads //= world
        ranked.attn.num_kv_heads //= world
    _mlp(ranked.mlp, block.mlp, rank, world, column, column)
    return ranked
