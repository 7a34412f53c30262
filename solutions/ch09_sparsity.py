"""Chapter 09: sparsity — magnitude pruning, the 2:4 pattern, and its compressed form."""

from __future__ import annotations

import torch


def magnitude_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Exercise 09.1: Keep-mask that prunes the smallest-magnitude weights of a whole matrix.

    weight: [out, in]; sparsity: the fraction to prune, in [0, 1). Returns a bool tensor
    shaped like weight, True where the weight is kept, with exactly
    round(sparsity * weight.numel()) False entries: those of the smallest |w| in the
    whole matrix (one threshold per layer, as in Han et al. 2015). Weights often tie
    (SmolLM2's take 16 values per group of 32): among equal |w| at the threshold, the
    earlier ones in row-major order go first, as in the library, so the count stays exact.
    Hint: torch.sort(|w| flattened, stable=True) lists the positions from the smallest |w|
    up, equal ones in index order.
    """
    ### BEGIN SOLUTION
    num_pruned = round(sparsity * weight.numel())
    smallest_first = weight.abs().flatten().sort(stable=True).indices
    mask = torch.ones(weight.numel(), dtype=torch.bool, device=weight.device)
    mask[smallest_first[:num_pruned]] = False
    return mask.reshape(weight.shape)
    ### END SOLUTION


def mask_2_4(weight: torch.Tensor) -> torch.Tensor:
    """Exercise 09.2: The 2:4 keep-mask: in each group of 4 inputs keep the 2 largest |w|.

    weight: [out, in] with in a multiple of 4; the groups are columns 0-3, 4-7, ... of each
    row. Returns a bool tensor shaped like weight with exactly two True in every group.
    Among equal |w| the earlier input is kept, as in the library: SmolLM2's weights tie
    often, and another rule prunes different weights.
    Hint: view |w| as [out, in / 4, 4], sort it in descending order with a *stable* sort
    (``argsort(..., stable=True)``), keep the first 2 indices, scatter True.
    """
    ### BEGIN SOLUTION
    out, inp = weight.shape
    groups = weight.abs().reshape(out, inp // 4, 4)
    keep = groups.argsort(dim=-1, descending=True, stable=True)[..., :2]
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return mask.reshape(out, inp)
    ### END SOLUTION


def compress_2_4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 09.3: Compress a 2:4-sparse matrix to its kept values and their positions.

    weight: [out, in], at most 2 non-zeros in each group of 4 inputs. Returns
    (values [out, in / 2], indices [out, in / 2] int64): for each group, in order, its 2
    stored entries and their positions 0..3, the smaller position first. The stored
    entries are the group's non-zeros; a group with fewer than 2 (a kept weight can be
    exactly 0, e.g. after 4-bit rounding) fills up with its lowest-position zeros, as the
    library does. This is the layout of NVIDIA's sparse tensor cores (values + 2-bit
    metadata).
    Hint: torch.argsort(groups == 0, dim=-1, stable=True) lists each group's non-zero
    positions first, then its zero positions, each in increasing order; keep the first 2,
    sort them, and torch.gather the values.
    """
    ### BEGIN SOLUTION
    out, inp = weight.shape
    groups = weight.reshape(out, inp // 4, 4)
    nonzeros_first = torch.argsort(groups == 0, dim=-1, stable=True)
    indices = nonzeros_first[..., :2].sort(dim=-1).values
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
