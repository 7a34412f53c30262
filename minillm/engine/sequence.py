"""One request as the engine sees it: its tokens, how many of them the KV cache holds, and
its place in the pool of cache blocks.

The scheduler's classic bug is two counters that drift apart (tokens "prefilled" and
tokens "in the cache", say) after a preemption or a prefix-cache hit. A :class:`Sequence`
keeps **one** counter, ``num_computed``: how many of its tokens have their keys and values
in the cache. Everything else is derived from it and from the token list:

* still to compute: ``num_tokens - num_computed`` (the prompt's remainder, or the newest
  sampled token);
* in prefill: ``num_computed < num_prompt_tokens``;
* preempted: its blocks are freed and ``num_computed`` goes back to 0 (recompute);
* a prefix-cache hit: ``num_computed`` starts at the number of cached tokens;
* speculative decoding: a step's guesses are computed beside the newest token, but only
  the accepted ones join ``output`` and count in ``num_computed``; the keys and values of
  rejected ones lie past it and are overwritten by the next step.

A sequence lives inside the engine core (:mod:`.core`) and nowhere else: the scheduler
changes it, in one place (:meth:`~.scheduler.Scheduler.apply`), from the values the
proposer and the sampler return; clients see immutable deltas (:mod:`.deltas`).

A request for ``n`` samples of one prompt is one sequence with ``n - 1`` more in
``samples``. They wait, unforked, until the prompt is computed; then each draws its first
token from the same logits and takes over the prompt's blocks by reference (a fork), so the
prompt's keys and values are stored once.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

from ..sampling import SamplingParams

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds cache blocks and takes part in steps
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # produced a stop token
    LENGTH = "length"  # reached max_tokens (or the model's context)
    ABORT = "abort"  # cancelled by its client
    ERROR = "error"  # rejected (the error says why)


@dataclass(eq=False)  # a sequence is itself: `seq in running` compares identities, not fields
class Sequence:
    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 16
    stop_tokens: frozenset[int] = frozenset()
    id: int = field(default_factory=lambda: next(_ids))
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    cached_tokens: int = 0  # tokens found in the prefix cache when it (last) started
    block_table: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    request_id: int = -1  # the client's request this sequence samples (-1: its own id)
    index: int = 0  # which of the request's samples it is
    samples: list[Sequence] = field(default_factory=list)  # n > 1: the request's other samples

    def __post_init__(self):
        if self.request_id < 0:
            self.request_id = self.id

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt)

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose keys and values are not in the cache yet."""
        return self.num_tokens - self.num_computed

    def next_tokens(self, n: int) -> list[int]:
        """The ``n`` tokens after the computed ones: the prompt's rest, then the newest
        sampled tokens (without concatenating the whole sequence)."""
        start, prompt = self.num_computed, len(self.prompt)
        if start >= prompt:
            return self.output[start - prompt:start - prompt + n]
        return (self.prompt[start:] + self.output)[:n]

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.num_prompt_tokens

    @property
    def unforked_samples(self) -> list[Sequence]:
        """The samples still waiting to branch off this sequence (before its first token)."""
        return [s for s in self.samples if s.status is Status.WAITING and not s.output]

    @property
    def num_seats(self) -> int:
        """Places in the running batch this sequence needs: itself and its unforked samples."""
        return 1 + len(self.unforked_samples)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append(self, token: int) -> None:
        """Record a sampled token, and finish on a stop token or at ``max_tokens``."""
        self.output.append(token)
        if token in self.stop_tokens:
            self.finish(FinishReason.STOP)
        elif len(self.output) >= self.max_tokens:
            self.finish(FinishReason.LENGTH)

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        self.status, self.finish_reason, self.error = Status.FINISHED, reason, error
