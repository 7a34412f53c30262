"""Graded tests for chapter 13 (batching and scheduling).

The lab (13.1, the scheduling policy) is graded on random queues and pools drawn by
Hypothesis (fixed, derandomized: the same cases on every run, none of them shown to you),
against the library's policy (``plan_chunked_step``, ``preemption_victims``) and its block
manager, on the edge cases where mistakes hide, and in the engine: a tiny random model
serves a trace on a pool too small for it, with your policy making every decision, and
must give the tokens plain ``generate`` gives each request alone and the steps the
library's policy takes. The warm-ups (13.2-13.4) are checked against the library's metrics,
its scheduler run with a stand-in model, and its cost model and simulator.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.config import ModelConfig
from minillm.engine.block_manager import BlockManager, chain_hash
from minillm.engine.policies import check_victims, plan_chunked_step, preemption_victims
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


# -- 13.1 the lab: the scheduling policy ------------------------------------------------

HIDDEN = settings(max_examples=400, derandomize=True, database=None, deadline=None)


@st.composite
def queues(draw):
    """A step's state: running needs (about half decodes; sometimes more requests than
    seats, as a request with several samples makes), waiting needs, a budget, seats."""
    max_batch = draw(st.integers(1, 8))
    need = st.one_of(st.just(1), st.integers(2, 60))
    running = draw(st.lists(need, max_size=max_batch + 2))
    waiting = draw(st.lists(st.integers(1, 80), max_size=6))
    return running, waiting, draw(st.integers(0, 100)), max_batch


@pytest.mark.exercise("13.1", points=2)
@pytest.mark.parametrize("running, waiting, budget, seats, expected", [
    ([1, 1, 1], [20], 8, 4, [1, 1, 1, 5]),  # decodes, then a chunk of the waiting prompt
    ([30, 1, 1], [5], 8, 4, [6, 1, 1]),  # decodes before an older request's prompt chunk
    ([9, 1, 4], [], 8, 4, [7, 1, 0]),  # started prompts in the order they started
    ([1, 1], [3, 3, 3], 64, 3, [1, 1, 3]),  # seats: three requests at most
    ([1, 1, 1], [4], 2, 8, [1, 1, 0]),  # the budget runs out before the last decode
    ([], [4, 9, 2], 10, 8, [4, 6]),  # the queue joins in order, the last with a chunk
    ([], [512], 64, 4, [64]),  # a budget smaller than one prompt: a chunk
    ([1, 1], [5], 0, 4, [0, 0]),  # no budget: nothing runs, nobody joins
    ([], [], 16, 4, []),  # nothing to do
    ([1, 1, 1], [5, 5], 10, 2, [1, 1, 1]),  # more running than seats: nobody joins
    ([2], [3], 2, 4, [2]),  # exactly the budget: nothing left for the queue
])
def test_plan_examples(running, waiting, budget, seats, expected):
    assert impl.plan_step(list(running), list(waiting), budget, seats) == expected


def broken_plan_rule(counts, running, waiting, budget, max_batch) -> str | None:
    """The first rule of the plan's contract that ``counts`` breaks (None: it keeps them)."""
    started, joining = counts[:len(running)], counts[len(running):]
    if len(started) < len(running) or len(joining) > len(waiting):
        return "one count per running request, then one per joining waiting request"
    running_pairs = list(zip(started, running, strict=True))
    joining_pairs = list(zip(joining, waiting[:len(joining)], strict=True))
    if len(counts) > max(len(running), max_batch):
        return "more requests than max_batch"
    if any(not 0 <= n <= need for n, need in running_pairs) or \
            any(not 1 <= n <= need for n, need in joining_pairs):
        return "a request got more than it needs, or a joiner nothing"
    if sum(counts) > budget:
        return "over budget"
    decodes = [n for n, need in running_pairs if need == 1]
    prompts = [(n, need) for n, need in running_pairs if need > 1] + joining_pairs
    if 0 in decodes and any(n for n, _ in prompts):
        return "a prompt computed while a decode got nothing"
    for (n, need), (later, _) in zip(prompts, prompts[1:], strict=False):
        if n < need and later:
            return "a prompt (or joiner) served while an earlier one is still short"
    seated = waiting[:max(max_batch - len(running), 0)]
    if sum(counts) < min(budget, sum(running) + sum(seated)):
        return "budget left unspent while requests could use it"
    return None


@pytest.mark.exercise("13.1", points=2)
@HIDDEN
@given(queues())
def test_plan_keeps_its_contract_on_random_queues(state):
    running, waiting, budget, max_batch = state
    counts = list(impl.plan_step(list(running), list(waiting), budget, max_batch))
    assert broken_plan_rule(counts, running, waiting, budget, max_batch) is None, \
        (broken_plan_rule(counts, running, waiting, budget, max_batch), counts)


@pytest.mark.exercise("13.1", points=2)
@HIDDEN
@given(queues())
def test_plan_matches_the_library_on_random_queues(state):
    running, waiting, budget, max_batch = state
    assert list(impl.plan_step(list(running), list(waiting), budget, max_batch)) == \
        plan_chunked_step(running, waiting, budget, max_batch)


