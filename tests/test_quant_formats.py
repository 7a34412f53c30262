"""NF4, LLM.int8(), FP8 and activation outliers: formats, error bounds, modules, models."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from minillm.generate import generate
from minillm.quant.fp8 import FP8_DTYPE, FP8Linear, dequantize_fp8, quantize_fp8, quantize_model_fp8
from minillm.quant.llm_int8 import (
    Int8Linear,
    absmax_int8,
    int8_matmul,
    llm_int8_matmul,
    outlier_columns,
    quantize_model_llm_int8,
)
from minillm.quant.nf4 import (
    NF4Linear,
    dequantize_blockwise,
    double_quantize,
    nf4_levels,
    quantize_blockwise,
    quantize_model_nf4,
    scale_bits_per_parameter,
)
from minillm.quant.outliers import activation_stats, layer_inputs, outlier_features
from minillm.quant.qlinear import model_nbytes
from minillm.testing import tiny_pair

# QLoRA, appendix E (and bitsandbytes' NF4 code book), rounded to 4 decimals
PUBLISHED_NF4 = [-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0,
                 0.0796, 0.1609, 0.2461, 0.3379, 0.4407, 0.5626, 0.7230, 1.0]


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- NF4 -----------------------------------------------------------------------------------

def test_nf4_levels_match_the_published_table():
    levels = nf4_levels()
    assert levels.shape == (16,) and levels.dtype == torch.float32
    torch.testing.assert_close(levels, torch.tensor(PUBLISHED_NF4), atol=1e-4, rtol=0)
    assert (levels[1:] > levels[:-1]).all() and levels[7] == 0  # sorted, an exact zero


@pytest.mark.parametrize("block_size", [64, 16])
def test_nf4_round_trip_error_is_at_most_half_the_widest_gap(block_size):
    levels = nf4_levels()
    weight = randn(48, 96, seed=block_size) * 0.02
    codes, absmax = quantize_blockwise(weight, levels, block_size)
    restored = dequantize_blockwise(codes, absmax, levels, weight.shape)
    half_gap = (levels[1:] - levels[:-1]).max() / 2  # 0.152, between -1 and -0.696
    bound = (absmax[:, None] * half_gap).expand(-1, block_size).reshape(weight.shape)
    assert ((restored - weight).abs() <= bound + 1e-7).all()
    assert (restored.abs().reshape(-1, block_size).amax(1) == absmax).all()  # ±1 is a level


def test_nf4_beats_uniform_4bit_on_normal_weights():
    weight = randn(128, 512, seed=1)
    def mse(levels):
        codes, absmax = quantize_blockwise(weight, levels, 64)
        return (dequantize_blockwise(codes, absmax, levels, weight.shape) - weight).pow(2).mean()
    assert mse(nf4_levels()) < 0.9 * mse(torch.linspace(-1, 1, 16))  # measured: 0.85x


def test_a_short_last_block_and_an_odd_weight_survive():
    weight = randn(7, 9, seed=2)  # 63 weights: a short last block and an odd count to pack
    layer = NF4Linear(weight, block_size=16, double_quant=False)
    codes, absmax = quantize_blockwise(weight, nf4_levels(), 16)
    torch.testing.assert_close(layer.dense_weight(),
                               dequantize_blockwise(codes, absmax, nf4_levels(), weight.shape))


def test_double_quantization_is_accurate_and_saves_bits():
    absmax = quantize_blockwise(randn(256, 1024, seed=3) * 0.02, nf4_levels(), 64)[1]
    dq = double_quantize(absmax)
    assert dq.codes.dtype == torch.int8 and dq.scales.numel() == absmax.numel() // 256
    error = (dq.dequantize() - absmax).abs()
    step = dq.scales.repeat_interleave(256)
    assert (error <= step / 2 + 1e-9).all()  # Δ/2 of the second-level grid
    assert (error / absmax).max() < 0.01  # under 1% of any constant
    # bits the constants add per parameter: measured from the buffers vs the paper's figures
    layer = nn.Linear(1024, 256, bias=False)
    plain, double = (NF4Linear.from_linear(layer, 64, dq) for dq in (False, True))
    def constant_bits(m):
        return 8 * sum(b.nbytes for n, b in m.named_buffers() if n != "codes") / 256 / 1024
    assert constant_bits(plain) == pytest.approx(0.5) == scale_bits_per_parameter(64, False)
    assert constant_bits(double) == pytest.approx(0.127, abs=1e-3)
    assert scale_bits_per_parameter(64, True) == pytest.approx(0.127, abs=1e-3)


# --- LLM.int8() ----------------------------------------------------------------------------

def test_int8_matmul_is_exact():
    g = torch.Generator().manual_seed(4)
    a = torch.randint(-127, 128, (6, 3000), generator=g, dtype=torch.int8)
    b = torch.randint(-127, 128, (5, 3000), generator=g, dtype=torch.int8)
    b[0] = 127
    a[0] = 127  # 3000 · 127² = 4.8e7 > 2^24: one fp32 dot product would not be exact
    assert torch.equal(int8_matmul(a, b), (a.long() @ b.long().T).double())
    with pytest.raises(ValueError, match="int8"):
        int8_matmul(a.float(), b)


def planted_outliers(tokens=32, features=64, dims=(3, 40), magnitude=40.0, seed=5):
    x = randn(tokens, features, seed=seed)
    for d in dims:
        x[:, d] += magnitude * randn(tokens, seed=seed + d).sign()
    return x


def test_llm_int8_error_is_within_the_activation_rounding_bound():
    x, weight = planted_outliers(), randn(24, 64, seed=6) * 0.1
    layer = Int8Linear(weight, threshold=6.0)
    w = layer.dense_weight().double()
    outliers = outlier_columns(x, 6.0)
    assert outliers.nonzero().flatten().tolist() == [3, 40]
    x_scales = absmax_int8(x.masked_fill(outliers, 0))[1].double()
    # int8 part exact, outliers in fp: only rounding the regular activations (≤ s_x/2) errs
    bound = x_scales[:, None] / 2 * w[:, ~outliers].abs().sum(1)[None, :]
    error = (layer(x).double() - x.double() @ w.T).abs()
    assert (error <= bound + 1e-4).all()


def test_decomposition_beats_plain_w8a8_on_outlier_dims():
    x, weight = planted_outliers(), randn(24, 64, seed=7) * 0.1
    reference = x @ Int8Linear(weight).dense_weight().T  # same int8 weight in both
    def mse(threshold):
        return (Int8Linear(weight, threshold=threshold)(x) - reference).pow(2).mean().item()
    assert mse(6.0) * 20 < mse(None)  # measured here: about 250x


def test_w8a8_is_vector_wise_int8_times_the_scale_outer_product():
    x, weight = randn(8, 32, seed=8) * 3, randn(16, 32, seed=9)
    layer = Int8Linear(weight, threshold=None)
    x_codes, x_scales = absmax_int8(x)
    expected = (x_codes.double() @ layer.weight_codes.double().T) * x_scales.double()[:, None] \
        * layer.weight_scales.double()[None, :]
    torch.testing.assert_close(layer(x).double(), expected, atol=1e-5, rtol=1e-6)
    w_error = (layer.dense_weight() - weight).abs()
    assert (w_error <= layer.weight_scales.float()[:, None] / 2 + 1e-6).all()
    assert llm_int8_matmul(x, layer.weight_codes, layer.weight_scales, None).shape == (8, 16)


# --- FP8 -----------------------------------------------------------------------------------

def test_fp8_values_are_representable_and_fill_the_range():
    weight = randn(16, 80, seed=10) * 0.05
    weight[2] *= 0.2  # a smaller row uses the whole range too (its fp16 scale is normal)
    values, scales = quantize_fp8(weight)
    assert values.dtype == FP8_DTYPE and scales.dtype == torch.float16
    restored = dequantize_fp8(values, scales)
    grid = restored / scales.float()[:, None]
    assert torch.equal(grid.to(FP8_DTYPE).float(), grid)  # every value is an E4M3 number
    assert (values.float().abs().amax(1) == 448).all()
    # round to nearest with 3 mantissa bits: relative error ≤ 2^-4 (above the subnormals)
    bound = 2**-4 * weight.abs() + 2**-10 * scales.float()[:, None]
    assert ((restored - weight).abs() <= bound).all()


# --- modules and models --------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda linear: NF4Linear.from_linear(linear, 64, double_quant=True),
    lambda linear: NF4Linear.from_linear(linear, 32, double_quant=False),
    FP8Linear.from_linear,
], ids=["nf4-dq", "nf4", "fp8"])
def test_module_equals_the_dequantized_weight_matmul(make):
    torch.manual_seed(0)
    linear = nn.Linear(128, 48, bias=True)
    module = make(linear)
    x = torch.randn(2, 5, 128)
    torch.testing.assert_close(module(x), x @ module.dense_weight().T + linear.bias)
    assert (module.dense_weight() - linear.weight).abs().max() < 0.2 * \
        linear.weight.abs().max()


@pytest.mark.parametrize("transform, layer_type", [
    (quantize_model_nf4, NF4Linear),
    (quantize_model_llm_int8, Int8Linear),
    (lambda m: quantize_model_llm_int8(m, threshold=None), Int8Linear),
    (quantize_model_fp8, FP8Linear),
], ids=["nf4", "llm-int8", "w8a8", "fp8"])
def test_transformed_tiny_model_is_smaller_close_and_generates(tmp_path, transform, layer_type):
    model, _ = tiny_pair(tmp_path)
    before = model_nbytes(model)
    quantized = transform(copy.deepcopy(model))
    assert isinstance(quantized.layers[1].attn.k_proj, layer_type)
    assert isinstance(quantized.lm_head, nn.Linear)  # skipped, as quantize_model does
    assert not any(isinstance(m, nn.Linear) for m in quantized.layers.modules())
    assert model_nbytes(quantized) < 0.8 * before
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(quantized(ids), model(ids), atol=0.1, rtol=0.1)
    assert len(generate(quantized, [1, 2, 3], 5)[0]) == 5


def test_bad_thresholds_and_blocks_are_rejected():
    with pytest.raises(ValueError, match="threshold"):
        Int8Linear(randn(4, 8), threshold=0)
    with pytest.raises(ValueError, match="block_size"):
        NF4Linear(randn(4, 8), block_size=0)


# --- activation outliers -------------------------------------------------------------------

def test_activation_stats_find_a_planted_outlier_dimension(tmp_path):
    model, _ = tiny_pair(tmp_path)
    with torch.no_grad():
        for block in model.layers:  # dimension 5 of every attention input becomes huge
            block.attn_norm.weight[5] = 200.0
    windows = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(1))
    stats = activation_stats(model, windows, threshold=6.0, batch_size=2, progress=False)
    assert len(stats.max_abs) == 2 * 7 and stats.num_tokens == 48
    features = outlier_features(stats, kinds=("attn.q_proj",))
    assert features.dims.tolist()[0] == 5 and features.layer_counts[5] == 2
    assert features.num_inputs == 2
    assert stats.max_abs_matrix("attn.q_proj").shape == (2, 64)
    # independent check of one layer's statistics: its input when the whole model runs
    inputs = layer_inputs(model, windows, "layers.1.mlp.down_proj")
    assert inputs.shape == (48, 128)
    torch.testing.assert_close(stats.max_abs["layers.1.mlp.down_proj"],
                               inputs.abs().amax(0), atol=1e-4, rtol=1e-4)
    assert torch.equal(stats.count_over["layers.1.mlp.down_proj"],
                       (inputs.abs() >= 6.0).sum(0))
    with pytest.raises(ValueError, match="no layers"):
        outlier_features(stats, kinds=("attn.nothing",))
    with pytest.raises(ValueError, match="no layer"):
        layer_inputs(model, windows, "layers.9.mlp.down_proj")
