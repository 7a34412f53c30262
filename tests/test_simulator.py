"""The serving simulator: the cost model's roofline, fitting it to step times, and the real
scheduler on a simulated clock."""

from __future__ import annotations

import pytest

from minillm.config import ModelConfig
from minillm.engine.scheduler import SchedulerConfig
from minillm.engine.simulator import CostModel, simulate
from minillm.experiments.workload import TraceRequest
from minillm.serve.metrics import summarize

LLAMA2_7B = ModelConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                        num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128,
                        tie_word_embeddings=False)


def test_decode_is_memory_bound_and_long_prefill_compute_bound():
    a100 = CostModel.for_model(LLAMA2_7B, bandwidth=2.0e12, flops=312e12)
    assert a100.weight_bytes == pytest.approx(13.5e9, rel=0.01)  # 6.7B parameters in fp16
    assert a100.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2  # 0.5 MB per token
    assert a100.step_time(1, 0) == pytest.approx(a100.weight_bytes / 2.0e12)
    assert a100.step_time(4096, 0) == pytest.approx(4096 * a100.flops_per_token / 312e12)


def test_fit_recovers_the_machine_that_made_the_steps():
    truth = CostModel(1e9, 1e5, 2e8, bandwidth=20e9, flops=200e9, overhead=0.002)
    guess = CostModel(1e9, 1e5, 2e8, bandwidth=1.0, flops=1.0)
    steps = [(n, c, truth.step_time(n, c)) for n, c in [(1, 0), (8, 4000), (4, 20000),
                                                         (512, 0)]]
    fitted = guess.fit(steps)
    assert fitted.bandwidth == pytest.approx(20e9, rel=1e-6)
    assert fitted.overhead == pytest.approx(0.002, rel=1e-6)
    assert fitted.flops == pytest.approx(200e9, rel=1e-6)


def test_simulated_continuous_batching_beats_static_on_long_tailed_outputs():
    cost = CostModel(1e9, 1e5, 2e8, bandwidth=20e9, flops=200e9, overhead=0.001)
    trace = [TraceRequest(0.01 * i, [1] * 20, 200 if i % 8 == 0 else 10) for i in range(64)]
    runs = {policy: summarize(simulate(trace, cost, SchedulerConfig(policy=policy, max_batch=8),
                                       num_blocks=4096))
            for policy in ("static", "continuous")}
    assert runs["continuous"].output_tokens == runs["static"].output_tokens
    assert runs["continuous"].throughput > 2 * runs["static"].throughput


def test_dynamic_batching_waits_on_the_simulated_clock_for_a_batch_that_never_fills():
    """Two requests, batches of four, steps far shorter than the wait: the batch starts
    when the oldest has waited max_wait (the clock jumps there; nothing spins)."""
    fast = CostModel(1.0, 0.0, 0.0, bandwidth=1e6, flops=1e6)  # a step takes a microsecond
    trace = [TraceRequest(0.0, [1, 2, 3], 4), TraceRequest(0.1, [4, 5], 4)]
    config = SchedulerConfig(policy="dynamic", max_batch=4, max_wait=1.0,
                             chunked_prefill=False)
    served = simulate(trace, fast, config, num_blocks=16)
    assert all(r.finish_reason == "length" and len(r.tokens) == len(r.token_times) == 4
               for r in served)
    assert served[0].token_times[0] == pytest.approx(1.0, abs=1e-3)  # waited the full second
