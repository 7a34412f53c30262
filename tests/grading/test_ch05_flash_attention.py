"""Graded tests for chapter 05 (FlashAttention). Triton runs in its interpreter on a CPU.

Oracles: the library's online-softmax step and naive attention with the model's own causal
mask (minillm.model.build_attention_mask), and torch.softmax.
"""

from __future__ import annotations

import pytest
import torch

from minillm.attention.naive import naive_attention
from minillm.attention.tiled import online_softmax_step
from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.kv_cache import KVCache
from minillm.model import Transformer, build_attention_mask

impl = load_impl("ch05_flash_attention")


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def state(*rows, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(*rows, generator=g, dtype=torch.float64)
    l = torch.rand(*rows, generator=g, dtype=torch.float64) + 0.5
    acc = torch.randn(*rows, d, generator=g, dtype=torch.float64)
    return m, l, acc


@pytest.mark.exercise("05.1", points=2)
def test_online_update_matches_the_library():
    m, l, acc = state(4)
    scores, v = randn(4, 6, seed=1), randn(6, 8, seed=2)
    for got, want in zip(impl.online_softmax_update(m, l, acc, scores, v),
                         online_softmax_step(m, l, acc, scores, v), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.exercise("05.1", points=1)
def test_online_update_with_batch_and_head_dimensions():
    m, l, acc = state(2, 3, 5)
    scores, v = randn(2, 3, 5, 6, seed=1) * 3, randn(2, 3, 6, 8, seed=2)
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


def causal_reference(q, k, v):
    """Attention of the LAST n_q positions: the model's own mask, the naive backend."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    mask = build_attention_mask(torch.arange(n_k - n_q, n_k), torch.arange(n_k))
    return naive_attention(q, k, v, mask)


@pytest.mark.exercise("05.2", points=2)
@pytest.mark.parametrize("n_q, n_k, block", [(5, 33, 8), (16, 16, 16), (1, 50, 7), (3, 5, 16)])
def test_tiled_attention_matches_softmax(n_q, n_k, block):
    q = randn(2, 3, n_q, 16, seed=n_k) * 3
    k, v = randn(2, 3, n_k, 16, seed=1), randn(2, 3, n_k, 16, seed=2)
    expected = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1) @ v
    torch.testing.assert_close(impl.tiled_attention(q, k, v, block), expected)


@pytest.mark.exercise("05.2", points=3)
@pytest.mark.parametrize("n_q, n_k, block", [
    (33, 33, 8),  # prefill: n_q = n_k, n_k not a multiple of the block
    (1, 50, 7),  # a decode step: one new query sees every key
    (5, 37, 16),  # a chunk of 5 new queries after 32 cached keys
    (4, 64, 16),  # n_k a multiple of the block
    (1, 1, 16),  # the very first token
])
def test_tiled_attention_causal_queries_are_the_last_positions(n_q, n_k, block):
    q = randn(2, 3, n_q, 16, seed=n_q)
    k, v = randn(2, 3, n_k, 16, seed=1), randn(2, 3, n_k, 16, seed=2)
    out = impl.tiled_attention(q, k, v, block, causal=True)
    assert out.shape == q.shape
    torch.testing.assert_close(out, causal_reference(q, k, v))


@pytest.mark.exercise("05.2", points=1)
def test_tiled_attention_folds_one_block_of_keys_at_a_time(monkeypatch):
    """The point of tiling: scores are made block by block, never all n_k at once."""
    widths = []

    def counting_update(m, l, acc, scores, v_block):
        widths.append(scores.shape[-1])
        return online_softmax_step(m, l, acc, scores, v_block)

    monkeypatch.setattr(impl, "online_softmax_update", counting_update)
    q, k, v = randn(2, 3, 6, 16, seed=1), randn(2, 3, 37, 16, seed=2), randn(2, 3, 37, 16)
    out = impl.tiled_attention(q, k, v, 16, causal=True)
    torch.testing.assert_close(out, causal_reference(q, k, v))
    assert widths == [16, 16, 5], "one online_softmax_update per block of keys"


@pytest.mark.exercise("05.2", points=1)
def test_tiled_attention_broadcasts_one_kv_head_over_its_query_group():
    """GQA without copies: q [b, kv_heads, groups, n_q, d] with k, v [b, kv_heads, 1, n_k, d]."""
    q = randn(2, 6, 9, 16, seed=3)
    k, v = randn(2, 2, 20, 16, seed=4), randn(2, 2, 20, 16, seed=5)
    out = impl.tiled_attention(q.view(2, 2, 3, 9, 16), k[:, :, None], v[:, :, None], 8,
                               causal=True)
    torch.testing.assert_close(out.reshape(2, 6, 9, 16), causal_reference(q, k, v))


@pytest.mark.exercise("05.2", points=1)
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_attention_survives_large_scores_in_float32(causal):
    """Scores in the hundreds: exp(score) overflows float32 unless the running max is
    subtracted, as online_softmax_update does."""
    q = randn(1, 2, 6, 16, seed=6, dtype=torch.float32) * 60
    k, v = randn(1, 2, 24, 16, seed=7, dtype=torch.float32), randn(1, 2, 24, 16, seed=8)
    out = impl.tiled_attention(q, k, v.float(), 8, causal=causal)
    expected = (causal_reference if causal else naive_attention)(q.double(), k.double(), v)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


def your_attention_backend(q, k, v, mask=None):
    """The engine's backend interface over tiled_attention: causal, GQA by broadcasting.

    The model passes its causal mask for a prefill and none for one decoded token; both
    are what causal=True computes (the new queries are the last positions)."""
    b, heads, n_q, d = q.shape
    kv_heads = k.shape[1]
    grouped = q.view(b, kv_heads, heads // kv_heads, n_q, d)
    out = impl.tiled_attention(grouped, k[:, :, None], v[:, :, None], 4, causal=True)
    return out.reshape(b, heads, n_q, d)


@pytest.mark.exercise("05.2", points=1)
def test_tiled_attention_drives_a_model_through_prefill_and_decode():
    """Your attention as the backend of a tiny GQA model: same logits as the library's."""
    config = ModelConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_layers=2,
                         num_heads=6, num_kv_heads=2, head_dim=8)
    torch.manual_seed(0)
    model = Transformer(config, attn_backend="naive").double().eval()
    ids = torch.randint(0, 64, (1, 14), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = model(ids)[0, 9:13]  # logits at positions 9..12
        for layer in model.layers:
            layer.attn.backend = your_attention_backend
        cache = KVCache(config, 1, 14, dtype=torch.float64)
        got = [model(ids[:, :10], cache)[0, -1]]  # prefill 10 tokens, then 3 decode steps
        got += [model(ids[:, t:t + 1], cache)[0, -1] for t in range(10, 13)]
    torch.testing.assert_close(torch.stack(got), expected)


@pytest.mark.exercise("05.3", points=3)
@pytest.mark.parametrize("rows, cols", [(3, 16), (5, 37), (2, 1)])
def test_triton_softmax_kernel(rows, cols):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(cols)) * 4
    torch.testing.assert_close(impl.triton_softmax(x), torch.softmax(x, dim=-1),
                               atol=1e-6, rtol=1e-5)


@pytest.mark.exercise("05.3", points=1)
def test_triton_softmax_kernel_on_large_and_negative_rows():
    """Rows far from zero: exp overflows (or underflows to 0/0) unless the max is subtracted."""
    x = torch.randn(4, 37, generator=torch.Generator().manual_seed(9)) * 4
    x += torch.tensor([[500.0], [-500.0], [90.0], [0.0]])
    out = impl.triton_softmax(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.softmax(x, dim=-1), atol=1e-6, rtol=1e-5)
