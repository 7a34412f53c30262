"""Graded tests for chapter 13 (batching and scheduling): the warm-ups and the cost of a
preemption. The lab's policy itself (13.1) is graded in test_ch13_policy.py.

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

from minillm.config import ModelConfig
from minillm.engine.block_manager import BlockManager, chain_hash
from minillm.engine.sampler import Sampled
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence
from minillm.engine.simulator import CostModel, simulate
from minillm.experiments.workload import TraceRequest
from minillm.grading import load_impl
from minillm.serve import SchedulerConfig
from minillm.serve import metrics as library_metrics

impl = load_impl("ch13_batching")


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
