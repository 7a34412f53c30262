"""The server's Prometheus metrics (``GET /metrics``): requests by outcome, tokens, TTFT
and TPOT histograms (:mod:`minillm.serve.metrics`' arithmetic), KV blocks and queues."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .. import metrics
from ..async_engine import Request as EngineRequest
from ..llm import LLM


class ServerMetrics:
    """Prometheus metrics of one server (its own registry: several servers can live in one
    process, as in the tests)."""

    def __init__(self, llm: LLM):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("minillm_requests", "Requests by outcome", ["outcome"],
                                registry=registry)
        self.prompt_tokens = Counter("minillm_prompt_tokens", "Prompt tokens", registry=registry)
        self.generated_tokens = Counter("minillm_generation_tokens", "Generated tokens",
                                        registry=registry)
        self.ttft = Histogram("minillm_time_to_first_token_seconds", "TTFT", registry=registry)
        self.tpot = Histogram("minillm_time_per_output_token_seconds", "TPOT",
                              registry=registry, buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5))
        Gauge("minillm_kv_blocks_used", "KV-cache blocks in use", registry=registry) \
            .set_function(lambda: llm.blocks.num_blocks - llm.free_blocks())
        Gauge("minillm_kv_blocks_total", "KV-cache blocks", registry=registry) \
            .set_function(lambda: llm.blocks.num_blocks)
        Gauge("minillm_requests_waiting", "Requests queued", registry=registry) \
            .set_function(lambda: llm.core.num_waiting)
        Gauge("minillm_requests_running", "Requests running", registry=registry) \
            .set_function(lambda: llm.core.num_running)

    def record(self, request: EngineRequest, outcome: str) -> None:
        self.requests.labels(outcome).inc()
        self.prompt_tokens.inc(len(request.output.prompt_tokens))
        for sample in request.output.outputs:
            self.generated_tokens.inc(len(sample.tokens))
            if sample.token_times:
                self.ttft.observe(metrics.ttft(sample))
            if (per_token := metrics.tpot(sample)) is not None:
                self.tpot.observe(per_token)
