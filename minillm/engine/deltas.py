"""What the engine core hands out: immutable records, never its live sequences.

Every :meth:`~.core.EngineCore.step` returns one :class:`RequestDelta` per sample that
changed in it: the tokens that joined its output, their log-probabilities when the
request asked for them, and how it finished if it did. A client (the output processor,
:mod:`minillm.serve.output_processor`) builds everything else from these: text, stop
strings, streams, usage and latencies. The core can therefore run in another thread (the
server's) without anyone reading a sequence while a step changes it.

A step also produces one :class:`StepReport`, for observers (``LLM(on_step=...)``,
benchmarks, the chapters' plots): what it computed and how long the model took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..sampling import TokenLogprob


class RequestDelta(NamedTuple):
    """One sample's progress in one step (immutable; a named tuple: one is made per sample
    per step, so it must be cheap).

    ``token_ids``: the tokens that joined its output (accepted guesses, the sampled token,
    and tokens its grammar forced), in order; ``logprobs``: one per token when the request
    asked for them, else empty. ``finish_reason``: "stop" (a stop token), "length", "abort"
    or "error" (``error`` says why) once it ended. ``drafted``/``accepted``: speculative
    guesses checked in this step and how many the target kept; ``forced``: tokens its
    grammar forced (jump-forward) that had no forward pass of their own. ``time``: when the
    step ended (``time.perf_counter()``)."""

    request_id: int
    index: int
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None
    error: str | None = None
    drafted: int = 0
    accepted: int = 0
    forced: int = 0
    time: float = 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Work(NamedTuple):
    """One sample's part of a step: it computed ``tokens`` tokens (a prefill chunk, or a
    decode's newest token and its guesses) after the ``start`` it had computed before."""

    request_id: int
    index: int
    tokens: int
    start: int


class Preemption(NamedTuple):
    """A sample sent back to the queue to free blocks: the keys and values of its
    ``computed`` tokens were dropped (a prefix-cache hit may bring some back), out of
    ``num_tokens`` (prompt and output so far), to be computed again; ``recompute``: how
    many of them the step policy expects to compute again (the prefix cache keeps the
    rest, unless the pool hands its blocks out first)."""

    request_id: int
    index: int
    computed: int
    num_tokens: int
    recompute: int = 0


@dataclass(frozen=True)
class StepReport:
    """What one engine step did: its ``work`` per sample, the ``preempted`` samples, the
    ``executor`` that computed the forward pass in ``forward_seconds``, and ``seconds``,
    the whole computation (guesses, forward pass, sampling). A step with nothing to run
    (dynamic batching waiting to fill a batch) has no work and no executor."""

    work: tuple[Work, ...] = ()
    preempted: tuple[Preemption, ...] = ()
    executor: str = ""
    forward_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def num_tokens(self) -> int:
        return sum(work.tokens for work in self.work)
