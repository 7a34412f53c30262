"""Speculative decoding is lossless: greedy gives plain greedy's tokens for every γ and
draft (``speculative_generate``: the engine with a draft model or prompt lookup);
rejection sampling emits tokens distributed as the target's (measured over 200k seeded
draws, and over 2,000 seeded requests through the engine with a draft model); masked
tokens are never emitted."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SamplingParams
from minillm.speculative import (
    PromptLookup,
    expected_tokens_per_call,
    lookup_ngram,
    verify,
    verify_greedy,
)
from minillm.speculative_generate import DraftModel, speculative_generate
from minillm.testing import tiny_pair

PROMPT = [5, 17, 99, 3, 42, 7, 8, 5, 17, 99]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = tiny_pair(tmp_path_factory.mktemp("target"))[0]
    draft = tiny_pair(tmp_path_factory.mktemp("draft"), seed=1)[0]  # an unrelated draft
    return target, draft


@pytest.mark.parametrize("gamma", range(1, 9))
def test_greedy_with_a_random_draft_equals_greedy(models, gamma):
    target, draft = models
    expected = generate(target, PROMPT, 24)[0]
    params = SamplingParams()
    tokens, stats = speculative_generate(target, DraftModel(draft), PROMPT, 24,
                                         params, gamma=gamma)
    assert tokens == expected
    assert stats.emitted == 23  # the passes after the prompt's, which gave the first


def test_the_target_as_its_own_draft_accepts_everything(models):
    target, _ = models
    params = SamplingParams()
    tokens, stats = speculative_generate(target, DraftModel(target), PROMPT, 21,
                                         params, gamma=4)
    assert tokens == generate(target, PROMPT, 21)[0]
    # the prompt's pass gives the first token, then every pass 4 guesses + 1
    assert stats.acceptance_rate == 1.0 and stats.tokens_per_call == 5.0
    assert stats.target_calls == 4 and stats.emitted == 20


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_prompt_lookup_greedy_equals_greedy(models, gamma):
    target, _ = models
    tokens, _ = speculative_generate(target, PromptLookup(), PROMPT, 30, gamma=gamma)
    assert tokens == generate(target, PROMPT, 30)[0]


def test_a_stop_token_inside_a_proposal_ends_generation(models):
    target, _ = models
    plain = generate(target, PROMPT, 20)[0]
    stop = plain[6]
    tokens, _ = speculative_generate(target, DraftModel(target), PROMPT,
                                     20, gamma=8, stop_tokens=[stop])
    assert tokens == plain[:plain.index(stop) + 1]


def test_prompt_lookup_proposes_what_followed_the_last_ngram():
    assert lookup_ngram([1, 2, 3, 4, 5, 9, 2, 3], gamma=2) == [4, 5]
    assert PromptLookup(max_ngram=3).drafter([1, 2, 3, 4, 5, 9, 2, 3], 2) == [4, 5]
    assert lookup_ngram([1, 2, 3], gamma=4) == []


def test_prompt_lookup_with_min_ngram_ignores_shorter_matches():
    context = [1, 2, 3, 7, 8, 3]  # the last token, 3, occurred before; the last 2-gram did not
    assert PromptLookup().drafter(context, 2) == [7, 8]
    assert PromptLookup(min_ngram=2).drafter(context, 2) == []
    assert PromptLookup(min_ngram=2).drafter(context + [7], 2) == [8, 3]
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookup(max_ngram=2, min_ngram=3)


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


@pytest.mark.parametrize("gamma", [1, 3])
def test_rejection_sampling_emits_the_targets_distribution(gamma):
    """200k draws on a 10-token vocabulary: the first emitted token follows p, not q."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(10, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(10, generator=g) * 2, -1)
    rows = 200_000
    draft = torch.multinomial(q.expand(rows, 10), gamma, replacement=True, generator=g)
    accepted, extra = verify(p.expand(rows, gamma + 1, 10), q.expand(rows, gamma, 10), draft, g)
    first = torch.where(accepted > 0, draft[:, 0], extra)
    empirical = torch.bincount(first, minlength=10).float() / rows
    assert tv(empirical, p) < 0.01
    assert tv(empirical, q) > 5 * tv(empirical, p)
    assert 0 < accepted.float().mean() < gamma  # some drafts are rejected, some kept


