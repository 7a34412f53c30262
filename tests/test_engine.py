"""The serving engine gives every request exactly what ``generate`` gives it alone — under
continuous batching, chunked prefill, random preemption, prefix-cache hits and mixed
sampling parameters — and bad requests fail alone, leaking no blocks. The engine core on
its own: its deltas add up to the client's outputs, it refuses what it cannot serve
before queueing anything, and what it hands out cannot be changed."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import FrozenInstanceError

import pytest
import torch
from engine_driving import preempt_at_random, sequence_of

from minillm.engine import EngineConfig, EngineCore, RequestRejected
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


def engine(model, on_step=None, **config) -> LLM:
    """An engine with blocks of 4; ``random_preemption=(chance, seed)`` preempts a running
    request at random before each step."""
    blocks = config.pop("num_blocks", 64)
    preemption = config.pop("random_preemption", None)
    llm = LLM(model, block_size=4, num_blocks=blocks, on_step=on_step,
              scheduler=SchedulerConfig(**config))
    return llm if preemption is None else preempt_at_random(llm, *preemption)


def spy_on_preemptions(llm: LLM) -> list:
    """The sequences the scheduler preempts from now on (random ones included)."""
    scheduler, preempted = llm.core.scheduler, []
    preempt = scheduler.preempt

    def recorded(seq, *step_and_cost):
        preempted.append(seq)
        preempt(seq, *step_and_cost)

    scheduler.preempt = recorded
    return preempted


CONFIGS = {
    "continuous": dict(max_batch=4, max_tokens_per_step=512),
    "chunked prefill": dict(max_batch=4, max_tokens_per_step=8),
    "whole prefills": dict(max_batch=3, max_tokens_per_step=64, chunked_prefill=False),
    "static": dict(policy="static", max_batch=3),
    "dynamic": dict(policy="dynamic", max_batch=3, max_wait=0.0),
    "random preemption": dict(max_batch=4, max_tokens_per_step=16,
                              random_preemption=(0.3, 1)),
    "short pool": dict(max_batch=6, max_tokens_per_step=64, num_blocks=24),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_greedy_outputs_equal_generate_alone(tiny, config):
    llm = engine(tiny, **config)
    preempted = spy_on_preemptions(llm)
    params = SamplingParams(max_tokens=12)
    outputs = llm.generate(PROMPTS, params, progress=False)
    assert [o.tokens for o in outputs] == [alone(tiny, p, params) for p in PROMPTS]
    assert llm.free_blocks() == llm.blocks.num_blocks
    if "random_preemption" in config:
        assert preempted  # the preemptions happened, and changed nothing


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
    reports = []
    llm = engine(tiny, on_step=reports.append, max_batch=1)  # one at a time: later ones hit
    computed, first_work = [], []
    for prompt in prompts:
        request = llm.add_request(prompt, params)
        seq = sequence_of(llm, request)
        llm.blocks.start(seq)
        computed.append(seq.num_uncomputed)
        llm.blocks.free(seq)
        seq.num_computed = 0
        reports.clear()
        while llm.has_work:
            llm.step()
        assert seq.output == llm.output(request).tokens == alone(tiny, prompt, params)
        first_work.append(reports[0].work)
    assert computed[0] == 42 and all(n == 2 for n in computed[1:])
    # what the engine computed: the whole first prompt, then only the uncached last 2 tokens
    assert [(w.start, w.tokens) for (w,) in first_work] == [(0, 42)] + [(40, 2)] * 4


def test_stream_yields_the_tokens_and_closing_it_frees_the_blocks(tiny):
    llm = engine(tiny)
    params = SamplingParams(max_tokens=10)
    streamed = [t for update in llm.stream(PROMPTS[3], params) for t in update.token_ids]
    assert streamed == alone(tiny, PROMPTS[3], params)
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
    dropped = sequence_of(llm, drop)
    llm.step()
    assert dropped.block_table  # running, holding blocks
    llm.abort(drop)
    assert dropped.finish_reason.value == "abort" and not dropped.block_table
    assert llm.output(drop).finish_reason == "abort"
    while llm.has_work:
        llm.step()
    assert llm.output(keep).tokens == alone(tiny, PROMPTS[0], SamplingParams(max_tokens=8))
    assert llm.free_blocks() == llm.blocks.num_blocks


# -- the engine core on its own ----------------------------------------------------------

def core(model, num_blocks=64, **scheduler) -> EngineCore:
    return EngineCore(model, EngineConfig(block_size=4, num_blocks=num_blocks,
                                          scheduler=SchedulerConfig(**scheduler)))


def test_the_cores_deltas_add_up_to_the_clients_outputs(tiny):
    """The same requests and the same abort, through the core and through ``LLM``: each
    sample's deltas, concatenated, are its output, and the last one says how it ended."""
    params = [SamplingParams(max_tokens=10),
              SamplingParams(temperature=1.0, seed=7, max_tokens=9, n=2),
              SamplingParams(max_tokens=12, stop_token_ids=(alone(tiny, PROMPTS[2],
                                                                  SamplingParams())[3],)),
              SamplingParams(max_tokens=12), SamplingParams(max_tokens=6)]
    engine_core = core(tiny, max_batch=4, max_tokens_per_step=8)
    llm = engine(tiny, max_batch=4, max_tokens_per_step=8)
    tokens, ends = defaultdict(list), {}
    for request, (prompt, sp) in enumerate(zip(PROMPTS, params, strict=False)):
        engine_core.add(request, prompt, sp)
        assert llm.add_request(prompt, sp) == request
    while engine_core.has_work:
        if len(tokens[3, 0]) == 2:  # mid-way, the client cancels request 3
            engine_core.abort(3)
            llm.abort(3)
        deltas = engine_core.step()
        llm.step()
        for delta in deltas:
            assert (delta.request_id, delta.index) not in ends  # nothing after the end
            tokens[delta.request_id, delta.index] += delta.token_ids
            if delta.finished:
                ends[delta.request_id, delta.index] = delta.finish_reason
    assert not llm.has_work and engine_core.blocks.num_free == 64 and not engine_core.requests
    outputs = [llm.output(request) for request in range(len(params))]
    for request, output in enumerate(outputs):
        for sample in output.outputs:
            assert tokens[request, sample.index] == sample.tokens
            assert ends.get((request, sample.index), "abort") == sample.finish_reason
    assert outputs[0].tokens == alone(tiny, PROMPTS[0], params[0])
    assert outputs[2].finish_reason == "stop" and outputs[3].finish_reason == "abort"
    assert len(outputs[3].tokens) == 2


