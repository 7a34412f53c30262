"""Graded tests for chapter 01 (anatomy of inference).

Oracles: minillm.roofline (FLOP and byte counts, the roofline bound), the tensors' own
sizes, numpy (percentiles) and direct computations on random timestamps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from minillm.grading import load_impl
from minillm.roofline import Roofline, matmul_bytes, matmul_flops

impl = load_impl("ch01_anatomy")


@pytest.mark.exercise("01.1", points=1)
@pytest.mark.parametrize("m, k, n, dtype", [(1, 576, 1536, torch.float32),
                                            (512, 576, 1536, torch.float32),
                                            (3, 5, 7, torch.float16),
                                            (8, 64, 1, torch.float64)])
def test_matmul_intensity_counts_multiply_adds_and_tensor_bytes(m, k, n, dtype):
    a, b = torch.ones(m, k, dtype=dtype), torch.ones(k, n, dtype=dtype)
    c = a @ b  # every output is a sum of k ones: k multiply-adds
    flops = 2 * c.double().sum().item()
    nbytes = a.nbytes + b.nbytes + c.nbytes
    assert impl.matmul_intensity(m, k, n, a.element_size()) == pytest.approx(flops / nbytes)


@pytest.mark.exercise("01.1", points=1)
@pytest.mark.parametrize("seed", range(3))
def test_matmul_intensity_matches_the_library_and_grows_with_tokens(seed):
    g = np.random.default_rng(seed)
    k, n = (int(x) for x in g.integers(16, 5000, size=2))
    value_bytes, tokens = [1, 2, 4][seed], (1, 8, 128, 512)
    intensities = [impl.matmul_intensity(m, k, n, value_bytes) for m in tokens]
    expected = [matmul_flops(m, k, n) / matmul_bytes(m, k, n, value_bytes) for m in tokens]
    assert intensities == pytest.approx(expected)
    assert intensities == sorted(intensities), "more tokens per weight: more FLOPs per byte"


@pytest.mark.exercise("01.2", points=2)
@pytest.mark.parametrize("seed", range(4))
def test_roofline_time_matches_the_library(seed):
    g = np.random.default_rng(seed)
    roof = Roofline(peak_flops=float(g.uniform(1e10, 1e15)), bandwidth=float(g.uniform(1e9, 5e12)))
    for intensity in (0.01, 0.5, roof.ridge_point, 10 * roof.ridge_point, 1e4):
        nbytes = float(g.uniform(1e3, 1e10))
        flops = intensity * nbytes
        got = impl.roofline_time(flops, nbytes, roof.peak_flops, roof.bandwidth)
        assert got == pytest.approx(roof.time(flops, nbytes), rel=1e-12)
        # the same bound seen as a speed: FLOPs / time = attainable FLOP/s at this intensity
        assert flops / got == pytest.approx(float(roof.attainable(intensity)), rel=1e-9)


def random_request(seed: int, num_tokens: int):
    g = np.random.default_rng(seed)
    start = float(g.uniform(0, 100))
    gaps = g.exponential(0.05, size=num_tokens) + 0.001
    gaps[0] += float(g.uniform(0.1, 1.0))  # the prefill
    return start, (start + np.cumsum(gaps)).tolist()


@pytest.mark.exercise("01.3", points=2)
@pytest.mark.parametrize("seed, num_tokens", [(0, 2), (1, 16), (2, 100)])
def test_latency_metrics_on_random_timestamps(seed, num_tokens):
    start, times = random_request(seed, num_tokens)
    got = impl.latency_metrics(start, times)
    assert set(got) == {"ttft", "tpot", "latency", "throughput"}
    assert got["ttft"] == pytest.approx(times[0] - start)
    assert got["tpot"] == pytest.approx(np.diff(times).mean())
    assert got["latency"] == pytest.approx(times[-1] - start)
    assert got["throughput"] == pytest.approx(num_tokens / (times[-1] - start))


@pytest.mark.exercise("01.3", points=1)
def test_latency_metrics_edge_cases():
    one = impl.latency_metrics(10.0, [10.25])
    assert one["ttft"] == pytest.approx(0.25) and math.isnan(one["tpot"])
    assert one["throughput"] == pytest.approx(4.0)
    with pytest.raises(ValueError):
        impl.latency_metrics(10.0, [])


@pytest.mark.exercise("01.4", points=2)
@pytest.mark.parametrize("seed", range(5))
def test_percentile_matches_numpy_linear(seed):
    g = np.random.default_rng(seed)
    values = g.lognormal(-3, 1, size=int(g.integers(1, 40))).tolist()
    original = list(values)
    for q in [0, 50, 90, 95, 99, 100, *g.uniform(0, 100, size=5)]:
        expected = np.percentile(values, q, method="linear")
        assert impl.percentile(values, float(q)) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert values == original, "do not reorder the caller's list"


@pytest.mark.exercise("01.4", points=1)
def test_percentile_small_cases():
    assert impl.percentile([7.0], 95) == 7.0
    assert impl.percentile([3.0, 1.0, 2.0, 4.0], 50) == pytest.approx(2.5)
    assert impl.percentile(list(range(1, 21)), 95) == pytest.approx(19.05)
