"""Graded tests for chapter 04 (MHA, MQA, GQA). The library is the oracle."""

from __future__ import annotations

import pytest
import torch

from minillm.attention.naive import naive_attention
from minillm.attention.naive import repeat_kv as library_repeat_kv
from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.kv_cache import kv_cache_bytes
from minillm.model import build_attention_mask

impl = load_impl("ch04_gqa")


@pytest.mark.exercise("04.1", points=1)
@pytest.mark.parametrize("layers, kv_heads, head_dim, nbytes", [
    (32, 32, 128, 2), (80, 8, 128, 2), (30, 3, 64, 4), (1, 1, 16, 1)])
def test_kv_bytes_per_token_matches_the_library(layers, kv_heads, head_dim, nbytes):
    config = ModelConfig(num_layers=layers, num_heads=kv_heads * 2, num_kv_heads=kv_heads,
                         head_dim=head_dim)
    expected = kv_cache_bytes(config, num_tokens=1, bytes_per_value=nbytes)
    got = impl.kv_bytes_per_token(layers, kv_heads, head_dim, nbytes)
    assert type(got) is int, f"a number of bytes is an int, got {type(got).__name__}"
    assert got == expected


@pytest.mark.exercise("04.2", points=1)
@pytest.mark.parametrize("times", [1, 3, 4])
def test_repeat_kv_matches_the_library(times):
    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(times))
    out = impl.repeat_kv(x, times)
    assert out.shape == (2, 3 * times, 5, 8)
    torch.testing.assert_close(out, library_repeat_kv(x, times))
    torch.testing.assert_close(out, x.repeat_interleave(times, dim=1))


@pytest.mark.exercise("04.3", points=2)
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2), (8, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_grouped_attention_matches_naive(heads, kv_heads, causal):
    g = torch.Generator().manual_seed(heads)
    q = torch.randn(2, heads, 11, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, kv_heads, 11, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, kv_heads, 11, 16, generator=g, dtype=torch.float64)
    mask = build_attention_mask(torch.arange(11), torch.arange(11)) if causal else None
    out = impl.grouped_attention(q, k, v, causal=causal)
    torch.testing.assert_close(out, naive_attention(q, k, v, mask))


@pytest.mark.exercise("04.4", points=2)
@pytest.mark.parametrize("old, new", [(3, 1), (4, 2), (8, 8)])
def test_mean_pool_matches_the_library(old, new):
    from torch import nn

    from minillm.gqa import regroup_kv_projection

    proj = nn.Linear(24, old * 8, bias=False)
    torch.nn.init.normal_(proj.weight, generator=torch.Generator().manual_seed(old))
    out = impl.mean_pool_kv_projection(proj.weight.detach(), old, new, 8)
    assert out.shape == (new * 8, 24)
    torch.testing.assert_close(out, regroup_kv_projection(proj, old, new, 8).weight.detach())
