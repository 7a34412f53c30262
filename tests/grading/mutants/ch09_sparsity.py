"""Plausible wrong answers to chapter 09 (sparsity); the graded tests must catch each one.

Each mutant replaces the solution function named before its ``__`` (see minillm.grading.mutants).
"""

import torch


def magnitude_mask__threshold(weight, sparsity):
    """Keeps |w| > the k-th smallest |w|: prunes more than k weights when they tie."""
    num_pruned = round(sparsity * weight.numel())
    if num_pruned == 0:
        return torch.ones_like(weight, dtype=torch.bool)
    threshold = weight.abs().flatten().kthvalue(num_pruned).values
    return weight.abs() > threshold


def magnitude_mask__topk_ties(weight, sparsity):
    """Prunes torch.topk's choice among tied |w|, not the earliest ones as the library does."""
    num_pruned = round(sparsity * weight.numel())
    mask = torch.ones(weight.numel(), dtype=torch.bool)
    if num_pruned:
        mask[weight.abs().flatten().topk(num_pruned, largest=False).indices] = False
    return mask.reshape(weight.shape)


def magnitude_mask__floor_count(weight, sparsity):
    """Prunes int(sparsity * n) weights instead of round(sparsity * n)."""
    num_pruned = int(sparsity * weight.numel())
    smallest_first = weight.abs().flatten().sort(stable=True).indices
    mask = torch.ones(weight.numel(), dtype=torch.bool)
    mask[smallest_first[:num_pruned]] = False
    return mask.reshape(weight.shape)


def magnitude_mask__per_row(weight, sparsity):
    """Prunes the same fraction of every row (Wanda's comparison group), not per layer."""
    per_row = round(sparsity * weight.shape[1])
    smallest_first = weight.abs().sort(dim=1, stable=True).indices[:, :per_row]
    return torch.ones_like(weight, dtype=torch.bool).scatter_(1, smallest_first, False)


def mask_2_4__topk(weight):
    """Keeps the tied |w| torch.topk happens to return, not the earlier ones as the library."""
    out, inp = weight.shape
    groups = weight.abs().reshape(out, inp // 4, 4)
    keep = groups.topk(2, dim=-1).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True).reshape(out, inp)


def mask_2_4__signed(weight):
    """Keeps the 2 largest w, forgetting the absolute value."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // 4, 4)
    keep = groups.topk(2, dim=-1).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True).reshape(out, inp)


def mask_2_4__strided_groups(weight):
    """Groups columns j, j + in/4, j + in/2, ... instead of 4 consecutive columns."""
    out, inp = weight.shape
    groups = weight.abs().reshape(out, 4, inp // 4)
    keep = groups.topk(2, dim=1).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(1, keep, True).reshape(out, inp)


def compress_2_4__nonzero(weight):
    """Takes positions from nonzero(): breaks when a group has fewer than 2 non-zeros."""
    out, inp = weight.shape
    positions = weight.reshape(out, inp // 4, 4).nonzero()[:, -1]
    indices = positions.reshape(out, inp // 2)
    values = weight[weight != 0].reshape(out, inp // 2)
    return values, indices


def compress_2_4__topk_ties(weight):
    """Stores the 2 largest |w| by topk: fills short groups with topk's zeros, not the lowest."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // 4, 4)
    indices = groups.abs().topk(2, dim=-1).indices.sort(dim=-1).values
    return groups.gather(-1, indices).reshape(out, inp // 2), indices.reshape(out, inp // 2)


def compress_2_4__unsorted_positions(weight):
    """Stores the non-zeros first, without sorting the two positions of a group."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // 4, 4)
    indices = torch.argsort(groups == 0, dim=-1, stable=True)[..., :2]
    return groups.gather(-1, indices).reshape(out, inp // 2), indices.reshape(out, inp // 2)


def decompress_2_4__float32(values, indices):
    """Always rebuilds a float32 matrix, whatever the values' dtype."""
    out, half = values.shape
    dense = torch.zeros(out, half // 2, 4)
    dense.scatter_(-1, indices.reshape(out, half // 2, 2).long(),
                   values.reshape(out, half // 2, 2).float())
    return dense.reshape(out, 2 * half)


def decompress_2_4__positions_in_row(values, indices):
    """Scatters at positions 0..3 of the whole row, forgetting each group's offset."""
    out, half = values.shape
    dense = torch.zeros(out, 2 * half, dtype=values.dtype)
    return dense.scatter_(1, indices.long(), values)
