"""Graded tests for chapter 08 (AWQ). The library (minillm.quant.awq) is the oracle."""

from __future__ import annotations

import pytest
import torch

from minillm.grading import load_impl
from minillm.model import RMSNorm
from minillm.quant.awq import InputStats, fold_into_norm, search_scales
from minillm.quant.basic import QuantScheme, fake_quantize

impl = load_impl("ch08_awq")


def planted(seed: int, out: int = 48, inp: int = 128, tokens: int = 256,
            dtype=torch.float64):
    """Weights and inputs with a few salient input channels (10x to 40x the others)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, inp, generator=g, dtype=dtype)
    x = torch.randn(tokens, inp, generator=g, dtype=dtype)
    x[:, torch.randperm(inp, generator=g)[:3]] *= torch.tensor([10.0, 25.0, 40.0], dtype=dtype)
    return weight, x


@pytest.mark.exercise("08.1", points=1)
def test_activation_magnitude_weighs_every_token_equally():
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(2, 5, 16, generator=g), torch.randn(7, 16, generator=g) * 3,
               torch.randn(1, 1, 16, generator=g) - 2]
    stats = InputStats()
    for batch in batches:
        stats.add(batch)
    out = impl.activation_magnitude(batches)
    assert out.shape == (16,)
    torch.testing.assert_close(out, stats.mean_abs)


@pytest.mark.exercise("08.2", points=2)
@pytest.mark.parametrize("scheme, grid", [(QuantScheme(4, False, 32), 20),
                                          (QuantScheme(3, False, 64), 10),
                                          (QuantScheme(3, True, 16), 7)],
                         ids=["4bit-asym-g32", "3bit-asym-g64", "3bit-sym-g16"])
def test_search_scales_matches_the_library(scheme, grid):
    weight, x = planted(seed=grid)
    reference = search_scales(weight, x, scheme, grid)
    scales, alpha = impl.search_scales(weight, x, lambda w: fake_quantize(w, scheme), grid)
    assert alpha == pytest.approx(reference.alpha)
    torch.testing.assert_close(scales, reference.scales)


@pytest.mark.exercise("08.2", points=1)
def test_search_scales_floors_dead_channels():
    weight, x = planted(seed=5)
    x[:, [7, 90]] = 0  # channels that never fire: s_X = 0, and 0 ** alpha = 0
    scheme = QuantScheme(4, False, 32)
    reference = search_scales(weight, x, scheme, grid=10)
    scales, alpha = impl.search_scales(weight, x, lambda w: fake_quantize(w, scheme), 10)
    assert torch.isfinite(scales).all() and alpha == pytest.approx(reference.alpha)
    torch.testing.assert_close(scales, reference.scales)


@pytest.mark.exercise("08.2", points=1)
def test_search_scales_keeps_the_first_of_equal_errors():
    """A quantizer that zeroes every weight makes every alpha equally bad: keep alpha = 0."""
    weight, x = planted(seed=6)
    scales, alpha = impl.search_scales(weight, x, torch.zeros_like, grid=10)
    assert alpha == 0
    torch.testing.assert_close(scales, torch.ones_like(scales))


@pytest.mark.exercise("08.3", points=1)
def test_fold_scales_leaves_the_outputs_unchanged():
    g = torch.Generator().manual_seed(3)
    norm = RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(24, generator=g))
    weights = [torch.randn(n, 24, generator=g) for n in (24, 8, 8)]
    scales = torch.exp(torch.randn(24, generator=g))
    x = torch.randn(5, 24, generator=g)
    before = [w.clone() for w in weights]
    norm_before = norm.weight.detach().clone()

    new_norm, new_weights = impl.fold_scales(norm.weight.detach(), weights, scales)

    torch.testing.assert_close(norm.weight.detach(), norm_before)  # arguments untouched
    for w, b in zip(weights, before, strict=True):
        torch.testing.assert_close(w, b)
    for w, new in zip(weights, new_weights, strict=True):  # the linears now see scaled columns
        torch.testing.assert_close(new, w * scales)
    folded = RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        folded.weight.copy_(new_norm)
        for w, new in zip(weights, new_weights, strict=True):
            torch.testing.assert_close(folded(x) @ new.T, norm(x) @ w.T, atol=1e-5, rtol=1e-5)


@pytest.mark.exercise("08.3", points=1)
def test_fold_scales_matches_the_library():
    from torch import nn

    g = torch.Generator().manual_seed(4)
    norm = RMSNorm(16, eps=1e-5)
    linears = [nn.Linear(16, 12, bias=False), nn.Linear(16, 4, bias=False)]
    for linear in linears:
        nn.init.normal_(linear.weight, generator=g)
    scales = torch.exp(torch.randn(16, generator=g))
    new_norm, new_weights = impl.fold_scales(norm.weight.detach(),
                                             [lin.weight.detach() for lin in linears], scales)
    fold_into_norm(norm, linears, scales)
    torch.testing.assert_close(new_norm, norm.weight.detach())
    for new, linear in zip(new_weights, linears, strict=True):
        torch.testing.assert_close(new, linear.weight.detach())
