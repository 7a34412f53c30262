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
* speculative decoding: the step's ``draft`` tokens are computed beside the newest token,
  but only the accepted ones join ``output`` and count in ``num_computed``; the keys and
  values of rejected ones lie past it and are overwritten by the next step.

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

import torch

from ..sampling import SamplingParams, TokenLogprob

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


@dataclass
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
    token_times: list[float] = field(default_factory=list)  # when each output token came
    samples: list[Sequence] = field(default_factory=list)  # n > 1: the request's other samples
    draft: list[int] = field(default_factory=list)  # speculative tokens of this step, unverified
    draft_probs: torch.Tensor | None = None  # a draft model's distributions for them [γ, vocab]
    # (None: certain guesses, as prompt lookup's: q is one-hot)
    num_drafted: int = 0  # speculative tokens proposed over the request's life ...
    num_accepted: int = 0  # ... and accepted by the target
    num_forced: int = 0  # tokens its grammar forced (jump-forward): no forward pass of their own
    logprobs: list[TokenLogprob] = field(default_factory=list)  # with params.logprobs: one
    # per sampled token (output[i] <-> logprobs[i]; any past the output were dropped)

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
        """The ``n`` tokens after the computed ones: the prompt's rest, the newest sampled
        token, then this step's draft (without concatenating the whole sequence)."""
        start, prompt = self.num_computed, len(self.prompt)
        if start >= prompt:
            return (self.output[start - prompt:] + self.draft)[:n]
        return (self.prompt[start:] + self.output + self.draft)[:n]

    def clear_draft(self) -> None:
        self.draft, self.draft_probs = [], None

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

    def append(self, token: int, now: float | None = None) -> None:
        """Record a sampled token, and finish on a stop token or at ``max_tokens``."""
        self.output.append(token)
        self.token_times.append(time.perf_counter() if now is None else now)
        if token in self.stop_tokens:
            self.finish(FinishReason.STOP)
        elif len(self.output) >= self.max_tokens:
            self.finish(FinishReason.LENGTH)

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        self.status, self.finish_reason, self.error = Status.FINISHED, reason, error
