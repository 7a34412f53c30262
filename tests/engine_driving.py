"""White-box helpers for the engine's tests: reach into the core where a test must.

Clients see only deltas and outputs; a test of the engine may also look at the core's
sequences and blocks, and disturb its scheduling, to check what no output shows.
"""

from __future__ import annotations

import random

from minillm.engine.sequence import Sequence
from minillm.serve import LLM


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