def test_the_contract_check_holds_the_library_to_it():  # not graded: the checker itself
    """The library's plan keeps every rule; typical wrong plans each break one."""
    cases = [([1, 1, 1], [20], 8, 4), ([30, 1, 1], [5], 8, 4), ([1, 1], [3, 3, 3], 64, 3),
             ([9, 1, 4], [], 8, 4), ([1, 1, 1], [5, 5], 10, 2)]
    for running, waiting, budget, seats in cases:
        assert broken_plan_rule(plan_chunked_step(running, waiting, budget, seats),
                                running, waiting, budget, seats) is None
    assert broken_plan_rule([6, 1, 1], [30, 1, 1], [], 7, 4) == "over budget"
    assert broken_plan_rule([7, 0, 1], [30, 1, 1], [], 8, 4) == \
        "a prompt computed while a decode got nothing"
    assert broken_plan_rule([1, 1, 3], [1, 1], [3, 3, 3], 64, 2) == \
        "more requests than max_batch"
    assert broken_plan_rule([1, 1, 2, 3], [1, 1, 9], [3], 8, 4) == \
        "a prompt (or joiner) served while an earlier one is still short"
    assert broken_plan_rule([1, 1], [1, 1], [3], 8, 4) == \
        "budget left unspent while requests could use it"


@pytest.mark.exercise("13.1", points=2)
@pytest.mark.parametrize("need, free, held, expected", [
    (2, 0, [3, 2, 4], [2]),  # the latest started frees enough
    (5, 1, [3, 2, 1, 1], [3, 2, 1]),  # latest first, until free + freed reaches the need
    (3, 1, [1, 2, 2], [2]),  # exactly enough: stop there
    (3, 0, [4, 1], [1, 0]),  # the others free too little: the requester goes last
    (2, 0, [6], [0]),  # nobody started after it: the requester goes
    (1, 1, [2, 3], []),  # enough blocks are free already
    (40, 2, [3, 4, 5], [2, 1, 0]),  # more than all of them hold: everyone, requester last
    (4, 0, [1, 1, 3], [2, 1]),  # the last victim tips it over, not one too few
])
def test_victims_examples(need, free, held, expected):
    assert list(impl.preemption_victims(need, free, list(held))) == expected


@st.composite
def pools(draw):
    """A short pool: blocks needed, blocks free, blocks held by the requester and by each
    running request that started after it."""
    held = draw(st.lists(st.integers(1, 8), min_size=1, max_size=7))
    return draw(st.integers(1, 30)), draw(st.integers(0, 6)), held


@pytest.mark.exercise("13.1", points=2)
@HIDDEN
@given(pools())
def test_victims_keep_the_contract_and_match_the_library_on_random_pools(pool):
    need, free, held = pool
    victims = list(impl.preemption_victims(need, free, list(held)))
    check_victims(victims, need, free, held)  # distinct, enough, the requester last, minimal
    later_first = [i for i in reversed(range(1, len(held)))][:len([v for v in victims if v])]
    assert [v for v in victims if v] == later_first, "the latest started go first"
    assert victims == preemption_victims(need, free, held)


CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)
PROMPTS = [list(range(10, 37)), [1, 2, 3], [40, 41, 42, 43, 44], [7] * 12, [5, 9]]
LONGER = SamplingParams(max_tokens=16)


@pytest.fixture(scope="module")
def model():
    return varied_random_model(CONFIG)
TRACE = [(0, PROMPTS[0]), (0, PROMPTS[1]), (2, PROMPTS[2]), (3, PROMPTS[3]), (6, PROMPTS[4])]
# (the step before which it arrives, its prompt)


def serve_trace(model, plan, preempt) -> tuple[list[list[int]], list[tuple]]:
    """Serve TRACE, 16 tokens each, on a pool of 12 blocks of 4 (one prompt and its answer
    take up to 11): each request's tokens, and per step what it computed (request, tokens,
    start) and whom it preempted."""
    history = []
    llm = LLM(model, block_size=4, num_blocks=12,
              scheduler=SchedulerConfig(max_batch=4, max_tokens_per_step=12, plan=plan,
                                        preempt=preempt),
              on_step=lambda report: history.append(
                  ([tuple(work) for work in report.work],
                   [p.request_id for p in report.preempted])))
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
    """Your plan and your victims make every decision of an engine serving a trace on a pool
    too small for it: the tokens generate() gives each request alone, and step for step
    the work and the preemptions of the library's policy."""
    calls = {"plan": 0, "preempt": 0}

    def plan(*state):
        calls["plan"] += 1
        return impl.plan_step(*state)

    def preempt(*pool):
        calls["preempt"] += 1
        return impl.preemption_victims(*pool)

    tokens, history = serve_trace(model, plan, preempt)
    assert calls["plan"] and calls["preempt"] and any(victims for _, victims in history), \
        "the pool should have been short"
    assert tokens == [generate(model, p, 16, LONGER)[0] for _, p in TRACE]
    assert history == serve_trace(model, plan_chunked_step, preemption_victims)[1]


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
