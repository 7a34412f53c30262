"""Graded tests for chapter 13 (batching and scheduling).

The lab (13.1, the scheduling policy ``schedule_step``) is graded on random scheduler
states drawn by Hypothesis (fixed, derandomized: the same cases on every run, none of them
shown to you) against the library's policy and the engine's check of a decision, on the
edge cases where mistakes hide (nothing waiting, no free block, a budget of one token, full
seats, a prompt longer than the budget, everyone out of blocks, a cached prefix, shared
blocks), and in the engine: a tiny random model serves a trace on a pool too small for it
with your policy making every decision, and must give the tokens plain ``generate`` gives
each request alone and, step for step, the library's schedule.

What a preemption costs (``recompute_tokens``, part of 13.1) is checked against the block
manager's cache hits on random restarts. The warm-ups (13.2-13.4) are checked against the
library's metrics, its scheduler run with a stand-in model, and its cost model and
simulator.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.config import ModelConfig
from minillm.engine import policies
from minillm.engine.block_manager import BlockManager, chain_hash
from minillm.engine.policies import (
    RunningView,
    SchedulerState,
    StepDecision,
    WaitingView,
    check_decision,
)
from minillm.engine.sampler import Sampled
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence
from minillm.engine.simulator import CostModel, simulate
from minillm.experiments.workload import TraceRequest
from minillm.grading import load_impl
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.serve import metrics as library_metrics
from minillm.testing import varied_random_model

impl = load_impl("ch13_batching")


# -- 13.1 the lab: the scheduling policy ----------------------------------------------

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

# -- 13.2 latency metrics ---------------------------------------------------------------

@pytest.mark.exercise("13.2", points=2)
def test_latencies_example():
    got = impl.request_latencies(10.0, [10.5, 10.7, 11.0, 11.5])
    assert got["ttft"] == pytest.approx(0.5) and got["e2e"] == pytest.approx(1.5)
    assert got["tpot"] == pytest.approx(1.0 / 3)  # (E2E - TTFT) / (n - 1)
    assert got["itl"] == pytest.approx([0.2, 0.3, 0.5])


@pytest.mark.exercise("13.2", points=1)
def test_latencies_of_a_single_token():
    got = impl.request_latencies(2.0, [2.25])
    assert got["ttft"] == pytest.approx(0.25) and got["e2e"] == pytest.approx(0.25)
    assert got["tpot"] is None and list(got["itl"]) == []


@pytest.mark.exercise("13.2", points=1)
def test_latencies_match_the_library():
    rng = random.Random(2)
    for _ in range(100):
        arrival = rng.uniform(0, 100)
        gaps = [rng.expovariate(10) for _ in range(rng.randint(1, 30))]
        sample = SimpleNamespace(arrival_time=arrival,  # what the metrics read of a sample
                                 token_times=list(arrival + torch.tensor(gaps).cumsum(0).numpy()))
        got = impl.request_latencies(sample.arrival_time, sample.token_times)
        assert got["ttft"] == pytest.approx(library_metrics.ttft(sample))
        assert got["e2e"] == pytest.approx(library_metrics.e2e(sample))
        assert got["tpot"] == pytest.approx(library_metrics.tpot(sample))
        assert list(got["itl"]) == pytest.approx(library_metrics.itl(sample))


# -- 13.3 static batching ---------------------------------------------------------------

def scheduler_steps(lengths: list[int], max_batch: int) -> int:
    """Steps of the library's static scheduler, with a stand-in for the model."""
    scheduler = Scheduler(SchedulerConfig(policy="static", max_batch=max_batch,
                                          chunked_prefill=False), BlockManager(256, 4))
    for m in lengths:
        scheduler.add(Sequence(prompt=[1, 2, 3], max_tokens=m))
    steps = 0
    while scheduler.has_work:
        step = scheduler.schedule()
        scheduler.apply(step, {}, {s.id: Sampled([5]) for s, n in step.work
                                   if s.num_computed + n == s.num_tokens})
        steps += 1
    return steps


@pytest.mark.exercise("13.3", points=1)
def test_static_batching_steps_example():
    assert impl.static_batching_steps([3, 10, 2, 2], 2) == 12  # max(3, 10) + max(2, 2)
    assert impl.static_batching_steps([4, 4, 4], 8) == 4
    assert impl.static_batching_steps([1, 9, 1, 1, 1], 1) == 13


@pytest.mark.exercise("13.3", points=2)
def test_static_batching_steps_match_the_scheduler():
    rng = random.Random(3)
    for _ in range(20):
        lengths = [rng.choice([1, 2, 4, 30]) for _ in range(rng.randint(1, 12))]
        max_batch = rng.randint(1, 5)
        assert impl.static_batching_steps(lengths, max_batch) == \
            scheduler_steps(lengths, max_batch), (lengths, max_batch)


# -- 13.4 the roofline step time --------------------------------------------------------

LLAMA2_7B = ModelConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                        num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128,
                        tie_word_embeddings=False)


