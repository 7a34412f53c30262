"""Weight-only int8/int4 layers: the decode layout computes the numbers of the layer it was
built from, eagerly, as Inductor compiles it, and inside SmolLM2 (same greedy tokens)."""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from torch import nn

from minillm.quant import QuantScheme, quantize_model
from minillm.quant.embedding import compact_embedding
from minillm.quant.qlinear import QuantLinear
from minillm.quant.weight_only import (
    WeightOnlyLinear,
    pack_int4_groups,
    to_weight_only,
    unpack_int4_groups,
)
from minillm.reference import generate
from minillm.testing import tiny_pair

SCHEMES = {
    "int8 per-channel symmetric": QuantScheme(8, True, None),
    "int8 g64 zero-point": QuantScheme(8, False, 64),
    "int4 g32 zero-point": QuantScheme(4, False, 32),
    "int4 g64 symmetric": QuantScheme(4, True, 64),
    "int4 per-channel": QuantScheme(4, False, None),
    "int4 g32 float zero (Q4_1)": QuantScheme(4, False, 32, float_zero=True),
}


def reduction_path():
    """Run the per-row reduction eagerly (it is what the compiled decode step executes)."""
    return mock.patch.object(torch.compiler, "is_compiling", return_value=True)


def test_int4_group_packing_round_trips():
    codes = torch.randint(0, 16, (6, 64), dtype=torch.uint8)
    packed = pack_int4_groups(codes, 32)
    assert packed.shape == (6, 2, 16) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4_groups(packed), codes)
    assert torch.equal(packed[0, 0, 0] & 15, codes[0, 0]) and torch.equal(packed[0, 0, 0] >> 4,
                                                                        codes[0, 16])


@pytest.mark.parametrize("scheme", SCHEMES.values(), ids=SCHEMES.keys())
def test_weight_only_layer_computes_the_quantized_layers_numbers(scheme):
    torch.manual_seed(0)
    linear = nn.Linear(128, 48)
    quantized = QuantLinear.from_linear(linear, scheme)
    layer = WeightOnlyLinear.from_quant_linear(quantized)
    torch.testing.assert_close(layer.dense_weight(), quantized.dense_weight(), rtol=0, atol=0)
    for shape in [(1, 1, 128), (3, 1, 128), (2, 9, 128)]:  # reduction, reduction, matmul
        x = torch.randn(shape)
        expected = x.double() @ quantized.dense_weight().double().T + linear.bias.double()
        with reduction_path():
            torch.testing.assert_close(layer(x).double(), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer(x).double(), expected, rtol=1e-5, atol=1e-5)


def test_compiled_reduction_equals_the_eager_one():
    torch.manual_seed(0)
    for scheme in (QuantScheme(8, True, None), QuantScheme(4, False, 32)):
        layer = WeightOnlyLinear.from_quant_linear(
            QuantLinear.from_linear(nn.Linear(256, 96, bias=False), scheme))
        x = torch.randn(1, 1, 256)
        with reduction_path():
            eager = layer(x)
        compiled = torch.compile(layer, dynamic=False)(x)
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", [QuantScheme(3, False, 32), QuantScheme(4, False, 24),
                                    QuantScheme(4, False, 32, per_tensor=True)],
                         ids=["3-bit", "groups not dividing the row", "per-tensor"])
def test_unsupported_layers_are_refused_clearly(scheme):
    layer = QuantLinear.from_linear(nn.Linear(128, 8), scheme)
    assert not WeightOnlyLinear.supports(layer)
    with pytest.raises(ValueError, match="weight-only layout"):
        WeightOnlyLinear.from_quant_linear(layer)


def test_to_weight_only_converts_layers_and_shares_the_int8_head(tmp_path):
    model, _ = tiny_pair(tmp_path, tie_word_embeddings=True)
    quantized = compact_embedding(quantize_model(model, "rtn", QuantScheme(4, False, 16)),
                                  "int8")
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        expected = quantized(ids)
    fast = to_weight_only(copy.deepcopy(quantized))
    assert isinstance(fast.layers[0].mlp.down_proj, WeightOnlyLinear)
    assert fast.lm_head.codes.data_ptr() == fast.embed_tokens.table.data_ptr()
    with torch.no_grad(), reduction_path():
        torch.testing.assert_close(fast(ids[:, :1]), quantized(ids[:, :1]), atol=1e-5,
                                   rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(fast(ids), expected, atol=1e-5, rtol=1e-5)


CHECKPOINTS = {"rtn int8": ("rtn", QuantScheme(8, True, None)),
               "gptq int4 g16": ("gptq", QuantScheme(4, False, 16)),
               "awq int4 g16": ("awq", QuantScheme(4, False, 16))}


@pytest.mark.parametrize("method, scheme", CHECKPOINTS.values(), ids=CHECKPOINTS.keys())
def test_quantized_checkpoints_load_into_the_fast_path(tmp_path, method, scheme):
    from minillm.checkpoint import load_model
    from minillm.quant.checkpoint import save_quantized

    model, _ = tiny_pair(tmp_path / "float", tie_word_embeddings=True)
    windows = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    quantized = quantize_model(model, method, scheme, windows=None if method == "rtn" else windows)
    quantized = compact_embedding(quantized, "int8")
    save_quantized(quantized, tmp_path / method)
    fast = to_weight_only(load_model(tmp_path / method))
    assert isinstance(fast.layers[1].attn.q_proj, WeightOnlyLinear)
    prompt = [5, 17, 99, 3]
    with reduction_path():
        assert generate(fast, prompt, 12) == generate(quantized, prompt, 12)


SMOLLM2_SCHEMES = {"int8": QuantScheme(8, True, None), "int4 g32": QuantScheme(4, False, 32)}


@pytest.mark.smollm2
@pytest.mark.slow
@pytest.mark.parametrize("scheme", SMOLLM2_SCHEMES.values(), ids=SMOLLM2_SCHEMES.keys())
def test_smollm2_fast_path_gives_the_slow_paths_tokens(smollm2, tokenizer, scheme):
    slow = compact_embedding(quantize_model(copy.deepcopy(smollm2), "rtn", scheme), "int8")
    fast = to_weight_only(copy.deepcopy(slow))
    prompt = tokenizer.chat_prompt("What is a KV cache?")
    with torch.no_grad(), reduction_path():
        torch.testing.assert_close(fast(torch.tensor([prompt[-1:]])),
                                   slow(torch.tensor([prompt[-1:]])), atol=1e-4, rtol=1e-4)
        assert generate(fast, prompt, 8) == generate(slow, prompt, 8)


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_compiled_fast_path_gives_the_eager_tokens(smollm2, tokenizer):
    from minillm.generate import generate as engine_generate

    model = to_weight_only(compact_embedding(
        quantize_model(copy.deepcopy(smollm2), "rtn", QuantScheme(4, False, 32)), "int8"))
    prompt = tokenizer.chat_prompt("Name three colours.")
    expected = generate(model, prompt, 8)
    assert engine_generate(model, prompt, 8, executor="compiled") == expected
