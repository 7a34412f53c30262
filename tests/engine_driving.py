"""White-box helpers for the engine's tests: reach into the core where a test must.

Clients see only deltas and outputs; a test of the engine may also look at the core's
sequences and blocks, and disturb its scheduling, to check what no output shows.
"""

from __future__ import annotations

import random

import torch

from minillm.engine.sequence import Sequence
from minillm.sampling import SamplingParams
from minillm.serve import LLM
from minillm.speculative import probabilities


def sequence_of(llm: LLM, request_id: int) -> Sequence:
    """The core's first sequence of a request (its samples in ``.samples``); take it right
    after ``add_request``: the core forgets a request once it has finished."""
    return llm.core.requests[request_id]


def preempt_at_random(llm: LLM, chance: float, seed: int = 0) -> LLM:
    """Before each step, with probability ``chance``, preempt one running sequence chosen
    at random (seeded): recomputation must not change a single token."""
    rng = random.Random(seed)
    scheduler = llm.core.scheduler
    schedule = scheduler.schedule

    def preempting_schedule(now=None):
        candidates = [seq for seq in scheduler.running if not seq.finished]
        if candidates and rng.random() < chance:
            scheduler.preempt(rng.choice(candidates))
        return schedule(now)

    scheduler.schedule = preempting_schedule
    return llm


def second_token_marginal(model, prompt: list[int], params) -> torch.Tensor:
    """The exact distribution of the second sampled token after ``prompt``:
    sum_t1 p(t1) p(t2 | t1), over the whole (tiny) vocabulary."""
    with torch.no_grad():
        first = probabilities(model(torch.tensor([prompt]))[0, -1], params)
        after = model(torch.tensor([prompt + [t] for t in range(len(first))]))[:, -1]
        return (first[:, None] * probabilities(after, params)).sum(0)


def second_tokens_drawn(llm: LLM, prompt: list[int], count: int,
                        vocab_size: int) -> tuple[torch.Tensor, list]:
    """Sample ``count`` seeded 3-token continuations of ``prompt`` (temperature 1) in one
    engine: the empirical distribution of their second tokens, and the samples."""
    requests = [llm.add_request(prompt, SamplingParams(temperature=1.0, seed=i, max_tokens=3))
                for i in range(count)]
    while llm.has_work:
        llm.step()
    samples = [llm.output(r).outputs[0] for r in requests]
    tokens = torch.tensor([s.tokens[1] for s in samples])
    return torch.bincount(tokens, minlength=vocab_size) / count, samples
