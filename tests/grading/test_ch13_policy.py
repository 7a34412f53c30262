"""Graded tests for chapter 13's lab (13.1): the scheduling policy, ``schedule_step``.

It is graded on random scheduler states drawn by Hypothesis (fixed, derandomized: the same
cases on every run, none of them shown to you) against the library's policy
(:func:`minillm.engine.policies.schedule_step`) and the engine's own check of a decision,
on the edge cases where mistakes hide (nothing waiting, no free block, a budget of one
token, full seats, a prompt longer than the budget, everyone out of blocks, a cached
prefix, shared blocks), and in the engine: a tiny random model serves a trace on a pool too
small for it with your policy making every decision, and must give the tokens plain
``generate`` gives each request alone and, step for step, the library's schedule.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.config import ModelConfig
from minillm.engine import policies
from minillm.engine.policies import (
    RunningView,
    SchedulerState,
    StepDecision,
    WaitingView,
    check_decision,
)
from minillm.grading import load_impl
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import varied_random_model

impl = load_impl("ch13_batching")
HIDDEN = settings(max_examples=400, derandomize=True, database=None, deadline=None)


def make_state(running, waiting=(), free=8, budget=16, seats=4, size=4, shared=0):
    """A state from (uncomputed, computed[, cached blocks]) per running request and
    (uncomputed[, free cached blocks]) per waiting one; each running request holds the
    blocks its computed tokens fill, the first ``shared`` of them shared by all (forks)."""
    views, next_id, common = [], 0, list(range(shared))
    next_id = shared
    for r in running:
        uncomputed, computed, cached = (*r, 0)[:3]
        count = max(-(-computed // size), 0)
        own = list(range(next_id, next_id + max(count - len(common), 0)))
        next_id += len(own)
        views.append(RunningView(uncomputed, computed, computed + uncomputed,
                                 tuple((common + own)[:max(count, 0)]), cached))
    refs: dict[int, int] = {}
    for view in views:
        for b in view.blocks:
            refs[b] = refs.get(b, 0) + 1
    return SchedulerState(tuple(views), tuple(WaitingView(*w) if isinstance(w, tuple)
                                              else WaitingView(w) for w in waiting),
                          free, size, budget, seats, refs)


@st.composite
def states(draw):
    """A step's state: running requests (about half decodes, some sharing their first
    blocks as forks do, sometimes more than the seats), waiting ones, a short pool."""
    size = draw(st.sampled_from([1, 2, 4]))
    running = []
    for _ in range(draw(st.integers(0, 6))):
        computed = draw(st.integers(1, 24))
        uncomputed = draw(st.one_of(st.just(1), st.integers(2, 40)))
        cached = draw(st.integers(0, computed // size))
        running.append((uncomputed, computed, cached))
    waiting = draw(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 2)), max_size=5))
    shared = draw(st.integers(0, 2)) if running else 0
    shared = min([shared] + [-(-c // size) for _, c, _ in running])
    return make_state(running, waiting, free=draw(st.integers(0, 12)),
                      budget=draw(st.integers(1, 64)), seats=draw(st.integers(1, 8)),
                      size=size, shared=shared)


def decide(state) -> StepDecision:
    decision = impl.schedule_step(state)
    return StepDecision(tuple(decision.tokens), tuple(decision.joins),
                        tuple(tuple(p) for p in decision.preempted))


@pytest.mark.exercise("13.1", points=2)
@HIDDEN
@given(states())
def test_your_decisions_pass_the_engines_check_on_random_states(state):
    check_decision(decide(state), state)  # budget, seats, needs, blocks, victims, progress


@pytest.mark.exercise("13.1", points=3)
@HIDDEN
@given(states())
def test_your_decisions_match_the_library_on_random_states(state):
    assert decide(state) == policies.schedule_step(state)


R = [(1, 7), (1, 5), (1, 9)]  # three decodes, each holding 2 blocks of 4


@pytest.mark.exercise("13.1", points=3)
@pytest.mark.parametrize("state, expected", [
    # nothing waiting: every decode gets its token
    (make_state(R), StepDecision((1, 1, 1))),
    # decodes first, then a chunk of the waiting prompt
    (make_state(R, [20]), StepDecision((1, 1, 1), (13,))),
    # decodes before an older request's prompt chunk, and the budget's end cuts it
    (make_state([(30, 4), (1, 5), (1, 6)], budget=8), StepDecision((6, 1, 1))),
    # a budget of one token: the oldest decode only
    (make_state(R, [5], budget=1), StepDecision((1, 0, 0))),
    # seats full: nobody joins
    (make_state(R, [5], seats=3), StepDecision((1, 1, 1))),
    # a prompt longer than the budget joins with a chunk
    (make_state([], [512], budget=64, free=64), StepDecision((), (64,))),
    # a joiner whose blocks do not fit waits, and so does everyone after it
    (make_state(R, [9, 1], free=2), StepDecision((1, 1, 1))),
    # a joiner's cached prefix is reused: only its own uncomputed tokens, and the cached
    # blocks nobody holds count against the free ones
    (make_state([], [(3, 2)], free=3), StepDecision((), (3,))),
    (make_state([], [(3, 2)], free=2), StepDecision((), ())),
    # no free block: decodes at a block's end need one; the latest started goes first,
    # and its blocks serve the others
    (make_state([(1, 8), (1, 8), (1, 5)], free=0),
     StepDecision((1, 1, 0), (), ((2, 5),))),
    # out of blocks with nobody after it: the requester itself goes
    (make_state([(1, 8)], free=0), StepDecision((0,), (), ((0, 8),))),
    # the victim's block is not enough: everyone goes, the requester last
    (make_state([(5, 4), (1, 4)], free=0), StepDecision((0, 0), (), ((1, 4), (0, 4)))),
    # a victim's cached blocks cut its cost
    (make_state([(1, 8), (1, 8, 1)], free=0), StepDecision((1, 0), (), ((1, 4),))),
    # forks sharing their only block: preempting the others frees nothing
    (make_state([(6, 4), (1, 4), (1, 4)], free=0, shared=1),
     StepDecision((0, 0, 0), (), ((2, 4), (1, 4), (0, 4)))),
])
def test_edge_cases(state, expected):
    assert decide(state) == expected


CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)
PROMPTS = [list(range(10, 37)), [1, 2, 3], [40, 41, 42, 43, 44], [7] * 12, [5, 9]]
LONGER = SamplingParams(max_tokens=16)
TRACE = [(0, PROMPTS[0]), (0, PROMPTS[1]), (2, PROMPTS[2]), (3, PROMPTS[3]), (6, PROMPTS[4])]
# (the step before which it arrives, its prompt)


@pytest.fixture(scope="module")
def model():
    return varied_random_model(CONFIG)


def serve_trace(model, policy) -> tuple[list[list[int]], list[tuple]]:
    """Serve TRACE, 16 tokens each, on a pool of 12 blocks of 4 (one prompt and its answer
    take up to 11): each request's tokens, and per step what it computed (request, tokens,
    start) and whom it preempted, at what cost."""
    history = []
    llm = LLM(model, block_size=4, num_blocks=12,
              scheduler=SchedulerConfig(max_batch=4, max_tokens_per_step=12,
                                        step_policy=policy),
              on_step=lambda report: history.append(
                  ([tuple(work) for work in report.work],
                   [(p.request_id, p.recompute) for p in report.preempted])))
    pending, ids, step = list(TRACE), [], 0
    while pending or llm.has_work:
        while pending and pending[0][0] <= step:
            ids.append(llm.add_request(pending.pop(0)[1], LONGER))
        if llm.has_work:
            llm.step()
        step += 1
    assert llm.free_blocks() == 12
    return [llm.output(i).tokens for i in ids], history


@pytest.mark.exercise("13.1", points=3)
def test_your_policy_runs_the_engine_on_a_trace(model):
    """Your policy makes every decision of an engine serving a trace on a pool too small
    for it: the tokens generate() gives each request alone, and step for step the work,
    the victims and their costs of the library's policy."""
    calls = []

    def policy(state):
        calls.append(state)
        return impl.schedule_step(state)

    tokens, history = serve_trace(model, policy)
    assert calls and any(victims for _, victims in history), "the pool should have been short"
    assert tokens == [generate(model, p, 16, LONGER)[0] for _, p in TRACE]
    assert history == serve_trace(model, policies.schedule_step)[1]
