"""Request traces for benchmarks: real prompts, Poisson arrivals, long-tailed output lengths.

Serving systems are judged on traffic, not on one prompt. A trace here is what a chat
service sees, scaled to a CPU:

* **prompts**: questions asked in the chat template, and passages of the course corpora
  (Wikipedia, State of the Union) to summarise or continue — real text of varied length;
* **arrivals**: a Poisson process of ``rate`` requests per second (independent users:
  exponential gaps between arrivals);
* **output lengths**: long-tailed (log-normal, clipped): most answers are short, a few are
  long, which is exactly what lockstep batching handles badly.

Everything is drawn from one seeded generator, so a trace is the same in every run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..sampling import SamplingParams
from ..serve import LLM
from ..serve.output_processor import CompletionOutput

QUESTIONS = [
    "What is a KV cache?", "Explain why the sky is blue.", "Write a short poem about a lighthouse.",
    "Give me three tips for learning the guitar.", "How do vaccines work?",
    "What is the capital of Australia?", "Describe a good breakfast.",
    "Summarise the plot of Romeo and Juliet.", "Why do cats purr?",
    "List the planets of the solar system.", "How does a refrigerator keep food cold?",
    "What makes a good password?",
]


@dataclass(frozen=True)
class TraceRequest:
    arrival: float  # seconds after the trace starts
    prompt: list[int]
    max_tokens: int


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of ``n`` requests at ``rate`` per second (exponential gaps)."""
    return np.cumsum(rng.exponential(1.0 / rate, size=n)) if rate > 0 else np.zeros(n)


def long_tailed_lengths(n: int, median: int, rng: np.random.Generator, sigma: float = 0.8,
                        low: int = 4, high: int = 256) -> np.ndarray:
    """Log-normal output lengths around ``median``, clipped to [low, high]."""
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, size=n)), low, high).astype(int)


def chat_prompts(tokenizer, n: int, rng: np.random.Generator, passages: list[str] = (),
                 max_passage_tokens: int = 200) -> list[list[int]]:
    """``n`` chat prompts: questions, and (when ``passages`` are given) requests to
    summarise a passage cut to ``max_passage_tokens`` tokens."""
    prompts = []
    for _ in range(n):
        if passages and rng.random() < 0.5:
            text = passages[int(rng.integers(len(passages)))]
            words = tokenizer.decode(tokenizer.encode(text)[:max_passage_tokens])
            prompts.append(tokenizer.chat_prompt(f"Summarise this passage:\n\n{words}"))
        else:
            prompts.append(tokenizer.chat_prompt(QUESTIONS[int(rng.integers(len(QUESTIONS)))]))
    return prompts


def make_trace(tokenizer, n: int = 64, rate: float = 2.0, median_tokens: int = 32,
               seed: int = 0, passages: list[str] = ()) -> list[TraceRequest]:
    """A seeded trace of ``n`` requests."""
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(n, rate, rng)
    lengths = long_tailed_lengths(n, median_tokens, rng)
    prompts = chat_prompts(tokenizer, n, rng, passages)
    return [TraceRequest(float(a), p, int(m))
            for a, p, m in zip(arrivals, prompts, lengths, strict=True)]


def replay(llm: LLM, trace: list[TraceRequest], params_for=None) -> list[CompletionOutput]:
    """Serve ``trace`` in real time: each request is added once its arrival time has come
    (its clock starts then, even if the engine was busy), and the engine steps while it has
    work. Returns each request's output (its first sample: tokens, text, arrival and token
    times), in trace order. ``params_for(request)`` gives each request's SamplingParams
    (default: greedy with the request's ``max_tokens``)."""
    params_for = params_for or (lambda r: SamplingParams(max_tokens=r.max_tokens))
    start = time.perf_counter()
    pending, ids = list(trace), []
    while pending or llm.has_work:
        now = time.perf_counter() - start
        while pending and pending[0].arrival <= now:
            request = pending.pop(0)
            ids.append(llm.add_request(request.prompt, params_for(request),
                                       arrival_time=start + request.arrival))
        if llm.has_work:
            # a step that computed nothing (dynamic batching waiting for a fuller batch)
            # returns no updates and leaves nothing running: then do not spin
            if not llm.step() and not llm.core.num_running:
                time.sleep(0.001)
        elif pending:
            time.sleep(max(0.0, pending[0].arrival - (time.perf_counter() - start)))
    return [llm.output(i).outputs[0] for i in ids]
