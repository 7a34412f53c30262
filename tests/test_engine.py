"""The serving engine gives every request exactly what ``generate`` gives it alone — under
continuous batching, chunked prefill, random preemption, prefix-cache hits and mixed
sampling parameters — and bad requests fail alone, leaking no blocks."""

from __future__ import annotations

import pytest
import torch

from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import tiny_pair

PROMPTS = [[5, 17, 99, 3, 42, 7, 8], [1, 2], [200, 100, 50, 25], list(range(30, 70)),
           [9] * 13, [4, 4, 8, 15, 16, 23, 42]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_pair(tmp_path_factory.mktemp("tiny"))[0]


def alone(model, prompt, params: SamplingParams) -> list[int]:
    return generate(model, prompt, params.max_tokens, params)[0]


def engine(model, **config) -> LLM:
    blocks = config.pop("num_blocks", 64)
    return LLM(model, block_size=4, num_blocks=blocks, scheduler=SchedulerConfig(**config))


CONFIGS = {
    "continuous": dict(max_batch=4, max_tokens_per_step=512),
    "chunked prefill": dict(max_batch=4, max_tokens_per_step=8),
    "whole prefills": dict(max_batch=3, max_tokens_per_step=64, chunked_prefill=False),
    "static": dict(policy="static", max_batch=3),
    "dynamic": dict(policy="dynamic", max_batch=3, max_wait=0.0),
    "random preemption": dict(max_batch=4, max_tokens_per_step=16, random_preemption=0.3,
                              seed=1),
    "short pool": dict(max_batch=6, max_tokens_per_step=64, num_blocks=24),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_greedy_outputs_equal_generate_alone(tiny, config):
    llm = engine(tiny, **config)
    params = SamplingParams(max_tokens=12)
    outputs = llm.generate(PROMPTS, params, progress=False)
    assert [o.tokens for o in outputs] == [alone(tiny, p, params) for p in PROMPTS]
    assert llm.free_blocks() == llm.blocks.num_blocks


def test_mixed_sampling_parameters_are_reproducible_per_request(tiny):
    params = [SamplingParams(max_tokens=10),
              SamplingParams(temperature=1.0, top_k=20, seed=1, max_tokens=10),
              SamplingParams(temperature=0.8, top_p=0.9, seed=2, max_tokens=7),
              SamplingParams(repetition_penalty=2.0, max_tokens=9),
              SamplingParams(temperature=1.2, seed=3, max_tokens=5),
              SamplingParams(temperature=1.0, top_k=5, top_p=0.8, seed=4, max_tokens=11)]
    outputs = engine(tiny, max_batch=4, max_tokens_per_step=8).generate(PROMPTS, params,
                                                                         progress=False)
    expected = [alone(tiny, p, sp) for p, sp in zip(PROMPTS, params, strict=True)]
    assert [o.tokens for o in outputs] == expected


def test_stop_tokens_end_a_request(tiny):
    params = SamplingParams(max_tokens=12)
    expected = alone(tiny, PROMPTS[0], params)
    stop = expected[4]
    out = engine(tiny).generate([PROMPTS[0]], SamplingParams(max_tokens=12,
                                                             stop_token_ids=(stop,)),
                                progress=False)[0]
    assert out.tokens == expected[:expected.index(stop) + 1] and out.finish_reason == "stop"


def test_prefix_cache_hits_compute_less_and_change_nothing(tiny):
    system = list(range(100, 140))  # ten full blocks of 4
    prompts = [system + [i, i + 1] for i in range(5)]
    params = SamplingParams(max_tokens=6)
    llm = engine(tiny, max_batch=1)  # one at a time: every later request can hit
    computed = []
    for prompt in prompts:
        seq = llm.add_request(prompt, params)
        llm.blocks.start(seq)
        computed.append(seq.num_uncomputed)
        llm.blocks.free(seq)
        seq.num_computed = 0
        while llm.has_work:
            llm.step()
        assert seq.output == alone(tiny, prompt, params)
    assert computed[0] == 42 and all(n == 2 for n in computed[1:])


def test_stream_yields_the_tokens_and_closing_it_frees_the_blocks(tiny):
    llm = engine(tiny)
    params = SamplingParams(max_tokens=10)
    assert list(llm.stream(PROMPTS[3], params)) == alone(tiny, PROMPTS[3], params)
    stream = llm.stream(PROMPTS[3], params)
    next(stream)
    assert llm.free_blocks() < llm.blocks.num_blocks
    stream.close()
    assert llm.free_blocks() == llm.blocks.num_blocks


def test_bad_requests_fail_alone_and_free_their_blocks(tiny):
    llm = engine(tiny, num_blocks=30)  # 120 slots: the last request needs 125
    good = SamplingParams(max_tokens=5)
    prompts = [[], list(range(125)), PROMPTS[0], [1, 2, 300], PROMPTS[1], PROMPTS[3]]
    params = [good, good, good, good, good, SamplingParams(max_tokens=85)]
    outputs = llm.generate(prompts, params, progress=False)
    errors = [o.error for o in outputs]
    assert "empty" in errors[0] and "context" in errors[1] and "vocabulary" in errors[3]
    assert "KV blocks" in errors[5]
    for i in (2, 4):
        assert errors[i] is None and outputs[i].tokens == alone(tiny, prompts[i], good)
    assert llm.free_blocks() == 30
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_aborting_a_running_request_frees_its_blocks(tiny):
    llm = engine(tiny)
    keep = llm.add_request(PROMPTS[0], SamplingParams(max_tokens=8))
    drop = llm.add_request(PROMPTS[3], SamplingParams(max_tokens=8))
    llm.step()
    llm.abort(drop)
    assert drop.finish_reason.value == "abort"
    while llm.has_work:
        llm.step()
    assert keep.output == alone(tiny, PROMPTS[0], SamplingParams(max_tokens=8))
    assert llm.free_blocks() == llm.blocks.num_blocks


def test_soak_a_thousand_short_requests_leak_no_blocks(tiny):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 12, (1000,), generator=g)]
    llm = engine(tiny, max_batch=16, max_tokens_per_step=64, num_blocks=48)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=3), progress=False)
    assert all(len(o.tokens) == 3 and o.error is None for o in outputs)
    assert llm.free_blocks() == 48


@pytest.mark.smollm2
def test_smollm2_engine_equals_generate(smollm2, tokenizer):
    questions = ["What is 2 + 2?", "Write a haiku about the sea.", "Name a colour."]
    prompts = [tokenizer.chat_prompt(q) for q in questions]
    llm = LLM(smollm2, tokenizer=tokenizer, block_size=16, num_blocks=64,
              scheduler=SchedulerConfig(max_batch=3, max_tokens_per_step=32))
    params = SamplingParams(max_tokens=16)
    outputs = llm.generate(prompts, params, progress=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        expected = generate(smollm2, prompt, 16, stop_tokens=tokenizer.stop_tokens)[0]
        assert out.tokens == expected
        assert out.text == tokenizer.decode(expected)
