"""Latency and throughput of served requests, with vLLM's definitions.

For one request that arrived at ``a`` and received tokens at times ``t_1 .. t_n``:

* **TTFT**, time to first token: t_1 − a (queueing + prefill);
* **E2E**, end-to-end latency: t_n − a;
* **TPOT**, time per output token after the first: (E2E − TTFT) / (n − 1);
* **ITL**, inter-token latencies: t_{i+1} − t_i (what a user watching a stream feels).

Over a run: percentiles (P50, P95, P99) of each, and throughput = output tokens / the
wall time from the first arrival to the last token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Timed(Protocol):
    """A served sample's times (:class:`~.output_processor.CompletionOutput` has them)."""

    arrival_time: float
    token_times: list[float]


@dataclass(frozen=True)
class Summary:
    requests: int
    output_tokens: int
    seconds: float
    ttft: dict[str, float]  # "p50", "p95", "p99", "mean"
    tpot: dict[str, float]
    itl: dict[str, float]
    e2e: dict[str, float]

    @property
    def throughput(self) -> float:
        """Output tokens per second."""
        return self.output_tokens / self.seconds


def ttft(sample: Timed) -> float:
    return sample.token_times[0] - sample.arrival_time


def e2e(sample: Timed) -> float:
    return sample.token_times[-1] - sample.arrival_time


def tpot(sample: Timed) -> float | None:
    """None for a request with one output token (no time *between* tokens)."""
    n = len(sample.token_times)
    return (e2e(sample) - ttft(sample)) / (n - 1) if n > 1 else None


def itl(sample: Timed) -> list[float]:
    return np.diff(sample.token_times).tolist()


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan"),
                "mean": float("nan")}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99),
            "mean": float(np.mean(values))}


def summarize(samples: list[Timed]) -> Summary:
    """Metrics over the requests that produced at least one token."""
    served = [sample for sample in samples if sample.token_times]
    if not served:
        raise ValueError("no request produced a token")
    start = min(sample.arrival_time for sample in served)
    end = max(sample.token_times[-1] for sample in served)
    tpots = [t for t in map(tpot, served) if t is not None]
    return Summary(
        requests=len(served), output_tokens=sum(len(sample.token_times) for sample in served),
        seconds=end - start, ttft=percentiles([ttft(s) for s in served]),
        tpot=percentiles(tpots), itl=percentiles([x for s in served for x in itl(s)]),
        e2e=percentiles([e2e(s) for s in served]))
