"""Graded tests for chapter 01 (anatomy of inference). numpy and torch are the oracles."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minillm.grading import load_impl

impl = load_impl("ch01_anatomy")


@pytest.mark.exercise("01.1", points=1)
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 5, 7), (1, 576, 1536), (512, 64, 512)])
def test_matmul_flops_counts_multiply_adds(m, k, n):
    a, b = torch.ones(m, k, dtype=torch.float64), torch.ones(k, n, dtype=torch.float64)
    multiply_adds = (a @ b).sum().item()  # every output is a sum of k ones
    assert impl.matmul_flops(m, k, n) == 2 * multiply_adds


@pytest.mark.exercise("01.2", points=2)
@pytest.mark.parametrize("flops, nbytes, peak, bandwidth", [
    (1e9, 1e6, 1e11, 1e10),   # compute-bound: 10 ms of math, 0.1 ms of memory
    (2.7e8, 5.4e8, 2e11, 3.5e10),  # SmolLM2 decode: memory-bound
    (5.0, 5.0, 1.0, 1.0),  # balanced
])
def test_roofline_time_is_the_slower_bound(flops, nbytes, peak, bandwidth):
    expected = flops / peak if flops / peak >= nbytes / bandwidth else nbytes / bandwidth
    assert impl.roofline_time(flops, nbytes, peak, bandwidth) == pytest.approx(expected)


@pytest.mark.exercise("01.3", points=2)
def test_latency_metrics_on_random_streams():
    rng = np.random.default_rng(0)
    for _ in range(5):
        start = float(rng.uniform(0, 10))
        times = list(start + 0.3 + np.cumsum(rng.uniform(0.01, 0.1, size=20)))
        got = impl.latency_metrics(start, times)
        assert got["ttft"] == pytest.approx(times[0] - start)
        assert got["tpot"] == pytest.approx(np.mean(np.diff(times)))
        assert got["throughput"] == pytest.approx(20 / (times[-1] - start))


@pytest.mark.exercise("01.3", points=1)
def test_latency_metrics_with_a_single_token():
    got = impl.latency_metrics(1.0, [1.5])
    assert got == pytest.approx({"ttft": 0.5, "tpot": 0.0, "throughput": 2.0})


@pytest.mark.exercise("01.4", points=2)
@pytest.mark.parametrize("q", [0, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy(q):
    values = list(np.random.default_rng(q).exponential(size=37))
    assert impl.percentile(values, q) == pytest.approx(np.percentile(values, q))
