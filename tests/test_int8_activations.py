"""int8 weights x int8 activations (W8A8, dynamic): the readable rounding and integer sums
equal PyTorch's dynamic quantization and FBGEMM's kernel, minillm's C++ kernel equals the
readable reference bit for bit, and SmolLM2 runs on it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from minillm import ops
from minillm.native import cpu_flags
from minillm.ops import activation_qparams, quantize_activations
from minillm.quant import QuantScheme, quantize_model
from minillm.quant.embedding import compact_embedding
from minillm.quant.int8_activations import Int8ActivationLinear, to_int8_activations
from minillm.quant.qlinear import QuantLinear
from minillm.quant.weight_only import WeightOnlyLinear
from minillm.reference import generate
from minillm.testing import tiny_pair

INT8 = QuantScheme(8, symmetric=True, group_size=None)


def activation_rows() -> torch.Tensor:
    """Rows of every kind the rule must handle: all zero, one sign only, tiny and huge
    ranges, an outlier, and shifted Gaussians."""
    torch.manual_seed(0)
    special = [torch.zeros(576), torch.rand(576), -torch.rand(576), torch.randn(576) * 1e-6,
               torch.randn(576) * 1e3, torch.randn(576).index_fill(0, torch.tensor([7]), 60.0)]
    shifted = torch.randn(400, 576) * torch.rand(400, 1) * 10 + torch.randn(400, 1)
    return torch.cat([torch.stack(special), shifted])


def torch_dynamic(row: torch.Tensor):
    return torch.quantize_per_tensor_dynamic(row, torch.quint8, reduce_range=False)


@pytest.mark.filterwarnings("ignore:.*deprecated")
def test_activation_grid_is_pytorchs_dynamic_quantization():
    rows = activation_rows()
    scale, zero = activation_qparams(rows)
    codes, _, _ = quantize_activations(rows)
    expected = [torch_dynamic(row) for row in rows]
    assert torch.equal(scale.flatten(), torch.tensor([q.q_scale() for q in expected]).float())
    assert torch.equal(zero.flatten(), torch.tensor([q.q_zero_point() for q in expected]).float())
    expected_codes = torch.stack([q.int_repr() for q in expected]).float()
    differ = codes != expected_codes
    # FBGEMM's vector code rounds a few values within float error of a tie the other way.
    assert differ.float().mean() < 1e-5 and (codes - expected_codes).abs().max() <= 1
    assert scale[0] == 0.1 and zero[0] == 0 and zero[1] == 0 and zero[2] == 255
    assert codes.min() >= 0 and codes.max() <= 255 and codes.dtype == torch.float32


def test_zero_is_exact_on_every_grid():
    rows = activation_rows()
    codes, scale, zero = quantize_activations(torch.zeros_like(rows))
    assert torch.equal((codes - zero) * scale, torch.zeros_like(rows))
    _, scale, zero = quantize_activations(rows)
    assert torch.equal(zero, zero.round()) and (scale > 0).all()


def int8_layer(out_features=96, in_features=192, bias=True) -> Int8ActivationLinear:
    torch.manual_seed(1)
    linear = nn.Linear(in_features, out_features, bias=bias)
    weight_only = WeightOnlyLinear.from_quant_linear(QuantLinear.from_linear(linear, INT8))
    return Int8ActivationLinear.from_weight_only(weight_only)


@pytest.mark.filterwarnings("ignore:.*deprecated")
@pytest.mark.skipif("avx512_vnni" not in cpu_flags(), reason=(
    "FBGEMM sums int8 products exactly only with AVX-512 VNNI; without it, its AVX2 path "
    "adds pairs of u8 x s8 products in saturating 16-bit lanes (vpmaddubsw), which clips "
    "large activations: measured up to 1.4 off on an AVX2-only AMD EPYC"))
def test_reference_product_is_fbgemms():
    """PyTorch's own int8 x int8 kernel (FBGEMM) computes the reference's numbers."""
    layer = int8_layer(bias=False)
    packed = torch.ops.quantized.linear_prepack(torch.quantize_per_channel(
        layer.dense_weight(), layer.scales.double(), torch.zeros(96, dtype=torch.long), 0,
        torch.qint8), None)
    for rows in (1, 3, 8):
        x = torch.randn(rows, layer.in_features) * 4
        codes, _, _ = quantize_activations(x)
        assert torch.equal(codes, torch.stack([torch_dynamic(r).int_repr() for r in x]).float())
        fbgemm = torch.cat([torch.ops.quantized.linear_dynamic(r, packed, False)
                            for r in x.split(1)])
        assert torch.equal(fbgemm, layer.reference_product(x))


@pytest.mark.parametrize("out_features, in_features", [(96, 192), (97, 128), (130, 576)],
                         ids=["plain loop", "VNNI loop, odd rows", "VNNI loop, SmolLM2 width"])
@pytest.mark.parametrize("rows", [1, 3, 8, 70])  # 70: three blocks of rows, the last partial
def test_kernel_is_the_reference_bit_for_bit(out_features, in_features, rows):
    layer = int8_layer(out_features, in_features, bias=False)
    x = torch.randn(rows, in_features) * torch.rand(rows, 1) * 8
    x[0] = 0  # an all-zero row: scale 0.1, zero point 0
    y = ops.int8_linear(x, layer.codes, layer.scales, layer.code_sums)
    assert y.dtype == torch.float32 and y.shape == (rows, out_features)
    assert torch.equal(y, layer.reference_product(x))
    assert torch.equal(y[0], torch.zeros(out_features))


def test_kernel_refuses_wrong_dtypes():
    layer = int8_layer()
    with pytest.raises(RuntimeError, match="x must be float32"):
        ops.int8_linear(torch.randn(1, 192).double(), layer.codes, layer.scales, layer.code_sums)


def test_layer_is_close_to_its_float_weights_and_takes_any_shape():
    layer = int8_layer()
    weight = layer.dense_weight().double()
    for shape in [(1, 1, 192), (2, 4, 192), (1, 30, 192)]:
        x = torch.randn(shape)
        y = layer(x)
        assert y.shape == (*shape[:-1], 96) and y.dtype == torch.float32
        expected = x.double() @ weight.T + layer.bias.double()
        error = (y.double() - expected).norm() / expected.norm()
        assert error < 0.01  # 8-bit activations: about 0.4% relative error here


def test_bf16_inputs_give_bf16_outputs():
    layer = int8_layer()
    x = torch.randn(1, 1, 192)
    y = layer(x.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), layer(x), atol=0.05, rtol=0.02)


def test_compiled_layer_equals_the_eager_one():
    layer = int8_layer()
    x = torch.randn(1, 1, 192)
    compiled = torch.compile(layer, dynamic=False, fullgraph=True)
    assert torch.equal(compiled(x), layer(x))


@pytest.mark.parametrize("scheme", [QuantScheme(8, False, None), QuantScheme(8, True, 64),
                                    QuantScheme(4, True, 32)],
                         ids=["zero points", "groups", "int4"])
def test_other_weight_formats_are_left_alone_or_refused(scheme):
    weight_only = WeightOnlyLinear.from_quant_linear(
        QuantLinear.from_linear(nn.Linear(128, 8), scheme))
    assert not Int8ActivationLinear.supports(weight_only)
    with pytest.raises(ValueError, match="per-channel symmetric int8"):
        Int8ActivationLinear.from_weight_only(weight_only)


def test_to_int8_activations_converts_the_model_and_its_tied_head(tmp_path):
    model, _ = tiny_pair(tmp_path, tie_word_embeddings=True)
    quantized = compact_embedding(quantize_model(model, "rtn", INT8), "int8")
    fast = to_int8_activations(copy.deepcopy(quantized))
    assert isinstance(fast.layers[0].attn.q_proj, Int8ActivationLinear)
    assert isinstance(fast.lm_head, Int8ActivationLinear)
    assert fast.lm_head.codes.data_ptr() == fast.embed_tokens.table.data_ptr()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        error = (fast(ids) - quantized(ids)).abs().max() / quantized(ids).abs().max()
    assert 0 < error < 0.05
    assert len(generate(fast, [5, 17, 99, 3], 12)) == 1


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_kernel_gives_the_reference_paths_logits_and_tokens(smollm2, tokenizer,
                                                                     monkeypatch):
    """The C++ kernel vs the float64 reference for every product of SmolLM2: the same
    logits, bit for bit, so the same greedy tokens."""
    model = to_int8_activations(compact_embedding(
        quantize_model(copy.deepcopy(smollm2), "rtn", INT8), "int8"))
    prompt = tokenizer.chat_prompt("What is a KV cache?")
    with torch.no_grad():
        kernel_logits = model(torch.tensor([prompt]))
        kernel_tokens = generate(model, prompt, 16)
        monkeypatch.setattr(Int8ActivationLinear, "forward", Int8ActivationLinear.reference_product)
        assert torch.equal(kernel_logits, model(torch.tensor([prompt])))
        assert generate(model, prompt, 16) == kernel_tokens
