"""n > 1 samples of one prompt: the samples fork from the computed prompt and share its KV
blocks (copy-on-write), and each gives exactly the tokens a single request with its seed
gets alone — under every scheduling policy, preemption and a short pool."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from engine_driving import preempt_at_random, sequence_of

from minillm.attention.paged import gather_kv
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SEED_RANGE, SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import tiny_pair

PROMPTS = [[5, 17, 99, 3, 42, 7, 8], [1, 2], list(range(30, 70)), [9] * 13]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_pair(tmp_path_factory.mktemp("tiny"))[0]


def alone(model, prompt, params: SamplingParams) -> list[int]:
    return generate(model, prompt, params.max_tokens, params)[0]


def engine(model, num_blocks=64, random_preemption=None, **config) -> LLM:
    """An engine with blocks of 4; ``random_preemption=(chance, seed)`` preempts a running
    sequence at random before each step."""
    llm = LLM(model, block_size=4, num_blocks=num_blocks, scheduler=SchedulerConfig(**config))
    return llm if random_preemption is None else preempt_at_random(llm, *random_preemption)


def cached_kv(llm: LLM, seq) -> torch.Tensor:
    """The keys and values the pool holds for ``seq``'s computed tokens, every layer."""
    cache, table = llm.core.runner.cache, torch.tensor([seq.block_table])
    return torch.stack([gather_kv(pool, table)[0, :, :seq.num_computed]
                        for pool in (*cache.keys, *cache.values)])


