"""Perplexity: window bookkeeping, and agreement with Hugging Face on real text."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_pair
from minillm.eval import make_windows, perplexity


@pytest.mark.parametrize("n, window, stride", [(100, 10, None), (101, 10, 4), (7, 10, None),
                                               (50, 16, 16), (33, 8, 1)])
def test_tokens_are_scored_at_most_once_and_only_with_context(n, window, stride):
    windows = make_windows(n, window, stride)
    scored = [t for w in windows for t in range(w.end - w.num_scored, w.end)]
    window_starts = {w.begin for w in windows}
    if stride is None or stride == window:  # side by side: a window's first token has no context
        assert scored == [t for t in range(n) if t not in window_starts]
    else:  # overlapping: every token after the very first is scored exactly once
        assert scored == list(range(1, n))
    assert all(w.end - w.begin <= window and w.num_scored < w.end - w.begin for w in windows)


def test_strided_windows_give_context():
    for w in make_windows(200, 32, 8)[1:]:
        assert w.end - w.num_scored - w.begin >= 32 - 8  # each scored token sees >= 24 before


@pytest.mark.parametrize("window, stride", [(0, None), (1, None), (8, 9), (8, 0)])
def test_bad_windows_raise(window, stride):
    with pytest.raises(ValueError):
        make_windows(100, window, stride)


def hf_perplexity(hf_model, tokens, windows):
    """The same windows scored by Hugging Face, by its own loss (labels=-100 mask)."""
    total, count = 0.0, 0
    for w in windows:
        ids = tokens[w.begin:w.end][None]
        labels = ids.clone()
        labels[:, :-w.num_scored] = -100
        with torch.no_grad():
            logits = hf_model(ids).logits.double()
        total += F.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=-100,
                                 reduction="sum").item()
        count += w.num_scored
    return math.exp(total / count)


@pytest.mark.parametrize("stride", [None, 24])
def test_tiny_perplexity_matches_hf(tmp_path, stride):
    ours, hf = tiny_pair(tmp_path)
    tokens = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(0))
    result = perplexity(ours, tokens, window=64, stride=stride, progress=False)
    expected = hf_perplexity(hf, tokens, make_windows(300, 64, stride))
    assert result.perplexity == pytest.approx(expected, rel=1e-5)
    assert result.num_tokens == (299 if stride else 300 - 5)  # 5 windows of 64, firsts unscored


@pytest.mark.smollm2
def test_smollm2_wikipedia_perplexity_matches_hf(smollm2, smollm2_hf, tokenizer):
    """First 8 windows of 256 tokens of the fixed Wikipedia eval split (kept short for CI)."""
    from minillm.data import load_text

    tokens = torch.tensor(tokenizer.encode(load_text("wikipedia", "eval")))[:8 * 256]
    ours = perplexity(smollm2, tokens, window=256, progress=False)
    theirs = hf_perplexity(smollm2_hf, tokens, make_windows(len(tokens), 256))
    assert ours.perplexity == pytest.approx(theirs, rel=1e-3)
    assert 5 < ours.perplexity < 60  # a 135M model on Wikipedia: sanity, not the test


@pytest.mark.smollm2
def test_smaller_attention_window_costs_perplexity(smollm2, tokenizer):
    from minillm.data import load_text

    tokens = torch.tensor(tokenizer.encode(load_text("wikipedia", "eval")))[:2 * 256]
    full = perplexity(smollm2, tokens, window=256, progress=False).perplexity
    narrow = perplexity(smollm2, tokens, window=256, attention_window=16,
                        progress=False).perplexity
    assert narrow > full * 1.1
