"""Sampling: filters keep what they promise, seeds reproduce, bad parameters are refused."""

from __future__ import annotations

import pytest
import torch

from minillm.sampling import (
    SamplingParams,
    apply_repetition_penalty,
    sample,
    top_k_filter,
    top_p_filter,
)


def random_logits(batch=4, vocab=100, seed=0):
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def draw(logits, params, n=2000):
    generator = params.make_generator()
    return torch.stack([sample(logits, params, generator) for _ in range(n)])  # [n, batch]


def test_greedy_is_argmax():
    logits = random_logits()
    assert torch.equal(sample(logits, SamplingParams()), logits.argmax(-1))


def test_top_k_never_leaves_the_top_k():
    logits = random_logits()
    k = 5
    draws = draw(logits, SamplingParams(temperature=1.5, top_k=k, seed=0))
    allowed = torch.topk(logits, k, dim=-1).indices
    for row in range(logits.shape[0]):
        assert set(draws[:, row].tolist()) <= set(allowed[row].tolist())
    assert len(set(draws[:, 0].tolist())) == k  # at temperature 1.5 all k appear in 2000 draws


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = random_logits()
    p = 0.7
    kept = top_p_filter(logits, p) > float("-inf")
    probs = torch.softmax(logits, -1)
    for row in range(logits.shape[0]):
        kept_probs = probs[row][kept[row]]
        assert kept_probs.sum() >= p  # enough mass
        assert kept_probs.sum() - kept_probs.min() < p  # but dropping the least likely is not
        assert kept_probs.min() >= probs[row][~kept[row]].max()  # and they are the most likely


def test_top_p_sampling_matches_renormalised_distribution():
    logits = random_logits(batch=1, vocab=10, seed=4)
    params = SamplingParams(temperature=1.0, top_p=0.8, seed=11)
    draws = draw(logits, params, n=20000)[:, 0]
    expected = torch.softmax(top_p_filter(logits, 0.8), -1)[0]
    observed = torch.bincount(draws, minlength=10).float() / len(draws)
    assert (observed - expected).abs().max() < 0.015  # 20k draws: std of a frequency <= 0.0035


def test_temperature_sharpens_and_flattens():
    logits = random_logits(batch=1, vocab=20, seed=5)
    top = logits.argmax().item()
    cold = (draw(logits, SamplingParams(temperature=0.2, seed=1))[:, 0] == top).float().mean()
    hot = (draw(logits, SamplingParams(temperature=5.0, seed=1))[:, 0] == top).float().mean()
    assert cold > 0.9 and hot < 0.5


def test_same_seed_same_draws_different_seed_different_draws():
    logits = random_logits()
    a = draw(logits, SamplingParams(temperature=1.0, seed=42), n=50)
    b = draw(logits, SamplingParams(temperature=1.0, seed=42), n=50)
    c = draw(logits, SamplingParams(temperature=1.0, seed=43), n=50)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_top_k_filter_keeps_exactly_k_without_ties():
    logits = random_logits()
    assert ((top_k_filter(logits, 7) > float("-inf")).sum(-1) == 7).all()


def test_repetition_penalty_lowers_seen_tokens():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    out = apply_repetition_penalty(logits, torch.tensor([[0, 1]]), 2.0)
    assert torch.equal(out, torch.tensor([[1.0, -2.0, 0.5, 3.0]]))
    greedy = SamplingParams(repetition_penalty=10.0)
    assert sample(torch.tensor([[3.0, 2.9]]), greedy, previous=torch.tensor([[0]])).item() == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
])
def test_bad_parameters_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