@pytest.mark.exercise("13.4", points=2)
def test_decode_is_memory_bound_and_prefill_compute_bound():
    a100 = CostModel.for_model(LLAMA2_7B, bandwidth=2.0e12, flops=312e12, overhead=0.001)
    decode = impl.roofline_step_time(8, 8 * 1000, a100)
    assert decode == pytest.approx(0.001 + (a100.weight_bytes + 8000 * a100.kv_bytes_per_token)
                                   / 2.0e12)
    prefill = impl.roofline_step_time(4096, 0, a100)
    assert prefill == pytest.approx(0.001 + 4096 * a100.flops_per_token / 312e12)


@pytest.mark.exercise("13.4", points=1)
def test_step_time_matches_the_library():
    rng = random.Random(4)
    for _ in range(200):
        cost = CostModel(rng.uniform(1e8, 1e10), rng.uniform(1e3, 1e6), rng.uniform(1e8, 1e10),
                         bandwidth=rng.uniform(1e10, 1e12), flops=rng.uniform(1e11, 1e14),
                         overhead=rng.uniform(0, 0.01))
        n, c = rng.randint(1, 4096), rng.randint(0, 100_000)
        assert impl.roofline_step_time(n, c, cost) == pytest.approx(cost.step_time(n, c))


class YourCostModel(CostModel):
    def step_time(self, new_tokens, cached_tokens):
        return impl.roofline_step_time(new_tokens, cached_tokens, self)


@pytest.mark.exercise("13.4", points=1)
def test_your_step_time_drives_the_simulator():
    numbers = dict(weight_bytes=1e9, kv_bytes_per_token=1e5, flops_per_token=2e8,
                   bandwidth=20e9, flops=200e9, overhead=0.001)
    trace = [TraceRequest(0.02 * i, [1] * (20 + 37 * (i % 3)), 5 + 7 * (i % 4))
             for i in range(24)]
    config = SchedulerConfig(max_batch=6, max_tokens_per_step=64)
    yours = simulate(trace, YourCostModel(**numbers), config, num_blocks=512)
    library = simulate(trace, CostModel(**numbers), config, num_blocks=512)
    assert [len(s.token_times) for s in yours] == [len(s.token_times) for s in library]
    assert [t for s in yours for t in s.token_times] == \
        pytest.approx([t for s in library for t in s.token_times])


# -- 13.1 what a preemption costs (the lab's third part) -------------------------------

@pytest.mark.exercise("13.1", points=1)
@pytest.mark.parametrize("computed, num_tokens, cached_blocks, block_size, expected", [
    (40, 41, 0, 16, 40),  # nothing left in the cache: all of it again
    (40, 41, 2, 16, 8),  # two blocks back: only the third block's tokens
    (20, 30, 1, 4, 16),  # one block of 4 back: 16 of its 20 tokens again
    (47, 48, 3, 16, 15),  # the block holding the last token is computed, cached or not
    (5, 40, 3, 4, 0),  # a twin request cached more than it had computed
])
def test_recompute_examples(computed, num_tokens, cached_blocks, block_size, expected):
    assert impl.recompute_tokens(computed, num_tokens, cached_blocks, block_size) == expected


def leading_cached_blocks(blocks: BlockManager, tokens: list[int]) -> int:
    """How many of the full blocks of ``tokens``, from the first, the prefix cache holds."""
    size, parent, count = blocks.block_size, None, 0
    for i in range(len(tokens) // size):
        parent = chain_hash(parent, tuple(tokens[i * size:(i + 1) * size]))
        if parent not in blocks.cached:
            break
        count += 1
    return count


def compute(blocks: BlockManager, seq: Sequence, upto: int) -> None:
    """Start ``seq`` (cache hits first) and compute its tokens up to ``upto``, naming its
    full blocks in the cache."""
    blocks.start(seq)
    upto = max(upto, seq.num_computed)
    blocks.reserve(seq, upto - seq.num_computed)
    seq.num_computed = upto
    blocks.commit(seq)


@pytest.mark.exercise("13.1", points=2)
def test_recompute_matches_the_block_manager_on_random_restarts():
    """A request computes part of its tokens and is preempted; a twin (same first tokens)
    may fill the cache before or after it, and other requests take some of the freed
    blocks; then it restarts where the block manager's cache hits let it."""
    rng = random.Random(6)
    for _ in range(400):
        size = rng.choice([2, 4, 8])
        blocks = BlockManager(num_blocks=40, block_size=size)
        tokens = [rng.randint(0, 2) for _ in range(rng.randint(1, 40))]
        victim = Sequence(prompt=list(tokens))
        twin = Sequence(prompt=tokens[:rng.randint(1, len(tokens))] + [rng.randint(0, 2)] * 9)
        runs = [(victim, rng.randint(0, len(tokens) - 1)), (twin, rng.randint(0, 30))]
        for seq, upto in runs if rng.random() < 0.5 else runs[::-1]:
            compute(blocks, seq, min(upto, seq.num_tokens - 1))
            blocks.free(seq)  # the victim is preempted; the twin is done (or preempted too)
        computed, victim.num_computed = victim.num_computed, 0
        other = Sequence(prompt=[7] * (size * rng.randint(0, 12)))
        compute(blocks, other, other.num_tokens)  # takes free blocks, least recently freed first
        cached = leading_cached_blocks(blocks, tokens)
        expected = max(computed - blocks.start(victim), 0)  # it restarts after the cache hits
        assert impl.recompute_tokens(computed, len(tokens), cached, size) == expected, \
            (computed, len(tokens), cached, size)
