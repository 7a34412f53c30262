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

import numpy as np

from .sequence import Sequence


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


def ttft(seq: Sequence) -> float:
    return seq.token_times[0] - seq.arrival_time


def e2e(seq: Sequence) -> float:
    return seq.token_times[-1] - seq.arrival_time


def tpot(seq: Sequence) -> float | None:
    """None for a request with one output token (no time *between* tokens)."""
    n = len(seq.token_times)
    return (e2e(seq) - ttft(seq)) / (n - 1) if n > 1 else None


def itl(seq: Sequence) -> list[float]:
    return np.diff(seq.token_times).tolist()


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan"),
                "mean": float("nan")}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99),
            "mean": float(np.mean(values))}


def summarize(seqs: list[Sequence]) -> Summary:
    """Metrics over the requests that produced at least one token."""
    served = [seq for seq in seqs if seq.token_times]
    if not served:
        raise ValueError("no request produced a token")
    start = min(seq.arrival_time for seq in served)
    end = max(seq.token_times[-1] for seq in served)
    tpots = [t for t in map(tpot, served) if t is not None]
    return Summary(
        requests=len(served), output_tokens=sum(len(seq.token_times) for seq in served),
        seconds=end - start, ttft=percentiles([ttft(s) for s in served]),
        tpot=percentiles(tpots), itl=percentiles([x for s in served for x in itl(s)]),
        e2e=percentiles([e2e(s) for s in served]))
