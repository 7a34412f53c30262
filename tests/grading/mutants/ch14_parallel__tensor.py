"""Plausible wrong answers to chapter 14 (parallelism), tensor parallelism
(14.1 shard_weight / unshard, 14.2 parallel_mlp / all_reduce); the graded tests must catch
each one.
Each mutant replaces the solution function named before its ``__``."""

import torch
import torch.nn.functional as F


def _part(weight, dim, world):
    size = weight.shape[dim]
    if size % world:
        raise ValueError(f"{size} does not split into {world} equal shards")
    return size // world


# -- 14.1 shard_weight / unshard ------------------------------------------------------------

def shard_weight__view(weight, dim, rank, world):
    """Returns narrow()'s view: the rank keeps the whole weight's storage alive."""
    part = _part(weight, dim, world)
    return weight.narrow(dim, rank * part, part)


def shard_weight__contiguous_is_not_a_copy(weight, dim, rank, world):
    """Calls .contiguous() to get its own tensor: a row slice is already contiguous, so it
    stays a view of the weight."""
    part = _part(weight, dim, world)
    return weight.narrow(dim, rank * part, part).contiguous()


def shard_weight__clone_then_slice(weight, dim, rank, world):
    """Clones the whole weight, then slices the clone: the rank holds a full copy."""
    part = _part(weight, dim, world)
    return weight.clone().narrow(dim, rank * part, part)


def shard_weight__interleaved(weight, dim, rank, world):
    """Takes every world-th row or column (weight[rank::world]) instead of a contiguous run."""
    _part(weight, dim, world)
    index = torch.arange(rank, weight.shape[dim], world)
    return weight.index_select(dim, index)


def shard_weight__chunk(weight, dim, rank, world):
    """torch.chunk: on a size that does not divide, it silently makes uneven shards."""
    return torch.chunk(weight, world, dim)[rank].clone()


def shard_weight__inclusive_end(weight, dim, rank, world):
    """Slices [r·part, (r + 1)·part] with the end included: one row too many (but the last)."""
    part = _part(weight, dim, world)
    start = rank * part
    return weight.narrow(dim, start, min(part + 1, weight.shape[dim] - start)).clone()


def shard_weight__always_rows(weight, dim, rank, world):
    """Ignores dim: always cuts the output rows (dim 0), so row-parallel shards are wrong."""
    part = _part(weight, 0, world)
    return weight[rank * part:(rank + 1) * part].clone()


def shard_weight__float32_buffer(weight, dim, rank, world):
    """Copies the slice into a freshly allocated torch.empty(shape): float32, whatever the
    weight's dtype."""
    part = _part(weight, dim, world)
    piece = weight.narrow(dim, rank * part, part)
    out = torch.empty(piece.shape)
    out.copy_(piece)
    return out


def unshard__stack(shards, dim):
    """torch.stack: a new dimension of ranks instead of joining along dim."""
    return torch.stack(list(shards), dim=dim)


def unshard__along_rows(shards, dim):
    """Always concatenates along dim 0, whatever dim the shards were cut along."""
    return torch.cat(list(shards), dim=0)


def unshard__sum(shards, dim):
    """Adds the shards (an all-reduce) instead of putting them side by side (an all-gather)."""
    return torch.stack(list(shards)).sum(0)


# -- 14.2 parallel_mlp / all_reduce ---------------------------------------------------------

def _slices(size, world):
    part = size // world
    return [slice(r * part, (r + 1) * part) for r in range(world)]


def parallel_mlp__reduce_after_gate_up(x, gate, up, down, world):
    """All-reduces after gate and up, then every rank applies the whole of down: each rank
    returns the full output, so the sum counts it world times."""
    g = sum(x @ gate[cols].T @ torch.eye(gate.shape[0], dtype=x.dtype)[cols]
            for cols in _slices(gate.shape[0], world))  # the all-reduced gate projection
    u = sum(x @ up[cols].T @ torch.eye(up.shape[0], dtype=x.dtype)[cols]
            for cols in _slices(up.shape[0], world))
    out = (F.silu(g) * u) @ down.T
    return [out.clone() for _ in range(world)]


def parallel_mlp__down_by_output_rows(x, gate, up, down, world):
    """Cuts down by output rows (dim 0) like gate and up: each rank gets a slice of the
    output's columns from the whole activation, not a partial sum of all of them."""
    h = F.silu(x @ gate.T) * (x @ up.T)
    return [h @ down[rows].T for rows in _slices(down.shape[0], world)]


def parallel_mlp__silu_after_sum(x, gate, up, down, world):
    """Leaves silu out of the ranks (to apply after the all-reduce): down(gate x * up x)."""
    return [((x @ gate[cols].T) * (x @ up[cols].T)) @ down[:, cols].T
            for cols in _slices(gate.shape[0], world)]


def parallel_mlp__strided_gate(x, gate, up, down, world):
    """Takes gate's rows interleaved (gate[r::world]) but up's and down's contiguous: rank
    r multiplies silu of one set of neurons by the up projection of another."""
    out = []
    for rank, cols in enumerate(_slices(gate.shape[0], world)):
        h = F.silu(x @ gate[rank::world].T) * (x @ up[cols].T)
        out.append(h @ down[:, cols].T)
    return out


def parallel_mlp__each_rank_divides_by_world(x, gate, up, down, world):
    """Scales each rank's partial by 1/world, as if the all-reduce were an average."""
    return [((F.silu(x @ gate[cols].T) * (x @ up[cols].T)) @ down[:, cols].T) / world
            for cols in _slices(gate.shape[0], world)]


def all_reduce__mean(partials):
    """Averages the partials instead of summing them."""
    return torch.stack(list(partials)).mean(0)


def all_reduce__gather(partials):
    """Concatenates the partials along the last dimension: an all-gather, not an all-reduce."""
    return torch.cat(list(partials), dim=-1)


def all_reduce__in_place(partials):
    """Adds into the first partial in place (as dist.all_reduce does): rank 0's tensor
    changes under the caller."""
    total = partials[0]
    for partial in partials[1:]:
        total += partial
    return total


def all_reduce__first_rank(partials):
    """Returns rank 0's partial, as if every rank already had the whole answer."""
    return partials[0].clone()
