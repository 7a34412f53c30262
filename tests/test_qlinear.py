"""QuantLinear: packed storage, equals the dequantized matmul, shrinks the model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from minillm.quant.basic import QuantScheme, fake_quantize
from minillm.quant.embedding import CompactEmbedding, compact_embedding
from minillm.quant.qlinear import QuantLinear, model_nbytes, quantize_model_rtn
from minillm.reference import generate
from minillm.testing import tiny_pair


@pytest.mark.parametrize("scheme", [QuantScheme(4, False, 32), QuantScheme(4, True, None),
                                    QuantScheme(8, True, None), QuantScheme(3, False, 64)],
                         ids=str)
def test_quant_linear_equals_matmul_with_the_dequantized_weight(scheme):
    torch.manual_seed(0)
    linear = nn.Linear(128, 48, bias=True)
    q = QuantLinear.from_linear(linear, scheme)
    x = torch.randn(5, 128)
    torch.testing.assert_close(q(x), x @ q.dense_weight().T + linear.bias)
    # the stored weight is the round-to-nearest one, up to fp16 rounding of the scales
    torch.testing.assert_close(q.dense_weight(), fake_quantize(linear.weight.detach(),
                                                                     scheme),
                               atol=1e-4, rtol=1e-3)


def test_int4_g128_takes_under_30_percent_of_fp16_bytes():
    q = QuantLinear.from_linear(nn.Linear(576, 1536, bias=False), QuantScheme(4, False, 128))
    fp16_bytes = 576 * 1536 * 2
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (1536, 288)  # two codes a byte
    assert q.nbytes() / fp16_bytes < 0.30


def test_quantized_tiny_model_runs_and_is_smaller(tmp_path):
    model, _ = tiny_pair(tmp_path)
    before = model_nbytes(model)
    quantized = quantize_model_rtn(copy.deepcopy(model), QuantScheme(8, True, None))
    assert model_nbytes(quantized) < before
    assert isinstance(quantized.layers[0].mlp.up_proj, QuantLinear)
    assert isinstance(quantized.lm_head, nn.Linear)  # skipped by default
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # 8-bit per-channel: nearly the same logits
        torch.testing.assert_close(quantized(ids), model(ids), atol=0.05, rtol=0.05)
    assert len(generate(quantized, [1, 2, 3], 5)[0]) == 5


@pytest.mark.smollm2
def test_quantized_smollm2_save_load_generate_identical_tokens(smollm2, tokenizer, tmp_path):
    from minillm.quant.checkpoint import load_quantized, save_quantized

    scheme = QuantScheme(bits=4, symmetric=False, group_size=128)
    quantized = quantize_model_rtn(copy.deepcopy(smollm2), scheme)
    assert model_nbytes(quantized) < 0.45 * model_nbytes(smollm2)  # fp32 embedding kept
    prompt = tokenizer.chat_prompt("Name a colour.")
    before = generate(quantized, prompt, 12)
    save_quantized(quantized, tmp_path)
    reloaded = load_quantized(tmp_path)
    assert generate(reloaded, prompt, 12) == before
    assert torch.equal(reloaded.layers[3].attn.q_proj.codes, quantized.layers[3].attn.q_proj.codes)


def test_three_bit_codes_take_three_eighths_of_a_byte():
    q = QuantLinear.from_linear(nn.Linear(576, 64, bias=False), QuantScheme(3, False, 128))
    assert q.codes.shape == (64, 576 * 3 // 8)
    x = torch.randn(2, 576)
    torch.testing.assert_close(q(x), x @ q.dense_weight().T)


def test_cli_quantize_writes_a_checkpoint_that_load_model_reads(tmp_path):
    from minillm.checkpoint import load_model
    from minillm.cli import main

    model, _ = tiny_pair(tmp_path / "float")
    out = tmp_path / "int4"
    assert main(["quantize", str(out), "--model", str(tmp_path / "float"), "--bits", "4",
                 "--group-size", "32", "--embedding", "int8"]) == 0
    reloaded = load_model(out)
    assert isinstance(reloaded.layers[1].attn.o_proj, QuantLinear)
    assert isinstance(reloaded.embed_tokens, CompactEmbedding)
    expected = compact_embedding(
        quantize_model_rtn(copy.deepcopy(model), QuantScheme(4, False, 32)), "int8")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids), expected(ids))


def test_loading_a_plain_directory_as_quantized_is_a_clear_error(tmp_path):
    from minillm.assets import AssetError
    from minillm.quant.checkpoint import load_quantized

    with pytest.raises(AssetError, match="not a quantized checkpoint"):
        load_quantized(tmp_path)


def test_a_quantized_checkpoint_missing_a_tensor_is_a_clear_error(tmp_path):
    from safetensors.torch import load_file, save_file

    from minillm.assets import AssetError
    from minillm.quant.checkpoint import load_quantized, save_quantized

    model, _ = tiny_pair(tmp_path / "float")
    save_quantized(quantize_model_rtn(model, QuantScheme(4, False, 32)), tmp_path / "q")
    state = load_file(tmp_path / "q" / "model.safetensors")
    del state["layers.0.mlp.down_proj.scales"]
    save_file(state, tmp_path / "q" / "model.safetensors")
    with pytest.raises(AssetError, match="missing .*down_proj.scales"):
        load_quantized(tmp_path / "q")


@pytest.mark.parametrize("fmt", ["fp16", "int8"])
def test_quantized_checkpoint_keeps_a_compact_tied_embedding(tmp_path, fmt):
    from minillm.quant.checkpoint import load_quantized, save_quantized

    model, _ = tiny_pair(tmp_path / "float", tie_word_embeddings=True)
    scheme = QuantScheme(4, False, 32)
    quantized = compact_embedding(quantize_model_rtn(model, scheme), fmt)
    save_quantized(quantized, tmp_path / fmt)
    reloaded = load_quantized(tmp_path / fmt)
    assert isinstance(reloaded.embed_tokens, CompactEmbedding) and reloaded.embed_tokens.fmt == fmt
    assert reloaded.lm_head.embedding is reloaded.embed_tokens  # still one shared table
    assert model_nbytes(reloaded) == model_nbytes(quantized)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids), quantized(ids), rtol=0, atol=0)
