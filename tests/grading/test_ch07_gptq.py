"""Graded tests for chapter 07 (GPTQ). The library (minillm.quant.gptq) is the oracle."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from minillm.grading import load_impl
from minillm.quant import gptq
from minillm.quant.basic import QuantScheme

impl = load_impl("ch07_gptq")


def layer_problem(out: int = 24, features: int = 64, tokens: int = 512, seed: int = 0):
    """A weight and the Hessian of correlated inputs (mixed features, a few loud ones)."""
    g = torch.Generator().manual_seed(seed)
    mixing = torch.eye(features) + torch.randn(features, features, generator=g) / features**0.5
    x = (torch.randn(tokens, features, generator=g) @ mixing).double()
    x[:, :3] *= 6
    weight = torch.randn(out, features, generator=g)
    return weight, 2 * x.T @ x / tokens, x


@pytest.mark.exercise("07.1", points=1)
@pytest.mark.parametrize("sizes", [[512], [100, 300, 112], [1, 511]])
def test_accumulate_hessian_matches_the_library(sizes):
    _, _, x = layer_problem()
    hessian, seen = torch.zeros(64, 64, dtype=torch.float64), 0
    library = gptq.HessianAccumulator(64)
    for chunk in x.float().split(sizes):
        hessian, seen = impl.accumulate_hessian(hessian, seen, chunk)
        library.add(chunk)
    assert seen == library.num_samples == 512
    assert hessian.dtype == torch.float64
    torch.testing.assert_close(hessian, library.hessian, rtol=1e-5, atol=1e-5)
    exact = 2 * x.float().double().T @ x.float().double() / 512  # the inputs seen, in float64
    torch.testing.assert_close(hessian, exact, rtol=1e-10, atol=1e-10,
                               msg="accumulate in float64: float32 products lose digits")


@pytest.mark.exercise("07.2", points=1)
@pytest.mark.parametrize("damp", [0.01, 0.1])
def test_inverse_hessian_cholesky_matches_the_library(damp):
    _, hessian, _ = layer_problem()
    u = impl.inverse_hessian_cholesky(hessian, damp)
    assert torch.equal(u, u.triu()), "U must be upper triangular"
    torch.testing.assert_close(u.double(), gptq.inverse_hessian_cholesky(hessian, damp))


@pytest.mark.exercise("07.3", points=2)
@pytest.mark.parametrize("i", [0, 5, 14])
def test_column_step_matches_the_library(i):
    weight, hessian, _ = layer_problem()
    u = gptq.inverse_hessian_cholesky(hessian)[16:32, 16:32]
    block = weight[:, 16:32].double()
    scheme = QuantScheme(3, False, None)
    scale, zero = (t.double() for t in gptq.group_grid(weight.double(), scheme))
    quantize_column = partial(gptq.fake_quantize_column, scale=scale, zero=zero, scheme=scheme)
    q, updated = impl.gptq_column_step(block.clone(), i, u[i], quantize_column)
    expected_q, expected = gptq.gptq_column_step(block.clone(), i, u[i], quantize_column)
    torch.testing.assert_close(q, expected_q)
    torch.testing.assert_close(updated, expected)
    assert not torch.equal(updated[:, i + 1:], block[:, i + 1:]), "later columns must move"


@pytest.mark.exercise("07.4", points=2)
@pytest.mark.parametrize("scheme", [QuantScheme(4, False, None), QuantScheme(3, False, 16),
                                    QuantScheme(4, True, 48)], ids=str)
def test_unblocked_gptq_matches_the_library(scheme):
    weight, hessian, _ = layer_problem()
    yours = impl.gptq_unblocked(weight, hessian, scheme)
    library = gptq.gptq_quantize_weight(weight, hessian, scheme, block_size=32).dequantize()
    torch.testing.assert_close(yours.double(), library.double(), atol=1e-6, rtol=1e-5)