CONFIGS = {
    "continuous": dict(max_batch=8, max_tokens_per_step=512),
    "chunked prefill": dict(max_batch=8, max_tokens_per_step=8),
    "whole prefills": dict(max_batch=6, chunked_prefill=False),
    "static": dict(policy="static", max_batch=6),
    "random preemption": dict(max_batch=8, max_tokens_per_step=16,
                              random_preemption=(0.3, 2)),
    "short pool": dict(max_batch=8, max_tokens_per_step=64, num_blocks=20),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_sample_i_equals_a_single_request_seeded_seed_plus_i(tiny, config):
    params = [SamplingParams(temperature=1.0, seed=10, max_tokens=9, n=3),
              SamplingParams(max_tokens=6),
              SamplingParams(temperature=0.9, top_k=12, seed=20, max_tokens=7, n=2),
              SamplingParams(max_tokens=8, n=2)]  # greedy samples are all the same
    outputs = engine(tiny, **config).generate(PROMPTS, params, progress=False)
    for prompt, sp, out in zip(PROMPTS, params, outputs, strict=True):
        assert len(out.outputs) == sp.n
        assert out.tokens == out.outputs[0].tokens
        for i, sample in enumerate(out.outputs):
            seed = None if sp.seed is None else sp.seed + i
            assert sample.index == i
            assert sample.tokens == alone(tiny, prompt, replace(sp, n=1, seed=seed))
    sampled = [s.tokens for s in outputs[0].outputs]
    assert len({tuple(t) for t in sampled}) > 1  # different seeds, different samples


def test_samples_share_the_prompt_blocks_and_copy_the_one_they_write(tiny):
    llm = engine(tiny, max_batch=4)
    prompt = list(range(100, 110))  # blocks of 4: two full, one holding 2 tokens
    parent = sequence_of(llm, llm.add_request(
        prompt, SamplingParams(temperature=1.0, seed=0, max_tokens=5, n=3)))
    llm.step()  # the prompt: then the three samples fork
    samples = [parent, *parent.samples]
    assert all(s.block_table == parent.block_table for s in samples)
    assert [llm.blocks.blocks[b].ref_count for b in parent.block_table] == [3, 3, 3]
    assert llm.free_blocks() == 64 - 3  # the prompt's keys and values are stored once
    llm.step()  # every sample writes its first token into the shared third block
    assert all(s.block_table[:2] == parent.block_table[:2] for s in samples)
    assert len({s.block_table[2] for s in samples}) == 3  # two copies and the original
    assert llm.free_blocks() == 64 - 5
    llm.step()
    for i, sample in enumerate(samples):  # each sample's cache is what it would be alone
        lone = engine(tiny)
        seq = sequence_of(lone, lone.add_request(
            prompt, SamplingParams(temperature=1.0, seed=i, max_tokens=5)))
        for _ in range(3):
            lone.step()
        assert sample.tokens == seq.tokens
        torch.testing.assert_close(cached_kv(llm, sample), cached_kv(lone, seq))
    while llm.has_work:
        llm.step()
    assert llm.free_blocks() == 64


def test_samples_that_stop_at_their_first_token_free_their_blocks(tiny):
    llm = engine(tiny)
    out = llm.generate([PROMPTS[2]], SamplingParams(temperature=1.0, seed=3, max_tokens=1,
                                                    n=4), progress=False)[0]
    assert [len(s.tokens) for s in out.outputs] == [1, 1, 1, 1]
    assert all(s.finish_reason == "length" for s in out.outputs)
    assert llm.free_blocks() == 64


def test_aborting_a_request_aborts_its_samples_and_frees_their_blocks(tiny):
    llm = engine(tiny)
    keep = llm.add_request(PROMPTS[0], SamplingParams(max_tokens=8))
    drop = llm.add_request(PROMPTS[2], SamplingParams(temperature=1.0, max_tokens=8, n=3))
    dropped = sequence_of(llm, drop)
    llm.step()
    llm.step()
    assert all(s.block_table for s in dropped.samples)  # forked and running
    llm.abort(drop)
    samples = (dropped, *dropped.samples)
    assert {s.finish_reason.value for s in samples} == {"abort"}
    assert not any(s.block_table for s in samples)
    assert {s.finish_reason for s in llm.output(drop).outputs} == {"abort"}
    while llm.has_work:
        llm.step()
    assert llm.output(keep).tokens == alone(tiny, PROMPTS[0], SamplingParams(max_tokens=8))
    assert llm.free_blocks() == 64


def test_bad_sample_counts_are_clear_errors(tiny):
    llm = engine(tiny, max_batch=4)
    outputs = llm.generate([PROMPTS[0], PROMPTS[1]],
                           [SamplingParams(max_tokens=4, n=5), SamplingParams(max_tokens=4)],
                           progress=False)
    assert "max_batch" in outputs[0].error
    assert all(s.finish_reason == "error" for s in outputs[0].outputs)
    assert outputs[1].error is None and llm.free_blocks() == 64
    with pytest.raises(ValueError, match="n \\(samples per prompt\\)"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="add_request"):
        next(llm.stream(PROMPTS[0], SamplingParams(n=2)))
    with pytest.raises(ValueError, match="serving engine"):
        generate(tiny, PROMPTS[0], 4, SamplingParams(n=2))



def test_samples_of_a_seed_at_the_top_of_its_range_wrap_around(tiny):
    """Sample i draws with seed + i wrapped into the 64-bit range: the last seed's second
    sample is the first seed's lone request."""
    llm = engine(tiny)
    params = SamplingParams(temperature=1.0, seed=SEED_RANGE[1], max_tokens=4, n=2)
    out = llm.generate([PROMPTS[0]], params, progress=False)[0]
    lone = engine(tiny).generate([PROMPTS[0]], replace(params, seed=SEED_RANGE[0], n=1),
                                 progress=False)[0]
    assert out.error is None and out.outputs[1].tokens == lone.tokens
    assert llm.free_blocks() == 64


@pytest.mark.smollm2
def test_smollm2_samples_equal_single_requests(smollm2, tokenizer):
    prompt = tokenizer.chat_prompt("Name a fruit and say why you like it.")
    llm = LLM(smollm2, tokenizer=tokenizer, block_size=16, num_blocks=64,
              scheduler=SchedulerConfig(max_batch=4, max_tokens_per_step=32))
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=5, max_tokens=12, n=3)
    out = llm.generate([prompt], params, progress=False)[0]
    for i, sample in enumerate(out.outputs):
        expected = generate(smollm2, prompt, 12, replace(params, n=1, seed=5 + i),
                            stop_tokens=tokenizer.stop_tokens)[0]
        assert sample.tokens == expected
        assert sample.text == tokenizer.decode(expected)
    assert len({tuple(s.tokens) for s in out.outputs}) > 1
    assert llm.free_blocks() == 64