def test_the_core_refuses_what_it_cannot_serve_and_queues_nothing(tiny):
    engine_core = core(tiny, num_blocks=30, max_batch=4)
    good = SamplingParams(max_tokens=5)
    refused = [([], good, "empty"), (list(range(125)), good, "context"),
               ([1, 2, 300], good, "vocabulary"),
               (PROMPTS[3], SamplingParams(max_tokens=85), "KV blocks"),
               (PROMPTS[0], SamplingParams(max_tokens=4, n=5), "max_batch"),
               (PROMPTS[0], SamplingParams(logit_bias={999: 1.0}), "logit_bias")]
    for prompt, params, reason in refused:
        with pytest.raises(RequestRejected, match=reason):
            engine_core.add(0, prompt, params)
        assert not engine_core.has_work and not engine_core.requests
        assert engine_core.num_waiting == engine_core.num_running == 0
        assert engine_core.blocks.num_free == 30
        assert engine_core.step() == []
    engine_core.add(0, PROMPTS[0], good)  # the id was never taken
    tokens = []
    while engine_core.has_work:
        tokens += [t for delta in engine_core.step() for t in delta.token_ids]
    assert tokens == alone(tiny, PROMPTS[0], good) and engine_core.blocks.num_free == 30


def test_the_core_refuses_a_request_id_in_use(tiny):
    engine_core = core(tiny)
    engine_core.add(7, PROMPTS[0], SamplingParams(max_tokens=6))
    first = engine_core.requests[7]
    with pytest.raises(RequestRejected, match="already in use"):
        engine_core.add(7, PROMPTS[1], SamplingParams(max_tokens=6))
    assert engine_core.requests[7] is first and engine_core.num_waiting == 1
    tokens = []
    while engine_core.has_work:
        for delta in engine_core.step():
            assert delta.request_id == 7 and delta.index == 0
            tokens += delta.token_ids
    assert tokens == alone(tiny, PROMPTS[0], SamplingParams(max_tokens=6))
    assert engine_core.blocks.num_free == 64


def test_what_the_core_hands_out_cannot_be_changed(tiny):
    reports = []
    engine_core = EngineCore(tiny, EngineConfig(block_size=4, num_blocks=64),
                             on_step=reports.append)
    engine_core.add(0, PROMPTS[0], SamplingParams(max_tokens=3, logprobs=2))
    delta = engine_core.step()[0]
    assert isinstance(delta.token_ids, tuple) and isinstance(delta.logprobs, tuple)
    with pytest.raises(AttributeError):  # a named tuple's fields are read-only
        delta.token_ids = (1, 2, 3)
    with pytest.raises(AttributeError):
        delta.finish_reason = "stop"
    report = reports[-1]
    assert isinstance(report.work, tuple) and isinstance(report.preempted, tuple)
    with pytest.raises(FrozenInstanceError):
        report.work = ()
    with pytest.raises(AttributeError):  # a Work is a named tuple
        report.work[0].tokens = 0


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
