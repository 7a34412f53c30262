# Generated from solutions/ch01_anatomy.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 01: the anatomy of inference — FLOPs, bytes, the roofline, latency metrics."""

from __future__ import annotations

import math


def matmul_flops(m: int, k: int, n: int) -> int:
    """Exercise 01.1: Return the floating-point operations of an [m, k] @ [k, n] matmul.

    Each of the m * n outputs is a dot product of length k: k multiplies and k adds
    (count a fused multiply-add as 2 FLOPs, as hardware peak numbers do).
    Hint: a decode step of a model with P parameters is about matmul_flops(1, P, 1).
    """
    raise NotImplementedError("Exercise 01.1: Return the floating-point operations of an [m, k] @ [k, n] matmul")


def roofline_time(flops: float, bytes_moved: float, peak_flops: float,
                  bandwidth: float) -> float:
    """Exercise 01.2: Return the least time (s) a computation can take (Williams et al. 2009).

    It must do `flops` operations at no more than `peak_flops` per second, and move
    `bytes_moved` bytes at no more than `bandwidth` bytes per second; the slower of the two
    bounds it (compute-bound vs memory-bound).
    """
    raise NotImplementedError("Exercise 01.2: Return the least time (s) a computation can take (Williams et al. 2009)")


def latency_metrics(request_start: float, token_times: list[float]) -> dict[str, float]:
    """Exercise 01.3: Serving metrics of one request from the times its tokens arrived.

    request_start: when the request was sent (s); token_times: when each generated token
    arrived (s, increasing, at least one). Return a dict with
      "ttft": time to first token = token_times[0] - request_start;
      "tpot": time per output token after the first = mean gap between consecutive tokens
              (0.0 if there is only one token);
      "throughput": tokens per second over the whole request = len(token_times) /
              (token_times[-1] - request_start).
    """
    raise NotImplementedError("Exercise 01.3: Serving metrics of one request from the times its tokens arrived")


def percentile(values: list[float], q: float) -> float:
    """Exercise 01.4: The q-th percentile (0 <= q <= 100) with linear interpolation.

    Sort the values; the percentile sits at fractional index i = q / 100 * (n - 1);
    interpolate between the values at floor(i) and ceil(i). This is numpy.percentile's
    default method. P95 latency = percentile(latencies, 95).
    """
    raise NotImplementedError("Exercise 01.4: The q-th percentile (0 <= q <= 100) with linear interpolation")
