"""Sampling: filters keep what they promise, seeds reproduce, bad parameters are refused."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.sampling import (
    SamplingParams,
    apply_repetition_penalty,
    process_logits,
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


INF = float("inf")


@pytest.mark.parametrize("p", [1e-300, 1e-12, math.ulp(0.0)], ids=["1e-300", "1e-12", "ulp(0)"])
def test_a_tiny_top_p_samples_only_the_top_token(p):
    # 1e-300 and ulp(0) round to 0 in float32: every token's mass_before reaches them
    logits = random_logits()
    draws = draw(logits, SamplingParams(temperature=1.0, top_p=p, seed=0), n=200)
    assert (draws == logits.argmax(-1)).all()
    tied = torch.tensor([[1.0, 5.0, 5.0, -2.0]])  # ties for the top: one of them is drawn
    assert set(draw(tied, SamplingParams(temperature=1.0, top_p=p, seed=0), n=50)[:, 0]
               .tolist()) <= {1, 2}
    lone = torch.tensor([[-INF, 3.0, -INF]])  # every token but one already filtered out
    assert (draw(lone, SamplingParams(temperature=1.0, top_p=p, seed=0), n=50) == 1).all()


def test_top_p_of_one_keeps_every_token():
    # one dominant token: the cumulative sum is 1.0 in float32 before the others are counted
    dominant = torch.tensor([[30.0, 0.0, 0.0, -1.0]])
    for logits in (random_logits(), dominant):
        assert torch.equal(top_p_filter(logits, 1.0), logits)
        params = SamplingParams(temperature=1.0, top_p=1.0)
        assert torch.equal(process_logits(logits, params),
                           process_logits(logits, SamplingParams(temperature=1.0)))


@st.composite
def logits_rows(draw):
    """A few rows of float32 logits, some already filtered to -inf, at least one finite each."""
    vocab = draw(st.integers(1, 40))
    value = st.one_of(st.floats(-1e4, 1e4, width=32), st.just(-INF))
    row = st.lists(value, min_size=vocab, max_size=vocab).filter(lambda r: max(r) > -INF)
    return torch.tensor(draw(st.lists(row, min_size=1, max_size=4)))


@settings(max_examples=300, deadline=None)
@given(logits_rows(), st.floats(0.0, 1.0, exclude_min=True))
def test_top_p_always_keeps_the_maximum_and_a_distribution(logits, p):
    filtered = top_p_filter(logits, p)
    assert torch.equal(filtered.max(-1).values, logits.max(-1).values)
    assert ((filtered == logits) | (filtered == -INF)).all()  # tokens are kept or dropped
    probs = torch.softmax(filtered, -1)
    assert not probs.isnan().any()
    assert torch.allclose(probs.sum(-1), torch.ones(len(logits)), atol=1e-5)


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
