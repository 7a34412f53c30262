# Generated from solutions/ch01_anatomy.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 01: anatomy of inference — FLOPs, bytes, the roofline, and latency metrics."""

from __future__ import annotations

import math
from collections.abc import Sequence


def matmul_intensity(m: int, k: int, n: int, bytes_per_value: int = 4) -> float:
    """Exercise 01.1: Return the arithmetic intensity (FLOPs per byte) of [m, k] @ [k, n].

    FLOPs: each of the m x n outputs is a dot product of length k, i.e. k multiply-adds,
    counted as 2 FLOPs each. Bytes: the minimum memory traffic, reading both inputs once
    and writing the output once, at `bytes_per_value` bytes per number (4 for fp32).
    Hint: a decode step multiplies one token (m = 1) by a weight [k, n]: the intensity is
    close to 2 / bytes_per_value, whatever the size of the weight.
    """
    raise NotImplementedError("Exercise 01.1: Return the arithmetic intensity (FLOPs per byte) of [m, k] @ [k, n]")


def roofline_time(flops: float, bytes_moved: float, peak_flops: float,
                  bandwidth: float) -> float:
    """Exercise 01.2: Return the roofline's lower bound on a computation's time, in seconds.

    The computation does `flops` FLOPs and moves `bytes_moved` bytes on a machine that
    computes at most `peak_flops` FLOP/s and moves at most `bandwidth` bytes/s. Both take
    time, and (overlapping perfectly) the slower of the two sets the pace. Williams et al.
    (2009) state the same bound as attainable FLOP/s = min(peak, bandwidth x intensity).
    Hint: one line.
    """
    raise NotImplementedError("Exercise 01.2: Return the roofline's lower bound on a computation's time, in seconds")


def latency_metrics(request_start: float, token_times: Sequence[float]) -> dict[str, float]:
    """Exercise 01.3: Return the latency metrics of one request from its token timestamps.

    request_start: when the request was sent (seconds, e.g. time.perf_counter());
    token_times: when each output token arrived, in order (same clock).
    Returns a dict with
      "ttft": time to first token (first token time - request_start),
      "tpot": time per output token, the mean gap between consecutive tokens after the
              first one (math.nan if there is only one token),
      "latency": end-to-end time (last token time - request_start),
      "throughput": output tokens per second over the whole request (tokens / latency).
    Raise ValueError if token_times is empty.
    Hint: the gaps between n tokens add up to last - first, and there are n - 1 of them.
    """
    raise NotImplementedError("Exercise 01.3: Return the latency metrics of one request from its token timestamps")


def percentile(values: Sequence[float], q: float) -> float:
    """Exercise 01.4: Return the q-th percentile (0 <= q <= 100) of values, interpolating linearly.

    Sort the values; the percentile sits at fractional index (n - 1) * q / 100 of the
    sorted list, between the two neighbouring values, weighted by the fractional part.
    This is numpy.percentile(values, q, method="linear") (numpy's default); P95 latency
    is percentile(latencies, 95). Do not reorder the caller's list, and do not call numpy.
    Hint: lo = floor(index), hi = min(lo + 1, n - 1); result = v[lo] + (v[hi] - v[lo]) * frac.
    """
    raise NotImplementedError("Exercise 01.4: Return the q-th percentile (0 <= q <= 100) of values, interpolating linearly")
