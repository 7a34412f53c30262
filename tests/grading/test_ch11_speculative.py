"""Graded tests for chapter 11 (speculative decoding).

Oracles: the library's ``verify`` / ``verify_greedy`` / ``expected_tokens_per_call``, the
target distribution p itself (200k seeded draws), caches filled from scratch, and plain
``generate`` for speculative runs on a tiny random model.
"""

from __future__ import annotations

import random

import pytest
import torch

from minillm import speculative as library
from minillm.generate import generate
from minillm.grading import load_impl
from minillm.kv_cache import KVCache
from minillm.sampling import SamplingParams
from minillm.speculative_generate import DraftModel, speculative_generate
from minillm.testing import tiny_pair

impl = load_impl("ch11_speculative")


# -- 11.1 greedy verification -------------------------------------------------------------

@pytest.mark.exercise("11.1", points=2)
@pytest.mark.parametrize("choices, draft, expected", [
    ([5, 6, 7, 8], [5, 6, 7], (3, 8)),  # all kept: the bonus token
    ([5, 6, 7, 8], [5, 9, 7], (1, 6)),  # a mismatch, then a match that no longer counts
    ([5, 6], [4], (0, 5)),  # the first draft is wrong: the correction
    ([3], [], (0, 3)),  # nothing drafted: a plain step
    ([2, 2, 2], [2, 2], (2, 2)),  # repeated tokens
])
def test_verify_greedy_examples(choices, draft, expected):
    assert tuple(impl.verify_greedy(list(choices), list(draft))) == expected


@pytest.mark.exercise("11.1", points=1)
def test_verify_greedy_matches_the_library():
    rng = random.Random(0)
    for _ in range(500):
        gamma = rng.randint(0, 8)
        choices = [rng.randint(0, 2) for _ in range(gamma + 1)]
        draft = [rng.randint(0, 2) for _ in range(gamma)]
        assert tuple(impl.verify_greedy(choices, draft)) == \
            library.verify_greedy(choices, draft), (choices, draft)


# -- 11.2 the residual distribution -------------------------------------------------------

@pytest.mark.exercise("11.2", points=1)
def test_residual_example():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    q = torch.tensor([[0.2, 0.5, 0.1, 0.2]])
    # max(0, p - q) = [0.3, 0, 0.1, 0] -> [0.75, 0, 0.25, 0]
    assert torch.allclose(impl.residual(p, q), torch.tensor([[0.75, 0.0, 0.25, 0.0]]))


@pytest.mark.exercise("11.2", points=1)
def test_residual_rows_sum_to_one_and_match_the_library():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(64, 30, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(64, 30, generator=g) * 2, -1)
    got = impl.residual(p, q)
    assert got.shape == (64, 30) and bool((got >= 0).all())
    assert torch.allclose(got.sum(-1), torch.ones(64))
    assert torch.allclose(got, library.residual(p, q), atol=1e-6)


# -- 11.3 rejection sampling ----------------------------------------------------------------

def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


@pytest.mark.exercise("11.3", points=3)
@pytest.mark.parametrize("gamma", [1, 3])
def test_emitted_tokens_follow_the_target(gamma):
    """200k seeded draws on 10 tokens: the first token emitted is distributed as p, not q."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(10, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(10, generator=g) * 2, -1)
    rows = 200_000
    draft = torch.multinomial(q.expand(rows, 10), gamma, replacement=True, generator=g)
    accepted, extra = impl.verify(p.expand(rows, gamma + 1, 10), q.expand(rows, gamma, 10),
                                  draft, g)
    first = torch.where(accepted > 0, draft[:, 0], extra)
    empirical = torch.bincount(first, minlength=10).float() / rows
    assert tv(empirical, p) < 0.01  # the library: 0.002
    assert tv(empirical, q) > 5 * tv(empirical, p)


@pytest.mark.exercise("11.3", points=2)
def test_the_second_token_follows_the_target_too():
    """After a first accepted draft, the next emitted token follows p's second row."""
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(3, 10, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(2, 10, generator=g) * 2, -1)
    rows = 200_000
    draft = torch.stack([torch.multinomial(q[i].expand(rows, 10), 1, generator=g)[:, 0]
                         for i in range(2)], -1)
    accepted, extra = impl.verify(p.expand(rows, 3, 10), q.expand(rows, 2, 10), draft, g)
    survived = accepted >= 1
    second = torch.where(accepted[survived] > 1, draft[survived, 1], extra[survived])
    empirical = torch.bincount(second, minlength=10).float() / len(second)
    assert tv(empirical, p[1]) < 0.01


@pytest.mark.exercise("11.3", points=2)
def test_verify_equals_the_library_for_the_same_seed():
    g = torch.Generator().manual_seed(5)
    rows, gamma, vocab = 500, 4, 12
    p = torch.softmax(torch.randn(rows, gamma + 1, vocab, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(rows, gamma, vocab, generator=g) * 2, -1)
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).view(rows, gamma)
    got = impl.verify(p, q, draft, torch.Generator().manual_seed(9))
    expected = library.verify(p, q, draft, torch.Generator().manual_seed(9))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert 0 < float(got[0].float().mean()) < gamma


@pytest.mark.exercise("11.3", points=1)
def test_masked_tokens_are_never_emitted():
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])  # after top-k = 2
    q = torch.tensor([0.1, 0.1, 0.4, 0.4])  # the draft likes the masked tokens
    rows = 50_000
    draft = torch.multinomial(q.expand(rows, 4), 2, replacement=True, generator=g)
    accepted, extra = impl.verify(p.expand(rows, 3, 4), q.expand(rows, 2, 4), draft, g)
    kept = torch.cat([draft[accepted > 0, 0], draft[accepted > 1, 1], extra])
    assert int(kept.max()) <= 1


