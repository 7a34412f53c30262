"""Plausible wrong answers to chapter 01 (anatomy of inference); the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``."""

import math


def matmul_intensity__flops_not_doubled(m, k, n, bytes_per_value=4):
    """Counts a multiply-add as 1 FLOP instead of 2."""
    return m * k * n / ((m * k + k * n + m * n) * bytes_per_value)


def matmul_intensity__output_not_counted(m, k, n, bytes_per_value=4):
    """Counts the bytes of both inputs but not of the output written."""
    return 2 * m * k * n / ((m * k + k * n) * bytes_per_value)


def matmul_intensity__integer_division(m, k, n, bytes_per_value=4):
    """Divides with // and returns an int (0 for every decode step)."""
    return 2 * m * k * n // ((m * k + k * n + m * n) * bytes_per_value)


def roofline_time__sum(flops, bytes_moved, peak_flops, bandwidth):
    """Adds compute time and memory time, as if they could not overlap."""
    return flops / peak_flops + bytes_moved / bandwidth


def roofline_time__min(flops, bytes_moved, peak_flops, bandwidth):
    """Takes the faster of the two instead of the slower."""
    return min(flops / peak_flops, bytes_moved / bandwidth)


def latency_metrics__tpot_over_n(request_start, token_times):
    """Divides the decode time by n tokens instead of the n - 1 gaps."""
    if len(token_times) == 0:
        raise ValueError("no tokens")
    n, latency = len(token_times), token_times[-1] - request_start
    return {"ttft": token_times[0] - request_start,
            "tpot": (token_times[-1] - token_times[0]) / n if n > 1 else math.nan,
            "latency": latency, "throughput": n / latency}


def latency_metrics__tpot_includes_prefill(request_start, token_times):
    """Averages the time per token from the request's start, prefill included."""
    if len(token_times) == 0:
        raise ValueError("no tokens")
    n, latency = len(token_times), token_times[-1] - request_start
    return {"ttft": token_times[0] - request_start,
            "tpot": latency / n if n > 1 else math.nan,
            "latency": latency, "throughput": n / latency}


def latency_metrics__single_token_tpot_zero(request_start, token_times):
    """Reports a TPOT of 0.0 for a one-token reply instead of nan (there is no gap)."""
    if len(token_times) == 0:
        raise ValueError("no tokens")
    n, latency = len(token_times), token_times[-1] - request_start
    return {"ttft": token_times[0] - request_start,
            "tpot": (token_times[-1] - token_times[0]) / max(n - 1, 1),
            "latency": latency, "throughput": n / latency}


def percentile__sorts_in_place(values, q):
    """Sorts the caller's list in place."""
    values.sort()
    index = (len(values) - 1) * q / 100
    lo = math.floor(index)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (index - lo)


def percentile__nearest_rank(values, q):
    """Returns the nearest value instead of interpolating between the two neighbours."""
    ordered = sorted(values)
    return ordered[round((len(ordered) - 1) * q / 100)]


def percentile__index_from_n(values, q):
    """Puts the percentile at index n * q / 100 instead of (n - 1) * q / 100."""
    ordered = sorted(values)
    index = min(len(ordered) * q / 100, len(ordered) - 1)
    lo = math.floor(index)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (index - lo)
