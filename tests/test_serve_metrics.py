"""Serving metrics follow vLLM's definitions; traces are seeded and shaped as promised."""

from __future__ import annotations

import numpy as np
import pytest

from minillm.engine.simulator import SimulatedRequest
from minillm.experiments.workload import long_tailed_lengths, make_trace, poisson_arrivals
from minillm.serve.metrics import e2e, itl, percentiles, summarize, tpot, ttft
from minillm.serve.output_processor import CompletionOutput


def served(arrival, times):
    """A sample's output as the output processor records it: its tokens and their times."""
    return CompletionOutput(0, [7] * len(times), arrival_time=arrival, token_times=list(times))


def test_per_request_latencies():
    seq = served(10.0, [10.5, 10.7, 11.0, 11.5])
    assert ttft(seq) == pytest.approx(0.5) and e2e(seq) == pytest.approx(1.5)
    assert tpot(seq) == pytest.approx(1.0 / 3)  # (E2E - TTFT) / (n - 1)
    assert itl(seq) == pytest.approx([0.2, 0.3, 0.5])
    assert tpot(served(0.0, [1.0])) is None


def test_summary_counts_tokens_over_the_whole_run():
    summary = summarize([served(0.0, [1.0, 2.0]), served(1.0, [3.0, 4.0, 5.0]),
                         served(2.0, [])])  # the last produced nothing: not counted
    assert summary.requests == 2 and summary.output_tokens == 5
    assert summary.seconds == pytest.approx(5.0) and summary.throughput == pytest.approx(1.0)
    assert summary.ttft["p50"] == pytest.approx(1.5)


def test_simulated_requests_have_the_same_metrics():
    samples = [served(0.0, [1.0, 2.0]), served(1.0, [3.0, 4.0, 5.0])]
    simulated = [SimulatedRequest(s.arrival_time, s.tokens, s.token_times) for s in samples]
    assert summarize(simulated) == summarize(samples)


def test_percentiles():
    values = list(range(1, 101))
    p = percentiles(values)
    assert p["p50"] == pytest.approx(50.5) and p["p95"] == pytest.approx(95.05)
    assert np.isnan(percentiles([])["p99"])


def test_arrivals_are_poisson_and_lengths_long_tailed():
    rng = np.random.default_rng(0)
    arrivals = poisson_arrivals(20_000, rate=4.0, rng=rng)
    assert np.all(np.diff(arrivals) >= 0)
    assert np.mean(np.diff(arrivals)) == pytest.approx(0.25, rel=0.03)
    lengths = long_tailed_lengths(20_000, median=32, rng=rng, low=4, high=256)
    assert lengths.min() >= 4 and lengths.max() <= 256
    assert np.median(lengths) == pytest.approx(32, rel=0.05)
    assert np.mean(lengths) > np.median(lengths)  # a long right tail


def test_traces_are_the_same_for_the_same_seed(tokenizer):
    first = make_trace(tokenizer, n=8, seed=3)
    assert first == make_trace(tokenizer, n=8, seed=3)
    assert first != make_trace(tokenizer, n=8, seed=4)
    assert all(r.prompt and r.max_tokens >= 4 for r in first)
