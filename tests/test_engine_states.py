"""The engine under random sequences of add / abort / step with random sampling parameters
(Hypothesis's stateful testing): after every operation the free and used KV blocks add up
to the pool and no finished request holds a block; every client output is what the core's
sequences hold; every greedy request that ran to its end got exactly the tokens
``generate`` gives it alone; at the end every block is free."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minillm import reference
from minillm.config import ModelConfig
from minillm.sampling import SEED_RANGE, SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import varied_random_model

CONFIG = ModelConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64)
MODEL = varied_random_model(CONFIG)
POOL = 24  # blocks of 4 tokens: a short pool, so requests preempt each other
EXPECTED: dict[tuple, list[int]] = {}  # (prompt, max_tokens, stops) -> generate's tokens

prompts = st.lists(st.integers(0, CONFIG.vocab_size - 1), min_size=1, max_size=20)
sampling = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 0.0, 1e-30, 0.5, 1.0, 2.0]),
    "top_k": st.sampled_from([0, 1, 5, 10**6]),
    "top_p": st.sampled_from([1.0, 0.5, 1e-9]),
    "seed": st.one_of(st.none(), st.integers(*SEED_RANGE)),
    "n": st.integers(1, 3),
    "max_tokens": st.integers(1, 12),
    "stop_token_ids": st.lists(st.integers(0, CONFIG.vocab_size - 1), max_size=3)
                        .map(tuple),
})


def alone(prompt: list[int], params: SamplingParams) -> list[int]:
    key = (tuple(prompt), params.max_tokens, params.stop_token_ids)
    if key not in EXPECTED:
        EXPECTED[key] = reference.generate(MODEL, prompt, params.max_tokens,
                                           stop_tokens=params.stop_token_ids)[0]
    return EXPECTED[key]


class EngineStates(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.llm = LLM(MODEL, block_size=4, num_blocks=POOL, scheduler=SchedulerConfig(
            max_batch=4, max_tokens_per_step=16, speculative_tokens=2))
        self.requests = []  # (request id, the core's sequence, its parameters)

    @rule(prompt=prompts, options=sampling)
    def add(self, prompt, options):
        params = SamplingParams(**options)
        request = self.llm.add_request(prompt, params)
        seq = self.llm.core.requests.get(request)  # the core forgets it once it is done
        assert seq is not None, self.llm.outputs[request].error  # every request fits
        self.requests.append((request, seq, params))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def abort(self, data):
        request, _, _ = data.draw(st.sampled_from(self.requests))
        self.llm.abort(request)

    @rule(steps=st.integers(1, 4))
    def step(self, steps):
        for _ in range(steps):
            self.llm.step()

    @invariant()
    def blocks_add_up(self):
        blocks = self.llm.blocks
        used = sum(1 for block in blocks.blocks if block.ref_count > 0)
        assert blocks.num_free + used == POOL

    @invariant()
    def finished_requests_hold_no_blocks(self):
        for _, seq, _ in self.requests:
            for sample in (seq, *seq.samples):
                assert not (sample.finished and sample.block_table)

    @invariant()
    def outputs_are_what_the_core_holds(self):
        for request, seq, _ in self.requests:
            output = self.llm.outputs[request]
            for sample, completion in zip((seq, *seq.samples), output.outputs, strict=True):
                assert completion.tokens == sample.output
                reason = sample.finish_reason and sample.finish_reason.value
                assert completion.finish_reason == reason

    @invariant()
    def greedy_requests_get_what_they_get_alone(self):
        for _, seq, params in self.requests:
            for sample in (seq, *seq.samples):
                if params.greedy and sample.finish_reason is not None and \
                        sample.finish_reason.value in ("stop", "length"):
                    assert sample.output == alone(seq.prompt, params)

    def teardown(self):
        while self.llm.has_work:
            self.llm.step()
        assert self.llm.free_blocks() == POOL


EngineStates.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
test_engine_states = EngineStates.TestCase
