"""Graded tests for chapter 03 (the KV cache). The library is the oracle."""

from __future__ import annotations

import pytest
import torch

from minillm.attention.naive import naive_attention
from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.kv_cache import KVCache
from minillm.kv_cache import kv_cache_bytes as library_kv_cache_bytes
from minillm.model import build_attention_mask

impl = load_impl("ch03_kv_cache")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.exercise("03.1", points=2)
def test_cache_append_matches_library_cache_over_several_steps():
    config = ModelConfig(num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8)
    library = KVCache(config, batch_size=2, max_len=12, dtype=torch.float64)
    cache_k, cache_v = torch.zeros(2, 2, 12, 8, dtype=torch.float64), torch.zeros(
        2, 2, 12, 8, dtype=torch.float64)
    length = 0
    for step, new in enumerate([5, 1, 1, 3]):
        k, v = randn(2, 2, new, 8, seed=step), randn(2, 2, new, 8, seed=10 + step)
        got_k, got_v = impl.cache_append(cache_k, cache_v, k, v, length)
        want_k, want_v = library.update(0, k, v)
        library.advance(new)
        length += new
        torch.testing.assert_close(got_k, want_k)
        torch.testing.assert_close(got_v, want_v)
    assert got_k.data_ptr() == cache_k.data_ptr(), "return views of the buffers, not copies"
    torch.testing.assert_close(cache_k[:, :, :length], library.keys[0, :, :, :length])


@pytest.mark.exercise("03.1", points=1)
def test_cache_append_refuses_to_overflow():
    cache = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError):
        impl.cache_append(cache, cache.clone(), torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2),
                          length=2)


@pytest.mark.exercise("03.2", points=3)
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("new, total", [(1, 9), (9, 9), (3, 10)])
def test_attention_with_cache_matches_the_model_mask(heads, kv_heads, new, total):
    q = randn(2, heads, new, 16, seed=1)
    k, v = randn(2, kv_heads, total, 16, seed=2), randn(2, kv_heads, total, 16, seed=3)
    mask = build_attention_mask(torch.arange(total - new, total), torch.arange(total))
    torch.testing.assert_close(impl.attention_with_cache(q, k, v),
                               naive_attention(q, k, v, mask))


@pytest.mark.exercise("03.3", points=1)
def test_kv_cache_bytes_llama2_7b_is_2_gib():
    assert impl.kv_cache_bytes(32, 32, 128, 4096) == 2 * 1024**3


@pytest.mark.exercise("03.3", points=1)
@pytest.mark.parametrize("seed", range(4))
def test_kv_cache_bytes_matches_the_library(seed):
    g = torch.Generator().manual_seed(seed)
    layers, kv_heads, tokens, batch = (int(torch.randint(1, 100, (1,), generator=g))
                                       for _ in range(4))
    head_dim, nbytes = [16, 64, 128, 256][seed], [1, 2, 4, 2][seed]
    config = ModelConfig(num_layers=layers, num_heads=kv_heads, num_kv_heads=kv_heads,
                         head_dim=head_dim)
    expected = library_kv_cache_bytes(config, tokens, batch, nbytes)
    assert impl.kv_cache_bytes(layers, kv_heads, head_dim, tokens, batch, nbytes) == expected
