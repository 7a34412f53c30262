"""Attention backends against a float64 reference: naive, sdpa, tiled, and the Triton kernel.

The Triton kernel runs under TRITON_INTERPRET=1 on a CPU (set in conftest.py).
"""

from __future__ import annotations

import pytest
import torch

from minillm.attention import get_backend
from minillm.attention.naive import naive_attention
from minillm.attention.tiled import online_softmax_step, tiled_attention_with_lse
from minillm.generate import generate
from minillm.model import build_attention_mask
from minillm.testing import tiny_pair


def reference(q, k, v, causal=False, mask=None):
    """Float64 attention and log-sum-exp, written out in full."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    q_len, kv_len = q.shape[2], k.shape[2]
    if causal:
        future = torch.ones(q_len, kv_len, dtype=torch.bool).triu(kv_len - q_len + 1)
        scores = scores.masked_fill(future, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def inputs(b, heads, kv_heads, q_len, kv_len, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, q_len, d, generator=g).to(dtype)
    k = torch.randn(b, kv_heads, kv_len, d, generator=g).to(dtype)
    v = torch.randn(b, kv_heads, kv_len, d, generator=g).to(dtype)
    return q, k, v


def test_online_softmax_equals_softmax_in_one_go():
    scores = torch.randn(3, 50, dtype=torch.float64) * 5
    v = torch.randn(50, 4, dtype=torch.float64)
    m = torch.full((3,), float("-inf"), dtype=torch.float64)
    l, acc = torch.zeros(3, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64)
    for start in range(0, 50, 7):
        m, l, acc = online_softmax_step(m, l, acc, scores[:, start:start + 7], v[start:start + 7])
    torch.testing.assert_close(acc / l[:, None], torch.softmax(scores, -1) @ v)
    torch.testing.assert_close(m + l.log(), torch.logsumexp(scores, -1))


SHAPES = [  # heads, kv_heads (GQA ratio 1, 3, 4), q_len, kv_len, head_dim
    (4, 4, 37, 37, 64), (6, 2, 50, 83, 64), (8, 2, 1, 70, 128), (3, 1, 65, 65, 128),
]


@pytest.mark.parametrize("heads, kv_heads, q_len, kv_len, d", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_matches_reference(heads, kv_heads, q_len, kv_len, d, causal):
    q, k, v = inputs(2, heads, kv_heads, q_len, kv_len, d, torch.float64)
    out, lse = tiled_attention_with_lse(q, k, v, causal=causal, block_q=16, block_k=24)
    ref_out, ref_lse = reference(q, k, v, causal)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)


@pytest.mark.parametrize("heads, kv_heads, q_len, kv_len, d", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_triton_kernel_matches_reference_fp32(heads, kv_heads, q_len, kv_len, d, causal):
    from minillm.kernels.flash_attention import flash_attention

    q, k, v = inputs(2, heads, kv_heads, q_len, kv_len, d)
    out, lse = flash_attention(q, k, v, causal=causal, block_m=32, block_n=32)
    ref_out, ref_lse = reference(q, k, v, causal)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_triton_kernel_matches_reference_fp16(causal):
    from minillm.kernels.flash_attention import flash_attention

    q, k, v = inputs(1, 6, 2, 45, 77, 64, torch.float16)
    out, lse = flash_attention(q, k, v, causal=causal, block_m=32, block_n=32)
    ref_out, ref_lse = reference(q, k, v, causal)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double(), ref_out, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-3, rtol=1e-3)


def test_triton_kernel_with_padding_and_window_mask():
    from minillm.kernels.flash_attention import flash_attention

    padding = torch.ones(2, 90, dtype=torch.long)
    padding[0, :13] = 0
    mask = build_attention_mask(torch.arange(30, 90), torch.arange(90), padding, window=25)
    q, k, v = inputs(2, 6, 3, 60, 90, 64)
    out, _ = flash_attention(q, k, v, mask=mask, block_m=32, block_n=32)
    torch.testing.assert_close(out.double(), reference(q, k, v, mask=mask)[0],
                               atol=1e-4, rtol=1e-4)


def test_triton_kernel_rejects_bad_shapes():
    from minillm.kernels.flash_attention import flash_attention

    q, k, v = inputs(1, 5, 2, 8, 8, 64)
    with pytest.raises(ValueError, match="share"):
        flash_attention(q, k, v)
    q, k, v = inputs(1, 4, 2, 8, 8, 48)
    with pytest.raises(ValueError, match="power of two"):
        flash_attention(q, k, v)


@pytest.mark.parametrize("backend", ["naive", "sdpa", "tiled", "triton"])
def test_backends_match_naive_with_model_masks(backend):
    padding = torch.ones(2, 40, dtype=torch.long)
    padding[1, :9] = 0
    mask = build_attention_mask(torch.arange(10, 40), torch.arange(40), padding)
    q, k, v = inputs(2, 6, 2, 30, 40, 64)
    torch.testing.assert_close(get_backend(backend)(q, k, v, mask),
                               naive_attention(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_unknown_backend_lists_the_choices():
    with pytest.raises(ValueError, match="naive, sdpa, tiled, triton"):
        get_backend("fast")


@pytest.mark.parametrize("backend", ["naive", "tiled", "triton"])
def test_every_backend_generates_the_same_tokens_tiny(tmp_path, backend):
    model, _ = tiny_pair(tmp_path)
    prompts = [[5, 17, 99, 3, 42, 7, 8], [1, 2]]
    expected = generate(model, prompts, 10)
    assert generate(model.set_attention_backend(backend), prompts, 10) == expected


@pytest.mark.smollm2
@pytest.mark.parametrize("backend", ["naive", "tiled", "triton"])
def test_every_backend_generates_the_same_tokens_smollm2(smollm2, tokenizer, backend):
    prompt = tokenizer.chat_prompt("Name a planet.")
    expected = generate(smollm2.set_attention_backend("sdpa"), prompt, 8)
    try:
        assert generate(smollm2.set_attention_backend(backend), prompt, 8) == expected
    finally:
        smollm2.set_attention_backend("sdpa")
