"""Graded tests for chapter 03 (the KV cache). The minillm library is the oracle."""

from __future__ import annotations

import pytest
import torch

from minillm.attention.naive import naive_attention
from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.kv_cache import KVCache
from minillm.kv_cache import kv_cache_bytes as library_kv_cache_bytes
from minillm.model import Transformer, build_attention_mask

impl = load_impl("ch03_kv_cache")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.exercise("03.1", points=2)
def test_cache_append_matches_the_library_cache():
    """A prefill of 5 tokens, then decode steps of 1, 1 and a chunk of 3, into 12 slots."""
    config = ModelConfig(num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8)
    library = KVCache(config, batch_size=2, max_len=12, dtype=torch.float64)
    cache_k = torch.zeros(2, 2, 12, 8, dtype=torch.float64)
    cache_v = torch.zeros_like(cache_k)
    length = 0
    for step, new in enumerate([5, 1, 1, 3]):
        k, v = randn(2, 2, new, 8, seed=step), randn(2, 2, new, 8, seed=100 + step)
        got_k, got_v = impl.cache_append(cache_k, cache_v, k, v, length)
        want_k, want_v = library.update(0, k, v)
        library.advance(new)
        length += new
        assert got_k.shape == (2, 2, length, 8)
        torch.testing.assert_close(got_k, want_k)
        torch.testing.assert_close(got_v, want_v)
    torch.testing.assert_close(cache_k, library.keys[0], msg="write into the buffers in place")
    torch.testing.assert_close(cache_v, library.values[0], msg="write into the buffers in place")


@pytest.mark.exercise("03.1", points=1)
def test_cache_append_returns_views_not_copies():
    cache_k, cache_v = torch.zeros(1, 3, 6, 4), torch.zeros(1, 3, 6, 4)
    got_k, got_v = impl.cache_append(cache_k, cache_v, torch.ones(1, 3, 2, 4),
                                     torch.ones(1, 3, 2, 4), length=0)
    assert got_k.data_ptr() == cache_k.data_ptr() and got_v.data_ptr() == cache_v.data_ptr(), \
        "return slices of the buffers (views), not new tensors"


@pytest.mark.exercise("03.1", points=1)
def test_cache_append_fills_to_the_last_slot_then_refuses_to_overflow():
    cache_k, cache_v = torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2)
    new = torch.ones(1, 1, 2, 2)
    got_k, _ = impl.cache_append(cache_k, cache_v, new, new, length=2)  # exactly full: fine
    assert got_k.shape[2] == 4
    with pytest.raises(ValueError):
        impl.cache_append(cache_k, cache_v, new[:, :, :1], new[:, :, :1], length=4)


@pytest.mark.exercise("03.2", points=3)
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2)])  # MHA and GQA with 3 groups
@pytest.mark.parametrize("new, total", [(1, 9), (9, 9), (4, 11)])  # decode, prefill, chunk
def test_attention_with_cache_matches_the_model_mask(heads, kv_heads, new, total):
    q = randn(2, heads, new, 16, seed=1)
    k, v = randn(2, kv_heads, total, 16, seed=2), randn(2, kv_heads, total, 16, seed=3)
    mask = build_attention_mask(torch.arange(total - new, total), torch.arange(total))
    out = impl.attention_with_cache(q, k, v)
    assert out.shape == (2, heads, new, 16)
    torch.testing.assert_close(out, naive_attention(q, k, v, mask))


@pytest.mark.exercise("03.2", points=1)
def test_attention_with_cache_drives_a_model_through_prefill_and_decode():
    """Your attention as the backend of a tiny random model: same logits as the library's."""
    config = ModelConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_layers=2,
                         num_heads=6, num_kv_heads=2, head_dim=8)
    torch.manual_seed(0)
    model = Transformer(config, attn_backend="naive").double().eval()
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = model(ids)[0, 5:9]  # logits at positions 5..8
        for layer in model.layers:
            layer.attn.backend = lambda q, k, v, mask: impl.attention_with_cache(q, k, v)
        cache = KVCache(config, 1, 10, dtype=torch.float64)
        got = [model(ids[:, :6], cache)[0, -1]]  # prefill 6 tokens, then 3 decode steps
        got += [model(ids[:, t:t + 1], cache)[0, -1] for t in range(6, 9)]
    torch.testing.assert_close(torch.stack(got), expected)


@pytest.mark.exercise("03.3", points=1)
def test_kv_cache_bytes_llama2_7b_is_2_gib():
    got = impl.kv_cache_bytes(32, 32, 128, 4096)
    assert type(got) is int, f"a number of bytes is an int, got {type(got).__name__}"
    assert got == 2 * 1024**3


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
    got = impl.kv_cache_bytes(layers, kv_heads, head_dim, tokens, batch, nbytes)
    assert type(got) is int and got == expected


@pytest.mark.exercise("03.3", points=1)
def test_kv_cache_bytes_equals_an_allocated_smollm2_cache():
    config = ModelConfig()  # SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64
    cache = KVCache(config, batch_size=2, max_len=100, dtype=torch.float32)
    assert impl.kv_cache_bytes(30, 3, 64, 100, batch_size=2, bytes_per_value=4) == cache.nbytes()


@pytest.mark.exercise("03.4", points=2)
@pytest.mark.parametrize("new, total, window", [
    (9, 9, 3), (1, 9, 4), (4, 11, 2), (6, 6, 1), (5, 8, 100), (7, 7, None)])
def test_sliding_window_mask_matches_the_model(new, total, window):
    expected = build_attention_mask(torch.arange(total - new, total), torch.arange(total),
                                    window=window)[0, 0]
    got = impl.sliding_window_mask(new, total, window)
    assert got.dtype == torch.bool and got.shape == (new, total)
    assert torch.equal(got, expected)