PROMPT = [5, 17, 99, 3, 42, 7, 8, 5, 17, 99]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = tiny_pair(tmp_path_factory.mktemp("target"))[0]
    draft = tiny_pair(tmp_path_factory.mktemp("draft"), seed=1)[0]
    return target, draft


@pytest.mark.exercise("11.3", points=2)
def test_your_rule_in_speculative_decoding(models):
    """Your verify drives the library's loop: greedy gives generate()'s tokens; a seeded
    sampled run gives the library's tokens."""
    target, draft = models
    greedy = SamplingParams()
    got, _ = speculative_generate(target, DraftModel(draft), PROMPT, 24, greedy, gamma=4,
                                  verifier=impl.verify)
    assert got == generate(target, PROMPT, 24)[0]
    sampled = SamplingParams(temperature=0.8, top_k=20, seed=4)
    runs = [speculative_generate(target, DraftModel(draft), PROMPT, 24, sampled, gamma=3,
                                 verifier=rule)[0]
            for rule in (impl.verify, library.verify)]
    assert runs[0] == runs[1]


# -- 11.4 the caches after a verification ----------------------------------------------------

@pytest.mark.exercise("11.4", points=1)
@pytest.mark.parametrize("context, gamma, accepted, expected", [
    (10, 4, 2, (12, 12)),  # the draft fed 13 tokens, 2 of its guesses were right
    (10, 4, 0, (10, 10)),  # nothing survived: back to the newest token
    (10, 4, 4, (14, 13)),  # all survived: the draft never fed its last guess
    (10, 4, 3, (13, 13)),
    (1, 1, 1, (2, 1)),
])
def test_cache_lengths_examples(context, gamma, accepted, expected):
    assert tuple(impl.cache_lengths_after_verification(context, gamma, accepted)) == expected


@pytest.mark.exercise("11.4", points=2)
@pytest.mark.parametrize("gamma, accepted", [(4, 0), (4, 2), (4, 4), (1, 0), (1, 1), (6, 5)])
def test_truncated_caches_hold_exactly_the_verified_tokens(models, gamma, accepted):
    """Run one round on real caches, truncate them to your lengths, and compare with caches
    filled from scratch with the new context: every kept entry must be a verified token's."""
    model = models[0]
    context = list(PROMPT)
    guesses = [11 + i for i in range(gamma)]
    emitted = guesses[:accepted] + [200]  # the survivors and the target's own token
    target, draft = (KVCache(model.config, 1, 64, model.dtype, model.device) for _ in range(2))
    with torch.no_grad():
        for cache in (target, draft):
            model(torch.tensor([context[:-1]]), cache)
        model(torch.tensor([context[-1:] + guesses[:-1]]), draft)
        model(torch.tensor([context[-1:] + guesses]), target)
        target_len, draft_len = impl.cache_lengths_after_verification(len(context), gamma,
                                                                       accepted)
        new_context = context + emitted
        assert target_len <= len(new_context) - 1 and draft_len <= len(new_context) - 1
        for cache, length in ((target, target_len), (draft, draft_len)):
            cache.rewind(cache.length - length)
            fresh = KVCache(model.config, 1, 64, model.dtype, model.device)
            model(torch.tensor([new_context[:length]]), fresh)
            assert torch.allclose(cache.keys[:, :, :, :length], fresh.keys[:, :, :, :length],
                                  atol=1e-5)
    assert target_len == len(new_context) - 1  # the target keeps everything it verified


# -- 11.5 expected tokens and speedup ---------------------------------------------------------

@pytest.mark.exercise("11.5", points=1)
@pytest.mark.parametrize("alpha, gamma", [(0.0, 4), (0.5, 2), (0.8, 4), (0.3, 1), (0.99, 8)])
def test_expected_tokens_matches_the_library(alpha, gamma):
    assert impl.expected_tokens(alpha, gamma) == pytest.approx(
        library.expected_tokens_per_call(alpha, gamma))


@pytest.mark.exercise("11.5", points=1)
def test_expected_tokens_boundaries_and_a_simulation():
    assert impl.expected_tokens(1.0, 4) == 5.0
    assert impl.expected_tokens(0.0, 7) == 1.0
    rng = random.Random(0)
    alpha, gamma, rounds, total = 0.6, 3, 100_000, 0
    for _ in range(rounds):
        kept = 0
        while kept < gamma and rng.random() < alpha:
            kept += 1
        total += kept + 1
    assert impl.expected_tokens(alpha, gamma) == pytest.approx(total / rounds, rel=0.01)


@pytest.mark.exercise("11.5", points=1)
@pytest.mark.parametrize("alpha, gamma, cost, expected", [
    (0.0, 4, 0.0, 1.0),  # a free draft that is always wrong: no loss, no gain
    (1.0, 4, 0.0, 5.0),
    (0.8, 4, 0.14, (1 - 0.8**5) / 0.2 / 1.56),
    (0.55, 4, 0.14, (1 - 0.55**5) / 0.45 / 1.56),  # near break-even
    (0.0, 2, 0.5, 0.5),
])
def test_speedup(alpha, gamma, cost, expected):
    assert impl.speedup(alpha, gamma, cost) == pytest.approx(expected)
