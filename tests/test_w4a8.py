"""int4 weights x int8 activations (W4A8): the C++ kernel computes the written-out integer
sums (float64 reference) to float32 rounding, for every group size and row count, and
whole models run on it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from minillm import ops
from minillm.ops import quantize_symmetric
from minillm.quant import QuantScheme, quantize_model
from minillm.quant.embedding import compact_embedding
from minillm.quant.int8_activations import to_int8_activations
from minillm.quant.qlinear import QuantLinear
from minillm.quant.w4a8 import W4A8Linear
from minillm.quant.weight_only import WeightOnlyLinear
from minillm.reference import generate
from minillm.testing import tiny_pair

Q4_1 = QuantScheme(4, symmetric=False, group_size=32, float_zero=True)


def w4a8_layer(out_features=96, in_features=192, group_size=32, bias=False) -> W4A8Linear:
    torch.manual_seed(2)
    linear = nn.Linear(in_features, out_features, bias=bias)
    scheme = QuantScheme(4, symmetric=False, group_size=group_size, float_zero=True)
    return W4A8Linear.from_weight_only(
        WeightOnlyLinear.from_quant_linear(QuantLinear.from_linear(linear, scheme)))


def test_symmetric_grid_rounds_to_the_nearest_of_255_levels():
    x = torch.tensor([[0.0, 1.0, -2.54, 2.54], [0.0, 0.0, 0.0, 0.0]])
    codes, scale = quantize_symmetric(x)
    assert torch.equal(scale.flatten(), torch.tensor([2.54 / 127, 1.0]))
    assert torch.equal(codes[0], torch.tensor([0.0, 50.0, -127.0, 127.0]))
    assert torch.equal(codes[1], torch.zeros(4))


@pytest.mark.parametrize("out_features, in_features, group_size",
                         [(96, 192, 32), (97, 576, 32), (64, 192, 64), (40, 96, 16)],
                         ids=["VNNI groups", "odd rows", "groups of 64", "groups of 16"])
@pytest.mark.parametrize("rows", [1, 5])
def test_kernel_equals_the_float64_reference(out_features, in_features, group_size, rows):
    layer = w4a8_layer(out_features, in_features, group_size)
    x = torch.randn(rows, in_features) * torch.rand(rows, 1) * 8
    x[0, :7] = 40.0  # an outlier sets the row's scale
    y = layer(x)
    expected = layer.reference_product(x.double()).float()
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_zero_rows_give_zero_and_bias_is_added():
    layer = w4a8_layer(bias=True)
    y = layer(torch.zeros(2, 192))
    assert torch.equal(y, layer.bias.expand(2, -1))


def test_layer_is_close_to_its_float_weights():
    layer = w4a8_layer()
    x = torch.randn(3, 192)
    expected = x.double() @ layer.dense_weight().double().T
    error = (layer(x).double() - expected).norm() / expected.norm()
    assert error < 0.02  # int8 activations: about 0.5% here


def test_kernel_refuses_wrong_layouts():
    layer = w4a8_layer()
    with pytest.raises(RuntimeError, match="int4 weights are contiguous uint8 codes"):
        ops.w4a8_linear(torch.randn(1, 192), layer.codes, layer.scales.float(), layer.zeros)


def test_to_int8_activations_gives_int4_layers_w4a8(tmp_path):
    model, _ = tiny_pair(tmp_path, tie_word_embeddings=True)
    quantized = compact_embedding(quantize_model(model, "rtn", Q4_1), "int8")
    fast = to_int8_activations(copy.deepcopy(quantized))
    assert isinstance(fast.layers[0].mlp.down_proj, W4A8Linear)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        error = (fast(ids) - quantized(ids)).abs().max() / quantized(ids).abs().max()
    assert 0 < error < 0.05
    assert len(generate(fast, [5, 17, 99, 3], 12)[0]) == 12
