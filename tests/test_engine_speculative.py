"""Speculative decoding inside the serving engine (prompt-lookup guesses verified in the
decode step): greedy outputs equal ``generate`` alone for every γ and policy, stop tokens
and ``max_tokens`` inside an accepted run end a request exactly, blocks holding unverified
tokens are never named in the prefix cache, nothing leaks, and speculation is never
starved: every decode step with room for a guess carries guesses, even in a pool just
large enough for the request."""

from __future__ import annotations

import pytest
from engine_driving import (
    preempt_at_random,
    second_token_marginal,
    second_tokens_drawn,
    sequence_of,
)

from minillm.config import ModelConfig
from minillm.engine.deltas import StepReport
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.speculative import PromptLookup, expected_tokens_per_call
from minillm.speculative_generate import DraftModel, speculative_generate
from minillm.testing import varied_random_model

CONFIG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
# Repetitive prompts: the tiny model soon repeats itself, so prompt lookup guesses right
# often (the tests check that guesses were both accepted and rejected).
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7], [9] * 11, list(range(10, 30)),
           [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [7, 8, 7, 8, 7]]


@pytest.fixture(scope="module")
def model():
    return varied_random_model(CONFIG)


def alone(model, prompt, params):
    return generate(model, prompt, params.max_tokens, params)[0]


def engine(model, gamma, **config):
    blocks = config.pop("num_blocks", 96)
    return LLM(model, block_size=4, num_blocks=blocks,
               scheduler=SchedulerConfig(speculative_tokens=gamma, **config))


@pytest.mark.parametrize("gamma", range(1, 9))
def test_greedy_outputs_equal_generate_for_every_gamma(model, gamma):
    llm = engine(model, gamma, max_batch=4)
    params = SamplingParams(max_tokens=20)
    outputs = llm.generate(PROMPTS, params, progress=False)
    assert [o.tokens for o in outputs] == [alone(model, p, params) for p in PROMPTS]
    samples = [o.outputs[0] for o in outputs]
    drafted, accepted = sum(s.drafted for s in samples), sum(s.accepted for s in samples)
    assert 0 < accepted < drafted  # guesses were made, some kept and some rejected
    assert llm.free_blocks() == llm.blocks.num_blocks


POLICIES = {
    "chunked prefill": dict(max_batch=4, max_tokens_per_step=8),
    "whole prefills": dict(max_batch=3, max_tokens_per_step=64, chunked_prefill=False),
    "static": dict(policy="static", max_batch=3),
    "random preemption": dict(max_batch=4, max_tokens_per_step=16, preempt_at_random=(0.3, 1)),
    "short pool": dict(max_batch=6, max_tokens_per_step=64, num_blocks=26),
    "no prefix caching": dict(max_batch=4, prefix_caching=False),
}


@pytest.mark.parametrize("config", POLICIES.values(), ids=POLICIES.keys())
def test_greedy_outputs_equal_generate_under_every_policy(model, config):
    config = dict(config)
    preemption = config.pop("preempt_at_random", None)
    llm = LLM(model, block_size=4, num_blocks=config.pop("num_blocks", 96),
              prefix_caching=config.pop("prefix_caching", True),
              scheduler=SchedulerConfig(speculative_tokens=4, **config))
    if preemption is not None:
        preempt_at_random(llm, *preemption)
    params = SamplingParams(max_tokens=16)
    outputs = llm.generate(PROMPTS, params, progress=False)
    assert [o.tokens for o in outputs] == [alone(model, p, params) for p in PROMPTS]
    assert llm.free_blocks() == llm.blocks.num_blocks


def test_unverified_tokens_are_never_named_in_the_prefix_cache(model):
    """After every step, each named block of a running request holds computed, verified
    tokens only: its token ids are the request's, and it lies below num_computed (which
    never counts a guess past the request's verified tokens)."""
    llm = engine(model, 6, max_batch=4)
    for prompt in PROMPTS:
        llm.add_request(prompt, SamplingParams(max_tokens=24))
    size = llm.blocks.block_size
    while llm.has_work:
        llm.step()
        for seq in llm.core.scheduler.running:
            assert seq.num_computed <= seq.num_tokens
            for i, block_id in enumerate(seq.block_table):
                block = llm.blocks.blocks[block_id]
                if block.hash is not None:
                    assert (i + 1) * size <= seq.num_computed <= seq.num_tokens
                    assert block.token_ids == tuple(seq.tokens[i * size:(i + 1) * size])


