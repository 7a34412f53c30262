"""Graded tests for chapter 05 (FlashAttention). Triton runs in its interpreter on a CPU."""

from __future__ import annotations

import pytest
import torch

from minillm.attention.tiled import online_softmax_step
from minillm.grading import load_impl

impl = load_impl("ch05_flash_attention")


def state(rows=4, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(rows, generator=g, dtype=torch.float64)
    l = torch.rand(rows, generator=g, dtype=torch.float64) + 0.5
    acc = torch.randn(rows, d, generator=g, dtype=torch.float64)
    return m, l, acc


@pytest.mark.exercise("05.1", points=2)
def test_online_update_matches_the_library():
    m, l, acc = state()
    scores = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    v = torch.randn(6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for got, want in zip(impl.online_softmax_update(m, l, acc, scores, v),
                         online_softmax_step(m, l, acc, scores, v), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.exercise("05.1", points=1)
def test_online_update_from_empty_state_with_masked_rows():
    m = torch.full((2,), float("-inf"), dtype=torch.float64)
    l, acc = torch.zeros(2, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64)
    scores = torch.tensor([[1.0, 2.0], [float("-inf"), float("-inf")]], dtype=torch.float64)
    v = torch.ones(2, 3, dtype=torch.float64)
    m, l, acc = impl.online_softmax_update(m, l, acc, scores, v)
    assert not torch.isnan(l).any() and not torch.isnan(acc).any()
    torch.testing.assert_close(acc[0] / l[0], torch.ones(3, dtype=torch.float64))
    assert l[1] == 0


@pytest.mark.exercise("05.2", points=2)
@pytest.mark.parametrize("n_q, n_k, block", [(5, 33, 8), (16, 16, 16), (1, 50, 7)])
def test_tiled_attention_matches_softmax(n_q, n_k, block):
    g = torch.Generator().manual_seed(n_k)
    q = torch.randn(n_q, 16, generator=g, dtype=torch.float64) * 3
    k = torch.randn(n_k, 16, generator=g, dtype=torch.float64)
    v = torch.randn(n_k, 16, generator=g, dtype=torch.float64)
    expected = torch.softmax(q @ k.T / 4.0, dim=-1) @ v
    torch.testing.assert_close(impl.tiled_attention(q, k, v, block), expected)


@pytest.mark.exercise("05.3", points=3)
@pytest.mark.parametrize("rows, cols", [(3, 16), (5, 37), (2, 1)])
def test_triton_softmax_kernel(rows, cols):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(cols)) * 4
    torch.testing.assert_close(impl.triton_softmax(x), torch.softmax(x, dim=-1),
                               atol=1e-6, rtol=1e-5)
