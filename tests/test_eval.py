"""Perplexity: window bookkeeping, and agreement with Hugging Face on real text."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from minillm.eval import make_windows, perplexity
from minillm.testing import tiny_pair


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


class ByteTokenizer:
    """One token per UTF-8 byte: a stand-in tokenizer for the slice tests."""

    def encode(self, text):
        return list(text.encode())


def alphabet(num_tokens: int) -> str:
    return "".join(chr(ord("a") + i % 26) for i in range(num_tokens))


@pytest.fixture
def split_text(monkeypatch):
    """Call it with a text: every corpus split then reads as that text."""
    import minillm.eval

    return lambda text: monkeypatch.setattr(minillm.eval, "load_text", lambda corpus, split: text)


def test_slice_windows_are_evenly_spaced_and_deterministic(split_text):
    from minillm.eval import EvalSlice, eval_tokens

    split_text(alphabet(10_000))  # 100 windows of 100 tokens
    piece = EvalSlice("test-4x100", "wikipedia", "eval", window=100, num_windows=4)
    tokens = eval_tokens(ByteTokenizer(), piece)
    assert tokens.shape == (400,) and torch.equal(tokens, eval_tokens(ByteTokenizer(), piece))
    stream = torch.tensor(ByteTokenizer().encode(alphabet(10_000)))
    starts = [0, 2500, 5000, 7500]  # windows 0, 25, 50 and 75
    assert torch.equal(tokens, torch.cat([stream[s:s + 100] for s in starts]))


def test_short_slice_is_every_second_window_of_the_full_one(split_text):
    from minillm.eval import WIKI_EVAL, WIKI_EVAL_SHORT, eval_tokens

    split_text(alphabet(60_000))  # 117 windows of 512 tokens
    full = eval_tokens(ByteTokenizer(), WIKI_EVAL).view(WIKI_EVAL.num_windows, -1)
    short = eval_tokens(ByteTokenizer(), WIKI_EVAL_SHORT).view(WIKI_EVAL_SHORT.num_windows, -1)
    assert WIKI_EVAL_SHORT.window == WIKI_EVAL.window
    assert torch.equal(short, full[::2])


def test_slice_longer_than_the_split_raises(split_text):
    from minillm.eval import EvalSlice, eval_tokens

    split_text(alphabet(10_000))
    with pytest.raises(ValueError, match="needs 200 windows of 100 tokens; the split has 100"):
        eval_tokens(ByteTokenizer(), EvalSlice("big", "wikipedia", "eval", 100, 200))


def test_evaluate_is_perplexity_on_the_slice_tokens(tmp_path, split_text):
    from minillm.eval import EvalSlice, eval_tokens, evaluate

    split_text(alphabet(1_000))
    model, _ = tiny_pair(tmp_path)
    piece = EvalSlice("test-3x64", "wikipedia", "eval", window=64, num_windows=3)
    result = evaluate(model, ByteTokenizer(), piece, progress=False)
    expected = perplexity(model, eval_tokens(ByteTokenizer(), piece), window=64, progress=False)
    assert result == expected
    assert result.num_windows == 3 and result.num_tokens == 3 * 63  # no overlap


@pytest.mark.smollm2
def test_wiki_eval_slice_samples_the_whole_split(tokenizer):
    from minillm.data import load_text
    from minillm.eval import WIKI_EVAL, eval_tokens

    tokens = eval_tokens(tokenizer, WIKI_EVAL)
    stream = torch.tensor(tokenizer.encode(load_text("wikipedia", "eval")))
    assert tokens.shape == (WIKI_EVAL.num_tokens,)
    assert torch.equal(tokens[:512], stream[:512])  # the first window opens the split
    last = (WIKI_EVAL.num_windows - 1) * (len(stream) // 512) // WIKI_EVAL.num_windows
    assert torch.equal(tokens[-512:], stream[512 * last:512 * (last + 1)])
    assert 512 * last > 0.8 * len(stream)  # ... and the last one is near its end