def test_greedy_verification_is_rejection_sampling_with_one_hot_distributions():
    g = torch.Generator().manual_seed(2)
    for gamma in (1, 2, 4):
        for _ in range(50):
            choices = torch.randint(0, 3, (gamma + 1,), generator=g)
            draft = torch.randint(0, 3, (gamma,), generator=g)
            p, q = F.one_hot(choices, 3).float(), F.one_hot(draft, 3).float()
            accepted, extra = verify(p[None], q[None], draft[None], g)
            assert verify_greedy(choices.tolist(), draft.tolist()) == (int(accepted), int(extra))
    assert verify_greedy([7, 8, 9], [7, 8]) == (2, 9)  # all kept: the bonus token
    assert verify_greedy([4], []) == (0, 4)  # nothing drafted: one plain step


def test_masked_tokens_are_never_emitted():
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])  # e.g. after top-k = 2
    q = torch.tensor([0.1, 0.1, 0.4, 0.4])  # the draft likes the masked tokens
    rows = 50_000
    draft = torch.multinomial(q.expand(rows, 4), 2, replacement=True, generator=g)
    accepted, extra = verify(p.expand(rows, 3, 4), q.expand(rows, 2, 4), draft, g)
    kept = torch.cat([draft[accepted > 0, 0], draft[accepted > 1, 1], extra])
    assert int(kept.max()) <= 1


def test_sampled_speculative_decoding_is_reproducible(models):
    target, draft = models
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=3)
    first = speculative_generate(target, DraftModel(draft), PROMPT, 16, params)
    again = speculative_generate(target, DraftModel(draft), PROMPT, 16, params)
    assert first[0] == again[0]


def test_expected_tokens_per_call():
    assert expected_tokens_per_call(0.0, 4) == 1.0
    assert expected_tokens_per_call(1.0, 4) == 5.0
    assert expected_tokens_per_call(0.5, 2) == pytest.approx(1.75)


def test_bad_arguments(models):
    target, _ = models
    with pytest.raises(ValueError, match="gamma"):
        speculative_generate(target, PromptLookup(), PROMPT, 4, gamma=0)
    with pytest.raises(ValueError, match="repetition penalty"):
        speculative_generate(target, PromptLookup(), PROMPT, 4,
                             SamplingParams(repetition_penalty=1.2))


def test_sampled_speculation_with_a_draft_model_keeps_the_targets_distribution():
    """8,000 seeded requests on a 16-token vocabulary through the engine, speculating with
    a draft model (γ = 3): the second generated token (the first that can come from an
    accepted guess) follows the target's exact distribution (total variation < 0.04; the
    sampling noise alone is about 0.02), not the draft's (which is > 0.1 away)."""
    from minillm.config import ModelConfig
    from minillm.serve import LLM, SchedulerConfig
    from minillm.testing import varied_random_model

    config = ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    target, draft = varied_random_model(config, 0), varied_random_model(config, 1)
    prompt, requests = [3, 1, 4, 1, 5], 8000

    def exact_second_token(model) -> torch.Tensor:
        with torch.no_grad():
            first = torch.softmax(model(torch.tensor([prompt]))[0, -1], -1)
            return sum(first[t] * torch.softmax(model(torch.tensor([prompt + [t]]))[0, -1], -1)
                       for t in range(16))

    llm = LLM(target, block_size=4, num_blocks=64, draft_model=draft,
              scheduler=SchedulerConfig(max_batch=16, speculative_tokens=3))
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=3) for seed in range(requests)]
    outputs = llm.generate([prompt] * requests, params, progress=False)
    samples = [o.outputs[0] for o in outputs]
    assert 0 < sum(s.accepted for s in samples) < sum(s.drafted for s in samples)
    empirical = torch.bincount(torch.tensor([o.tokens[1] for o in outputs]),
                               minlength=16).float() / requests
    expected = exact_second_token(target)
    assert tv(expected, exact_second_token(draft)) > 0.1
    assert tv(empirical, expected) < 0.04
