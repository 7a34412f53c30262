"""Fused q/k/v and gate/up projections compute the unfused model's numbers in every weight
format; the written-out decode attention equals the model's backend."""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from torch import nn

from conftest import tiny_pair
from minillm.attention.sdpa import sdpa_attention
from minillm.compile import DecodeAttention
from minillm.fused_projections import concat_outputs, fuse_projections
from minillm.generate import generate
from minillm.quant import QuantScheme, quantize_model
from minillm.quant.embedding import compact_embedding
from minillm.quant.int8_activations import to_int8_activations
from minillm.quant.weight_only import to_weight_only

FORMATS = {
    "fp32": lambda model: model,
    "int4 g16 weight-only": lambda model: to_weight_only(
        quantize_model(model, "rtn", QuantScheme(4, False, 16))),
    "int8 activations": lambda model: to_int8_activations(compact_embedding(
        quantize_model(model, "rtn", QuantScheme(8, True, None)), "int8")),
}


@pytest.mark.parametrize("convert", FORMATS.values(), ids=FORMATS.keys())
def test_fused_model_computes_the_unfused_numbers(tmp_path, convert):
    model, _ = tiny_pair(tmp_path, tie_word_embeddings=True)
    model = convert(model)
    fused = fuse_projections(copy.deepcopy(model))
    attention, mlp = fused.layers[0].attn, fused.layers[0].mlp
    assert attention.q_proj is None and attention.qkv_proj is not None
    assert mlp.gate_proj is None and mlp.gate_up_proj.out_features == 2 * mlp.down_proj.in_features
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        torch.testing.assert_close(fused(ids), model(ids), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused(ids[:, :1]), model(ids[:, :1]), atol=1e-5, rtol=1e-5)
    assert generate(fused, [5, 17, 99, 3], 10) == generate(model, [5, 17, 99, 3], 10)


def test_fusing_twice_changes_nothing(tmp_path):
    model, _ = tiny_pair(tmp_path)
    fused = fuse_projections(model)
    qkv = fused.layers[0].attn.qkv_proj
    assert fuse_projections(fused).layers[0].attn.qkv_proj is qkv


def test_bias_is_stacked_too():
    layers = [nn.Linear(8, n) for n in (4, 2, 2)]
    fused = concat_outputs(layers)
    x = torch.randn(3, 8)
    torch.testing.assert_close(fused(x), torch.cat([layer(x) for layer in layers], -1))


def test_layers_that_cannot_be_joined_are_refused():
    with pytest.raises(TypeError, match="different formats"):
        concat_outputs([nn.Linear(8, 4), nn.Identity()])
    with pytest.raises(ValueError, match="only some have a bias"):
        concat_outputs([nn.Linear(8, 4), nn.Linear(8, 4, bias=False)])
    with pytest.raises(TypeError, match="cannot fuse Identity"):
        concat_outputs([nn.Identity(), nn.Identity()])


@pytest.mark.parametrize("heads, kv_heads, batch", [(9, 3, 1), (4, 4, 2), (4, 1, 3)])
def test_decode_attention_equals_the_backend(heads, kv_heads, batch):
    torch.manual_seed(0)
    q = torch.randn(batch, heads, 1, 16)
    k, v = torch.randn(2, batch, kv_heads, 40, 16)
    mask = (torch.arange(40) < 27)[None, None, None, :]  # slots 27+ not written yet
    attention = DecodeAttention(sdpa_attention)
    expected = sdpa_attention(q, k, v, mask)
    with mock.patch.object(torch.compiler, "is_compiling", return_value=True):
        written_out = attention(q, k, v, mask)
    torch.testing.assert_close(written_out, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(attention(q, k, v, mask), expected)  # eagerly: the backend itself
