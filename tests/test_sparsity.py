"""Sparsity: exact masks, exact 2:4 compression, Sparse24Linear, Wanda, pruned models."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from minillm.generate import generate
from minillm.quant.basic import QuantScheme, fake_quantize
from minillm.quant.qlinear import model_nbytes
from minillm.quant.sparsity import (
    Sparse24Linear,
    compress_24,
    decompress_24,
    magnitude_mask,
    nm_mask,
    sparsify_model,
    unstructured_mask,
    wanda_scores,
    weight_sparsity,
)
from minillm.testing import tiny_pair


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.9])
def test_magnitude_mask_prunes_exactly_the_smallest(sparsity):
    weight = randn(24, 40)
    keep = magnitude_mask(weight, sparsity)
    assert int((~keep).sum()) == round(sparsity * weight.numel())
    if sparsity > 0:
        assert weight.abs()[keep].min() > weight.abs()[~keep].max()


def test_unstructured_mask_exact_count_with_ties_and_per_row():
    scores = (randn(12, 50) * 2).round().abs()  # few distinct values: many ties
    keep = unstructured_mask(scores, 0.5)
    assert int((~keep).sum()) == 300
    assert scores[keep].min() >= scores[~keep].max()
    per_row = unstructured_mask(scores, 0.3, per_row=True)
    assert ((~per_row).sum(dim=1) == 15).all()
    for row, kept in zip(scores, per_row, strict=True):
        assert row[kept].min() >= row[~kept].max()


@pytest.mark.parametrize("n, m", [(2, 4), (1, 4), (4, 8)])
def test_nm_mask_keeps_the_n_largest_of_every_m(n, m):
    scores = randn(6, 32).abs()
    keep = nm_mask(scores, n, m)
    groups, kept = scores.reshape(6, -1, m), keep.reshape(6, -1, m)
    assert (kept.sum(dim=-1) == n).all()
    smallest_kept = groups.masked_fill(~kept, float("inf")).amin(dim=-1)
    largest_pruned = groups.masked_fill(kept, float("-inf")).amax(dim=-1)
    assert (smallest_kept > largest_pruned).all()


def test_compress_decompress_24_is_exact_and_sorted():
    weight = randn(10, 48)
    sparse = weight * nm_mask(weight.abs())
    values, indices = compress_24(sparse)
    assert values.shape == indices.shape == (10, 24) and indices.dtype == torch.uint8
    pairs = indices.reshape(10, 12, 2)
    assert (pairs[..., 0] < pairs[..., 1]).all()  # positions in increasing order
    assert torch.equal(decompress_24(values, indices), sparse)
    sparse[0, :3] = 0  # a group with a single non-zero still round-trips
    assert torch.equal(decompress_24(*compress_24(sparse)), sparse)


def test_compress_24_rejects_a_dense_matrix():
    with pytest.raises(ValueError, match="not 2:4 sparse"):
        compress_24(randn(4, 8))
    with pytest.raises(ValueError, match="multiple of 4"):
        compress_24(randn(4, 6))


def test_metadata_packs_four_positions_a_byte_first_in_the_lowest_bits():
    linear = nn.Linear(16, 5, bias=False).requires_grad_(False)
    linear.weight.copy_(randn(5, 16))
    layer = Sparse24Linear.from_linear(linear)
    _, indices = compress_24(layer.dense_weight())  # [5, 8]: the kept positions
    assert layer.metadata.shape == (5, 2) and layer.metadata.dtype == torch.uint8
    for slot in range(4):
        assert torch.equal((layer.metadata >> 2 * slot) & 3, indices[:, slot::4])


def test_sparse24_linear_equals_dense_matmul_with_the_masked_weight():
    torch.manual_seed(0)
    linear = nn.Linear(64, 24)
    mask = nm_mask(linear.weight.detach().abs())
    layer = Sparse24Linear.from_linear(linear, mask)
    masked = (linear.weight.detach() * mask).half().float()  # values are stored in fp16
    x = randn(3, 64, seed=1)
    torch.testing.assert_close(layer(x), x @ masked.T + linear.bias.detach())
    assert torch.equal(layer.dense_weight(), masked)
    assert layer.values.shape == (24, 32) and layer.metadata.shape == (24, 8)
    bias_bytes = 24 * 4
    assert (layer.nbytes() - bias_bytes) / (64 * 24 * 2) == 0.5625  # (2 + 0.25) / 4


def test_sparse24_linear_with_quantized_values():
    torch.manual_seed(0)
    linear = nn.Linear(256, 32, bias=False)
    scheme = QuantScheme(4, False, 64)
    layer = Sparse24Linear.from_linear(linear, scheme=scheme)
    values, indices = compress_24(linear.weight.detach() * nm_mask(linear.weight.detach().abs()))
    expected = decompress_24(fake_quantize(values, scheme), indices)
    torch.testing.assert_close(layer.dense_weight(), expected, atol=1e-3, rtol=1e-3)
    # 4-bit values (0.25 B) + metadata (0.125 B) + fp16 scale/zero per 64 kept (0.03 B)
    assert layer.nbytes() / (256 * 32 * 2) < 0.21


def test_sparse24_linear_rejects_widths_without_whole_metadata_bytes():
    with pytest.raises(ValueError, match="multiple of 8"):
        Sparse24Linear.from_linear(nn.Linear(12, 4))


def test_wanda_beats_magnitude_with_planted_large_activation_channels():
    """A few input features carry activations 30x larger (as LLMs' outlier features do):
    magnitude pruning ignores them, Wanda keeps the weights that multiply them. The planted
    features lie in different groups of 4, so 2:4 can keep all of them."""
    weight, x = randn(32, 64), randn(512, 64, seed=1)
    x[:, [1, 6, 11, 21, 42]] *= 30
    norms = x.norm(dim=0)

    def output_error(keep):
        return (x @ weight.T - x @ (weight * keep).T).norm() / (x @ weight.T).norm()

    magnitude = output_error(magnitude_mask(weight, 0.5))
    wanda = output_error(unstructured_mask(wanda_scores(weight, norms), 0.5, per_row=True))
    assert wanda < 0.5 * magnitude
    magnitude_24 = output_error(nm_mask(weight.abs()))
    wanda_24 = output_error(nm_mask(wanda_scores(weight, norms)))
    assert wanda_24 < 0.5 * magnitude_24


def test_sparsified_tiny_model_runs_generates_and_shrinks(tmp_path):
    model, _ = tiny_pair(tmp_path)
    unstructured = sparsify_model(copy.deepcopy(model), sparsity=0.3, progress=False)
    assert weight_sparsity(unstructured) == pytest.approx(0.3, abs=1e-3)
    compressed = sparsify_model(copy.deepcopy(model), pattern="2:4", compress=True,
                                progress=False)
    assert isinstance(compressed.layers[1].mlp.down_proj, Sparse24Linear)
    assert isinstance(compressed.lm_head, nn.Linear)  # skipped
    assert torch.equal(compressed.lm_head.weight, model.lm_head.weight)
    assert weight_sparsity(compressed) == 0.5
    assert model_nbytes(compressed.layers) < 0.3 * model_nbytes(model.layers)  # vs fp32
    masked = sparsify_model(copy.deepcopy(model), pattern="2:4", progress=False)
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the compressed form holds the same weights, rounded to fp16
        torch.testing.assert_close(compressed(ids), masked(ids), atol=1e-2, rtol=1e-2)
    assert len(generate(compressed, [1, 2, 3], 5)[0]) == 5


def test_wanda_on_a_tiny_model_is_2_4_and_differs_from_magnitude(tmp_path):
    model, _ = tiny_pair(tmp_path)
    windows = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    wanda = sparsify_model(copy.deepcopy(model), pattern="2:4", method="wanda",
                           windows=windows, scheme=QuantScheme(4, False, 16), progress=False)
    magnitude = sparsify_model(copy.deepcopy(model), pattern="2:4", progress=False)
    layer = wanda.layers[0].attn.q_proj
    assert isinstance(layer, Sparse24Linear) and layer.quantized_values is not None
    kept = layer.dense_weight().reshape(layer.out_features, -1, 4) != 0
    assert (kept.sum(dim=-1) <= 2).all()
    assert not torch.equal(layer.dense_weight() != 0,
                           magnitude.layers[0].attn.q_proj.weight != 0)
    per_row = sparsify_model(copy.deepcopy(model), sparsity=0.25, method="wanda",
                             windows=windows, progress=False)
    zeros = (per_row.layers[1].mlp.up_proj.weight == 0).sum(dim=1)
    assert (zeros == 16).all()  # Wanda prunes each output row alike: 25% of 64 inputs


def test_sparsify_model_explains_bad_arguments(tmp_path):
    model, _ = tiny_pair(tmp_path)
    with pytest.raises(ValueError, match="either pattern"):
        sparsify_model(model, pattern="2:4", sparsity=0.5)
    with pytest.raises(ValueError, match="either pattern"):
        sparsify_model(model)
    with pytest.raises(ValueError, match="in \\[0, 1\\)"):
        sparsify_model(model, sparsity=1.0)
    with pytest.raises(ValueError, match="look like '2:4'"):
        sparsify_model(model, pattern="half")
    with pytest.raises(ValueError, match="calibration"):
        sparsify_model(model, pattern="2:4", method="wanda")
    with pytest.raises(ValueError, match="method must be"):
        sparsify_model(model, pattern="2:4", method="sparsegpt")
    with pytest.raises(ValueError, match="only the 2:4 pattern"):
        sparsify_model(model, sparsity=0.5, compress=True)


@pytest.mark.smollm2
def test_smollm2_compressed_24_bytes_and_logits(smollm2):
    compressed = sparsify_model(copy.deepcopy(smollm2), pattern="2:4", compress=True,
                                progress=False)
    linear_params = sum(m.weight.numel() for m in smollm2.layers.modules()
                        if isinstance(m, nn.Linear))
    sparse_bytes = sum(m.nbytes() for m in compressed.layers.modules()
                       if isinstance(m, Sparse24Linear))
    assert sparse_bytes / (2 * linear_params) == 0.5625
    dense = copy.deepcopy(smollm2)  # the same pruned weights, as plain nn.Linear layers
    for name, module in compressed.named_modules():
        if isinstance(module, Sparse24Linear):
            dense.get_submodule(name).weight.data.copy_(module.dense_weight())
    ids = torch.arange(100, 140)[None]
    with torch.no_grad():
        torch.testing.assert_close(compressed(ids), dense(ids), atol=1e-4, rtol=1e-4)
