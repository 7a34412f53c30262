"""GPTQ: beats round-to-nearest on correlated inputs, equals the plain OBS column loop."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from minillm.generate import generate
from minillm.quant.basic import QuantScheme, quantize
from minillm.quant.gptq import (
    HessianAccumulator,
    collect_hessians,
    fake_quantize_column,
    gptq_quantize_weight,
    group_grid,
    inverse_hessian_cholesky,
    layer_objective,
    quantize_model_gptq,
)
from minillm.quant.qlinear import QuantLinear, quantize_model_rtn
from minillm.testing import tiny_pair

SCHEMES = [QuantScheme(4, False, None), QuantScheme(4, False, 32), QuantScheme(3, False, None),
           QuantScheme(3, False, 32), QuantScheme(4, True, 32)]


def correlated_inputs(features: int = 96, tokens: int = 2048, seed: int = 0) -> torch.Tensor:
    """Inputs [tokens, features] with a far-from-identity covariance: mixed features, a few
    loud channels (like the outlier features of LLM activations)."""
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(features, features, generator=g) / features**0.5
    mixing += torch.eye(features)
    loud = torch.ones(features)
    loud[torch.randperm(features, generator=g)[:4]] = 8.0
    return (torch.randn(tokens, features, generator=g) @ mixing) * loud


def layer_problem(out: int = 48, features: int = 96, seed: int = 0):
    x = correlated_inputs(features, seed=seed).double()
    weight = torch.randn(out, features, generator=torch.Generator().manual_seed(seed + 1))
    return weight, 2 * x.T @ x / len(x), x


def obs_reference(weight, hessian, scheme, damp=0.01, act_order=False):
    """Unblocked float64 OBQ loop with the explicit inverse Hessian (GPTQ eq. 2 and 3):
    quantize a column, apply the OBS update to all weights, eliminate the column from H⁻¹."""
    w, h = weight.double().clone(), hessian.double().clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    columns = w.shape[1]
    size = min(scheme.group_size or columns, columns)
    order = (torch.argsort(h.diagonal(), descending=True, stable=True).tolist() if act_order
             else range(columns))
    static = quantize(w.float(), scheme) if act_order else None
    h_inv = torch.linalg.inv(h + damp * h.diagonal().mean() * torch.eye(columns,
                                                                         dtype=h.dtype))
    result, grids = torch.zeros_like(w), {}
    for col in order:
        group = col // size
        if static is not None:
            grids[group] = static.scales[:, group], static.zeros[:, group]
        elif col % size == 0:
            grids[group] = group_grid(w[:, col:col + size], scheme)
        scale, zero = (t.double() for t in grids[group])
        result[:, col] = fake_quantize_column(w[:, col], scale, zero, scheme)
        error = (w[:, col] - result[:, col]) / h_inv[col, col]
        w -= error[:, None] * h_inv[col][None, :]
        h_inv -= torch.outer(h_inv[:, col], h_inv[col]) / h_inv[col, col]
    return result


@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_gptq_objective_is_well_below_round_to_nearest(scheme, act_order):
    weight, hessian, _ = layer_problem()
    gptq = gptq_quantize_weight(weight, hessian, scheme, block_size=32, act_order=act_order)
    rtn = quantize(weight, scheme).dequantize()
    ratio = layer_objective(weight, gptq.dequantize(), hessian) / layer_objective(
        weight, rtn, hessian)
    assert ratio <= 0.8, f"GPTQ/RTN objective ratio {ratio:.3f}"


@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
@pytest.mark.parametrize("block_size, group_size", [(16, None), (32, 32), (16, 48), (40, 24),
                                                    (128, 40), (7, 32)])
def test_lazy_blocks_equal_the_unblocked_obs_loop(block_size, group_size, act_order):
    """Groups longer than blocks (16/48) and groups that start inside a block and end past
    it (40/24, 7/32) included; 96 columns in groups of 40 leave a shorter last group."""
    weight, hessian, _ = layer_problem()
    scheme = QuantScheme(3, False, group_size)
    expected = obs_reference(weight, hessian, scheme, act_order=act_order)
    got = gptq_quantize_weight(weight, hessian, scheme, block_size=block_size,
                               act_order=act_order)
    torch.testing.assert_close(got.dequantize().double(), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("scheme", [QuantScheme(4, False, 32), QuantScheme(3, True, None),
                                    QuantScheme(4, False, 40), QuantScheme(4, float_zero=True),
                                    QuantScheme(3, group_size=16, clip_ratio=0.9)], ids=str)
def test_diagonal_hessian_gives_round_to_nearest(scheme, act_order):
    """With uncorrelated inputs no column can compensate another: GPTQ is RTN exactly."""
    weight, _, _ = layer_problem(features=80)
    hessian = torch.diag(torch.rand(80, generator=torch.Generator().manual_seed(3)) + 0.1)
    got = gptq_quantize_weight(weight, hessian, scheme, act_order=act_order)
    rtn = quantize(weight, scheme)
    assert torch.equal(got.codes, rtn.codes)
    torch.testing.assert_close(got.scales, rtn.scales)
    torch.testing.assert_close(got.zeros, rtn.zeros)


@pytest.mark.parametrize("scheme", [QuantScheme(4, False, 32), QuantScheme(3, True, None),
                                    QuantScheme(2, False, 64), QuantScheme(8, True, 32)], ids=str)
def test_codes_stay_on_the_grid_and_round_trip_through_quant_linear(scheme):
    weight, hessian, x = layer_problem()
    quantized = gptq_quantize_weight(weight, hessian, scheme)
    if scheme.symmetric:
        q_max = 2 ** (scheme.bits - 1) - 1
        assert quantized.codes.dtype == torch.int8
        assert quantized.codes.abs().max() <= q_max
    else:
        assert quantized.codes.dtype == torch.uint8
        assert quantized.codes.max() <= 2**scheme.bits - 1
    bias = torch.randn(weight.shape[0])
    layer = QuantLinear(quantized, bias)
    torch.testing.assert_close(layer.dense_weight(), quantized.dequantize(),
                               atol=1e-4, rtol=1e-3)  # fp16 scales in storage
    inputs = x[:5].float()
    torch.testing.assert_close(layer(inputs), inputs @ layer.dense_weight().T + bias)


def test_dead_inputs_are_handled():
    weight, _, x = layer_problem()
    dead = torch.tensor([0, 5, 50, 95])
    x[:, dead] = 0.0
    hessian = 2 * x.T @ x / len(x)
    scheme = QuantScheme(4, False, 32)
    quantized = gptq_quantize_weight(weight, hessian, scheme)
    result = quantized.dequantize()
    assert torch.isfinite(result).all()
    steps = quantized.scales.repeat_interleave(32, dim=1)
    assert (result[:, dead].abs() <= steps[:, dead] / 2 + 1e-6).all()  # dead weights -> ~0
    rtn = quantize(weight, scheme).dequantize()
    assert layer_objective(weight, result, hessian) < 0.8 * layer_objective(weight, rtn,
                                                                            hessian)


def test_layer_objective_is_the_mean_output_error():
    weight, hessian, x = layer_problem()
    approx = quantize(weight, QuantScheme(3, False, None)).dequantize()
    direct = ((x @ (weight - approx).double().T) ** 2).sum(dim=1).mean()
    assert layer_objective(weight, approx, hessian) == pytest.approx(float(direct), rel=1e-9)


def test_hessian_running_average_equals_the_full_average():
    x = correlated_inputs(32, tokens=700).float()
    accumulator = HessianAccumulator(32)
    for chunk in x.split([100, 250, 1, 349]):
        accumulator.add(chunk)
    expected = 2 * x.double().T @ x.double() / len(x)
    assert accumulator.num_samples == 700
    torch.testing.assert_close(accumulator.hessian, expected, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="features"):
        accumulator.add(torch.randn(4, 31))


def test_inverse_hessian_cholesky_factor():
    _, hessian, _ = layer_problem()
    u = inverse_hessian_cholesky(hessian, damp=0.01)
    damped = hessian + 0.01 * hessian.diagonal().mean() * torch.eye(96, dtype=hessian.dtype)
    assert torch.equal(u, u.triu())
    torch.testing.assert_close(u.T @ u, torch.linalg.inv(damped), rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match="damp"):
        inverse_hessian_cholesky(torch.zeros(4, 4).index_fill_(0, torch.tensor([0]), 1), 0.0)


def test_bad_inputs_get_clear_errors():
    weight, hessian, _ = layer_problem()
    with pytest.raises(ValueError, match="per_tensor"):
        gptq_quantize_weight(weight, hessian, QuantScheme(4, per_tensor=True))
    with pytest.raises(ValueError, match=r"\[in, in\]"):
        gptq_quantize_weight(weight, hessian[:10, :10], QuantScheme(4))
    with pytest.raises(ValueError, match="NaN"):
        gptq_quantize_weight(weight, hessian * float("nan"), QuantScheme(4))
    with pytest.raises(ValueError, match="LongTensor"):
        quantize_model_gptq(nn.Module(), QuantScheme(4), windows=torch.randn(2, 8))


def output_error(model, reference, windows):
    with torch.no_grad():
        return float(((model(windows) - reference(windows)) ** 2).mean())


def test_gptq_on_the_tiny_model_beats_round_to_nearest(tmp_path):
    model, _ = tiny_pair(tmp_path)
    windows = torch.randint(0, 256, (8, 48), generator=torch.Generator().manual_seed(0))
    scheme = QuantScheme(3, False, 32)
    report = {}
    gptq = quantize_model_gptq(copy.deepcopy(model), scheme, windows=windows, block_size=16,
                               batch_size=4, progress=False, report=report)
    rtn = quantize_model_rtn(copy.deepcopy(model), scheme)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    quantized = [n for n, m in gptq.named_modules() if isinstance(m, QuantLinear)]
    assert quantized == [n for n in linears if n != "lm_head"]
    assert isinstance(gptq.lm_head, nn.Linear)
    assert sorted(report) == sorted(quantized)
    assert all(r.error < r.rtn_error for r in report.values())
    assert output_error(gptq, model, windows) < 0.7 * output_error(rtn, model, windows)
    assert len(generate(gptq, [1, 2, 3], 5)[0]) == 5


def test_layers_reading_the_same_input_share_one_hessian(tmp_path):
    from minillm.quant.calibration import blocks_with_inputs

    model, _ = tiny_pair(tmp_path)
    windows = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    _, block, inputs = next(blocks_with_inputs(model, windows, batch_size=2, progress=False))
    groups = collect_hessians(block, inputs)
    assert [names for names, _ in groups] == [
        ["attn.q_proj", "attn.k_proj", "attn.v_proj"], ["attn.o_proj"],
        ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]
    seen = []
    inputs.capture(block, lambda name, x: seen.append(x.double()) if name == "mlp.down_proj"
                   else None)
    x = torch.cat(seen)
    torch.testing.assert_close(groups[-1][1], 2 * x.T @ x / len(x), rtol=1e-5, atol=1e-6)
