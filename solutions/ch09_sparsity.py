"""Chapter 09: sparsity — magnitude pruning, the 2:4 pattern, and its compressed form."""

from __future__ import annotations

import torch


def magnitude_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Exercise 09.1: Keep-mask that prunes the smallest-magnitude weights of a whole matrix.

    weight: [out, in]; sparsity: the fraction to prune, in [0, 1). Returns a bool tensor
    shaped like weight, True where the weight is kept, with exactly
    round(sparsity * weight.numel()) False entries: those of the smallest |w| in the
    whole matrix (one threshold per layer, as in Han et al. 2015).
    Hint: torch.topk(..., largest=False) on the flattened |w| gives the positions to prune.
    """
    ### BEGIN SOLUTION
    num_pruned = round(sparsity * weight.numel())
    mask = torch.ones(weight.numel(), dtype=torch.bool, device=weight.device)
    if num_pruned:
        mask[weight.abs().flatten().topk(num_pruned, largest=False).indices] = False
    return mask.reshape(weight.shape)
    ### END SOLUTION


def mask_2_4(weight: torch.Tensor) -> torch.Tensor:
    """Exercise 09.2: The 2:4 keep-mask: in each group of 4 inputs keep the 2 largest |w|.

    weight: [out, in] with in a multiple of 4; the groups are columns 0-3, 4-7, ... of each
    row. Returns a bool tensor shaped like weight with exactly two True in every group.
    Hint: view |w| as [out, in / 4, 4], take topk(2) on the last dimension, scatter True.
    """
    ### BEGIN SOLUTION
    out, inp = weight.shape
    groups = weight.abs().reshape(out, inp // 4, 4)
    keep = groups.topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return mask.reshape(out, inp)
    ### END SOLUTION


def compress_2_4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 09.3: Compress a 2:4-sparse matrix to its kept values and their positions.

    weight: [out, in], at most 2 non-zeros in each group of 4 inputs. Returns
    (values [out, in / 2], indices [out, in / 2] int64): for each group, in order, its 2
    kept entries (the 2 largest |w|) and their positions 0..3, the smaller position first.
    This is the layout of NVIDIA's sparse tensor cores (values + 2-bit metadata).
    Hint: topk(2) of |w| per group gives the positions; sort them; torch.gather the values.
    """
    ### BEGIN SOLUTION
    out, inp = weight.shape
    groups = weight.reshape(out, inp // 4, 4)
    indices = groups.abs().topk(2, dim=-1).indices.sort(dim=-1).values
    values = groups.gather(-1, indices)
    return values.reshape(out, inp // 2), indices.reshape(out, inp // 2)
    ### END SOLUTION


def decompress_2_4(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Exercise 09.3: Rebuild the dense [out, in] matrix from compress_2_4's output.

    values, indices: [out, in / 2] (indices: positions 0..3 inside each group of 4).
    Every entry not named by an index is zero; the result has values' dtype.
    Hint: start from zeros [out, in / 4, 4] and scatter the values at their positions.
    """
    ### BEGIN SOLUTION
    out, half = values.shape
    dense = torch.zeros(out, half // 2, 4, dtype=values.dtype, device=values.device)
    dense.scatter_(-1, indices.reshape(out, half // 2, 2).long(), values.reshape(out, half // 2, 2))
    return dense.reshape(out, 2 * half)
    ### END SOLUTION