def test_prefix_hits_on_blocks_written_by_speculation_change_nothing(model):
    llm = engine(model, 4, max_batch=2)
    params = SamplingParams(max_tokens=24)
    first = llm.generate([PROMPTS[0]], params, progress=False)[0]
    follow_up = PROMPTS[0] + first.tokens[:-3]  # reuses blocks the first request wrote
    request = llm.add_request(follow_up, SamplingParams(max_tokens=8))
    seq = sequence_of(llm, request)
    while llm.has_work:
        llm.step()
    assert seq.cached_tokens > len(PROMPTS[0])
    assert llm.output(request).tokens == alone(model, follow_up, SamplingParams(max_tokens=8))


def test_a_stop_token_inside_an_accepted_run_ends_the_request(model):
    params = SamplingParams(max_tokens=30)
    for prompt in PROMPTS:
        plain = alone(model, prompt, params)
        for stop in set(plain[3:]):
            llm = engine(model, 8, max_batch=1)
            stopping = SamplingParams(max_tokens=30, stop_token_ids=(stop,))
            out = llm.generate([prompt], stopping, progress=False)[0]
            assert out.tokens == plain[:plain.index(stop) + 1]
            assert out.finish_reason == "stop"


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7])
def test_max_tokens_is_exact(model, max_tokens):
    llm = engine(model, 8, max_batch=4)
    params = SamplingParams(max_tokens=max_tokens)
    outputs = llm.generate(PROMPTS, params, progress=False)
    assert [o.tokens for o in outputs] == [alone(model, p, params) for p in PROMPTS]


def test_sampled_requests_speculate_reproducibly_and_with_samples(model):
    params = [SamplingParams(temperature=0.8, top_k=10, seed=s, max_tokens=16, n=1 + s % 2)
              for s in range(len(PROMPTS))]
    runs = [engine(model, 4, max_batch=8).generate(PROMPTS, params, progress=False)
            for _ in range(2)]
    assert [[c.tokens for c in o.outputs] for o in runs[0]] == \
        [[c.tokens for c in o.outputs] for o in runs[1]]
    assert all(len(c.tokens) == 16 for o in runs[0] for c in o.outputs)


def test_bad_speculative_tokens():
    with pytest.raises(ValueError, match="speculative_tokens"):
        SchedulerConfig(speculative_tokens=-1)


def test_smollm2_speculative_engine_equals_generate(smollm2, tokenizer):
    code = "def area(width, height):\n    return width * height\n"
    prompts = [tokenizer.chat_prompt(f"Rename `width` to `w` in this code:\n\n{code}"),
               tokenizer.chat_prompt("What is a KV cache? One sentence.")]
    llm = LLM(smollm2, tokenizer=tokenizer, num_blocks=64,
              scheduler=SchedulerConfig(max_batch=2, speculative_tokens=4))
    params = SamplingParams(max_tokens=24)
    outputs = llm.generate(prompts, params, progress=False)
    expected = [generate(smollm2, p, 24, stop_tokens=tokenizer.stop_tokens)[0] for p in prompts]
    assert [o.tokens for o in outputs] == expected
    assert outputs[0].outputs[0].accepted > 0


def test_streaming_yields_every_accepted_token(model):
    llm = engine(model, 4, max_batch=2)
    params = SamplingParams(max_tokens=20)
    for prompt in PROMPTS[:3]:
        streamed = [t for update in llm.stream(prompt, params) for t in update.token_ids]
        assert streamed == alone(model, prompt, params)
    assert llm.free_blocks() == llm.blocks.num_blocks


def test_sampled_speculation_keeps_the_targets_distribution(model):
    """8,000 seeded requests for 3 tokens (temperature 1): the second token is drawn through
    a verification whenever prompt lookup had a guess. Its empirical distribution must be
    the exact marginal sum_t1 p(t1) p(t2 | t1) (TV 0.019 measured, sampling noise ~0.02)."""
    prompt, params = list(range(1, 9)) * 2, SamplingParams(temperature=1.0)
    second = second_token_marginal(model, prompt, params)
    llm = LLM(model, block_size=16, num_blocks=16_010,
              scheduler=SchedulerConfig(max_batch=512, max_tokens_per_step=8192,
                                        speculative_tokens=4))
    drawn, samples = second_tokens_drawn(llm, prompt, 8000, CONFIG.vocab_size)
    assert sum(s.drafted for s in samples) > 1000  # a quarter of them had a guess verified
    assert 0.5 * float((drawn - second).abs().sum()) < 0.04


