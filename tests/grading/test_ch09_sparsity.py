"""Graded tests for chapter 09 (sparsity). The library (minillm.quant.sparsity) is the oracle."""

from __future__ import annotations

import pytest
import torch

from minillm.grading import load_impl
from minillm.quant import sparsity as library

impl = load_impl("ch09_sparsity")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def tied(*shape, seed=0):
    """Weights on a coarse grid, like SmolLM2's Q4_1 weights: many equal |w|, some zeros."""
    return torch.round(randn(*shape, seed=seed) * 4) / 8


def sparse_24_with_short_groups(out, inp, seed=0):
    """A 2:4-sparse weight where some groups keep fewer than 2 non-zeros (as after rounding
    kept weights to 4 bits) and some keep none."""
    weight = tied(out, inp, seed=seed)
    sparse = weight * library.nm_mask(weight.abs())
    groups = sparse.view(out, inp // 4, 4)
    groups[::3, ::2] = 0  # whole groups of zeros
    groups[1::3, 1::2, 1:3] = 0  # groups with at most one non-zero, at position 0 or 3
    return sparse


@pytest.mark.exercise("09.1", points=2)
@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.9])
def test_magnitude_mask_matches_the_library(sparsity):
    weight = randn(16, 40, seed=int(10 * sparsity))
    mask = impl.magnitude_mask(weight, sparsity)
    assert mask.dtype == torch.bool and mask.shape == weight.shape
    assert int((~mask).sum()) == round(sparsity * weight.numel())
    assert torch.equal(mask, library.magnitude_mask(weight, sparsity))


@pytest.mark.exercise("09.1", points=2)
@pytest.mark.parametrize("shape, sparsity", [((16, 40), 0.3), ((16, 40), 0.5), ((7, 9), 0.3),
                                             ((24, 32), 0.75)])
def test_magnitude_mask_prunes_exactly_k_of_tied_weights_like_the_library(shape, sparsity):
    """Equal |w| at the threshold: exactly round(s * n) go, the earliest first."""
    weight = tied(*shape, seed=shape[0])
    mask = impl.magnitude_mask(weight, sparsity)
    assert mask.dtype == torch.bool and mask.shape == weight.shape
    assert int((~mask).sum()) == round(sparsity * weight.numel())
    assert torch.equal(mask, library.magnitude_mask(weight, sparsity))


@pytest.mark.exercise("09.2", points=2)
@pytest.mark.parametrize("shape", [(8, 32), (3, 576)])
def test_mask_2_4_matches_the_library(shape):
    weight = randn(*shape, seed=shape[0])
    mask = impl.mask_2_4(weight)
    assert mask.dtype == torch.bool and mask.shape == weight.shape
    assert (mask.reshape(shape[0], -1, 4).sum(dim=-1) == 2).all()
    assert torch.equal(mask, library.nm_mask(weight.abs(), 2, 4))


@pytest.mark.exercise("09.2", points=1)
@pytest.mark.parametrize("shape", [(8, 32), (16, 576)])
def test_mask_2_4_breaks_ties_like_the_library(shape):
    """SmolLM2's weights tie often: the same weights must survive as in the library."""
    weight = tied(*shape, seed=shape[1])
    mask = impl.mask_2_4(weight)
    assert (mask.reshape(shape[0], -1, 4).sum(dim=-1) == 2).all()
    assert torch.equal(mask, library.nm_mask(weight.abs(), 2, 4))


@pytest.mark.exercise("09.3", points=2)
def test_compress_2_4_matches_the_library():
    weight = randn(6, 64, seed=1)
    sparse = weight * library.nm_mask(weight.abs())
    values, indices = impl.compress_2_4(sparse)
    expected_values, expected_indices = library.compress_24(sparse)
    assert values.shape == indices.shape == (6, 32)
    assert torch.equal(values, expected_values)
    assert torch.equal(indices.long(), expected_indices.long())


@pytest.mark.exercise("09.3", points=2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_decompress_2_4_inverts_the_library(dtype):
    weight = randn(5, 48, seed=2).to(dtype)
    sparse = weight * library.nm_mask(weight.abs())
    dense = impl.decompress_2_4(*library.compress_24(sparse))
    assert dense.dtype == dtype
    assert torch.equal(dense, sparse)


@pytest.mark.exercise("09.3", points=1)
def test_compress_then_decompress_round_trips():
    weight = randn(4, 32, seed=3)
    sparse = weight * library.nm_mask(weight.abs())
    assert torch.equal(impl.decompress_2_4(*impl.compress_2_4(sparse)), sparse)


@pytest.mark.exercise("09.3", points=2)
@pytest.mark.parametrize("seed", [0, 1])
def test_compress_2_4_groups_with_fewer_than_two_nonzeros(seed):
    """Short groups store their non-zeros and then their lowest zero positions."""
    sparse = sparse_24_with_short_groups(6, 64, seed=seed)
    values, indices = impl.compress_2_4(sparse)
    expected_values, expected_indices = library.compress_24(sparse)
    assert values.shape == indices.shape == (6, 32)
    assert torch.equal(indices.long(), expected_indices.long())
    assert torch.equal(values, expected_values)
    assert torch.equal(impl.decompress_2_4(values, indices), sparse)
