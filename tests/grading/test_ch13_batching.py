"""Graded tests for chapter 13 (batching and scheduling).

Oracles: the library's budget plan (``plan_chunked_step``), its metrics, its scheduler run
with a stand-in model, its cost model and simulator, and plain ``generate`` for the engine
run on a tiny random model.
"""

from __future__ import annotations

import random

import pytest
import torch

from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.serve import metrics as library_metrics
from minillm.serve.block_manager import BlockManager
from minillm.serve.scheduler import Scheduler, plan_chunked_step
from minillm.serve.sequence import Sequence
from minillm.serve.simulator import CostModel, simulate
from minillm.serve.workload import TraceRequest
from minillm.testing import varied_random_model

impl = load_impl("ch13_batching")


# -- 13.1 one step of continuous batching -----------------------------------------------

@pytest.mark.exercise("13.1", points=2)
@pytest.mark.parametrize("running, waiting, budget, seats, expected", [
    ([1, 1, 1], [20], 8, 4, [1, 1, 1, 5]),  # decodes, then a chunk of the waiting prompt
    ([30, 1, 1], [5], 8, 4, [6, 1, 1]),  # decodes before an older request's prompt chunk
    ([9, 1, 4], [], 8, 4, [7, 1, 0]),  # started prompts in the order they started
    ([1, 1], [3, 3, 3], 64, 3, [1, 1, 3]),  # seats: three requests at most
    ([1, 1, 1], [4], 2, 8, [1, 1, 0]),  # the budget runs out before the last decode
    ([], [4, 9, 2], 10, 8, [4, 6]),  # the queue joins in order, the last with a chunk
    ([], [], 16, 4, []),
])
def test_plan_examples(running, waiting, budget, seats, expected):
    assert impl.plan_step(list(running), list(waiting), budget, seats) == expected


@pytest.mark.exercise("13.1", points=2)
def test_plan_matches_the_library_on_random_queues():
    rng = random.Random(0)
    for _ in range(500):
        seats = rng.randint(1, 8)
        running = [rng.choice([1, 1, 1, rng.randint(2, 40)]) for _ in range(rng.randint(0, seats))]
        waiting = [rng.randint(1, 60) for _ in range(rng.randint(0, 6))]
        budget = rng.randint(1, 80)
        assert impl.plan_step(list(running), list(waiting), budget, seats) == \
            plan_chunked_step(running, waiting, budget, seats), (running, waiting, budget, seats)


CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)
PROMPTS = [list(range(10, 37)), [1, 2, 3], [40, 41, 42, 43, 44], [7] * 12, [5, 9]]
PARAMS = SamplingParams(max_tokens=8)


@pytest.fixture(scope="module")
def model():
    return varied_random_model(CONFIG)


@pytest.mark.exercise("13.1", points=2)
def test_your_plan_runs_the_engine(model):
    """Your plan schedules every step (budget 8, three seats): same tokens as generate()."""
    llm = LLM(model, block_size=4, num_blocks=48,
              scheduler=SchedulerConfig(max_batch=3, max_tokens_per_step=8, plan=impl.plan_step))
    outputs = llm.generate(PROMPTS, PARAMS, progress=False)
    assert [o.tokens for o in outputs] == [generate(model, p, 8, PARAMS)[0] for p in PROMPTS]


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
        seq = Sequence(prompt=[1], arrival_time=rng.uniform(0, 100))
        gaps = [rng.expovariate(10) for _ in range(rng.randint(1, 30))]
        seq.token_times = list(seq.arrival_time + torch.tensor(gaps).cumsum(0).numpy())
        got = impl.request_latencies(seq.arrival_time, seq.token_times)
        assert got["ttft"] == pytest.approx(library_metrics.ttft(seq))
        assert got["e2e"] == pytest.approx(library_metrics.e2e(seq))
        assert got["tpot"] == pytest.approx(library_metrics.tpot(seq))
        assert list(got["itl"]) == pytest.approx(library_metrics.itl(seq))


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
        scheduler.finish_step(step, {s.id: [5] for s, n in step.work
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