# -- speculation is never starved ------------------------------------------------------------

ALL_TOKENS = list(range(CONFIG.vocab_size)) * 2  # every token recurs: prompt lookup always
# finds a 1-gram, and proposes at least one guess


def room(max_tokens: int, output: int) -> int:
    """Guesses a decode may still carry: it ends at ``max_tokens``, and the target's own
    token comes after the guesses."""
    return max_tokens - output - 1


def test_a_draft_that_agrees_with_the_target_gives_gamma_plus_one_tokens_per_call(model):
    """The target as its own draft: every guess is accepted, so every call after the
    prompt's gives γ + 1 = 5 tokens, but the last, cut short by max_tokens: 19 tokens after
    the first in calls of 5, 5, 5 and 4."""
    tokens, stats = speculative_generate(model, DraftModel(model), PROMPTS[0], 20, gamma=4)
    assert tokens == alone(model, PROMPTS[0], SamplingParams(max_tokens=20))
    assert expected_tokens_per_call(1.0, 4) == 5
    assert stats.drafted_per_call == [4, 4, 4, 3] == stats.accepted_per_call
    assert stats.target_calls == 4 and stats.emitted == 19
    assert stats.tokens_per_call == (5 + 5 + 5 + 4) / 4


def test_prompt_lookup_guesses_on_every_call_with_room(model):
    """A prompt of a repeated pattern holding every token: each lookup finds guesses, so
    every call after the prompt's carries some, as many as γ and max_tokens allow at most,
    and none only where max_tokens leaves no room."""
    tokens, stats = speculative_generate(model, PromptLookup(), ALL_TOKENS, 20, gamma=4)
    assert tokens == alone(model, ALL_TOKENS, SamplingParams(max_tokens=20))
    output = 1  # the prompt's pass gave the first token
    for drafted, accepted in zip(stats.drafted_per_call, stats.accepted_per_call, strict=True):
        left = room(20, output)
        assert (drafted > 0) == (left > 0) and drafted <= min(4, left)
        output += accepted + 1
    assert output == len(tokens) == 20
    assert stats.tokens_per_call == 19 / stats.target_calls
    assert stats.target_calls == 19 - stats.accepted


DRAFTERS = {"target as draft": dict(draft=True, prompts=[PROMPTS[0]]),
            "prompt lookup": dict(draft=False, prompts=[ALL_TOKENS]),
            "3 requests, target as draft": dict(draft=True, prompts=PROMPTS[:3]),
            "3 requests, prompt lookup": dict(draft=False,
                                              prompts=[ALL_TOKENS, ALL_TOKENS[5:], ALL_TOKENS[9:]])}


@pytest.mark.parametrize("case", DRAFTERS.values(), ids=DRAFTERS.keys())
def test_a_pool_just_large_enough_still_gets_guesses_on_every_decode_step(model, case):
    """The pool holds exactly the blocks of each prompt + max_tokens, nothing spare; still
    every decode step with room for a guess carries guesses (with the target as its own
    draft, exactly min(γ, room)). An 8-token request once drafted none: guesses demanded
    a spare block per running request."""
    prompts, gamma, max_tokens, size = case["prompts"], 4, 8, 4
    reports: list[StepReport] = []
    llm = LLM(model, block_size=size, draft_model=model if case["draft"] else None,
              num_blocks=sum(-(-(len(p) + max_tokens) // size) for p in prompts),
              scheduler=SchedulerConfig(max_batch=len(prompts), speculative_tokens=gamma),
              on_step=reports.append)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens), progress=False)
    assert [o.tokens for o in outputs] == \
        [alone(model, p, SamplingParams(max_tokens=max_tokens)) for p in prompts]
    decodes = [work for report in reports for work in report.work
               if work.start >= len(prompts[work.request_id])]
    assert decodes
    for work in decodes:
        guesses = work.tokens - 1
        left = room(max_tokens, work.start - len(prompts[work.request_id]) + 1)
        assert (guesses > 0) == (left > 0) and guesses <= min(gamma, left)
        if case["draft"]:
            assert guesses == min(gamma, left)
    drafted = sum(work.tokens - 1 for work in decodes)
    assert sum(o.outputs[0].drafted for o in outputs) == drafted > 0
    assert llm.free_blocks() == llm.blocks.num_blocks
