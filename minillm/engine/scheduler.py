"""Which tokens of which requests the next forward pass computes, and what it changed.

Every engine step runs one forward over a flat list of tokens from many sequences. The
scheduler fills it, and the policy is what chapter 13 is about:

* **static** batching: take up to ``max_batch`` requests, run them until *all* of them are
  done, then take the next batch. A finished request keeps its seat (and the others wait
  for the longest one): the cost of lockstep batches.
* **dynamic** batching: static, but a batch starts only when it is full or its oldest
  request has waited ``max_wait`` seconds (trading latency for fuller batches).
* **continuous** (iteration-level) batching (Yu et al. 2022, Orca): every step, finished
  requests leave and waiting ones join, as long as the token budget and the KV blocks
  allow.

Without chunked prefill, prompts go first (vLLM's original policy): when requests can
join, the step computes their whole prompts and nothing else. With ``chunked_prefill`` a
step computes at most ``max_tokens_per_step`` tokens, split by ``config.plan``
(:func:`~.policies.plan_chunked_step`: decodes first, then prompt chunks).

When the pool runs out of blocks, running requests are **preempted by recompute**
(``config.preempt`` picks them, :func:`~.policies.preemption_victims`): their blocks are
freed, their counter of computed tokens goes back to 0 and they return to the front of
the queue. Requests are served first come, first served.

**Speculative guesses take what the step's planned work leaves.** With
``speculative_tokens = γ > 0``, once every planned token has its blocks, each decoding
request may carry up to γ guesses (as many as its proposer can make, :mod:`.proposers`),
paid from the token budget the plan left unspent and from free blocks only: guesses
never preempt anyone and never delay a planned token, and they are never skipped for any
other reason. The runner verifies them in the same forward pass, and only accepted ones
count as computed, so blocks holding unverified tokens are never named in the prefix
cache.

After the step, :meth:`Scheduler.apply` is the one place where sequences change: it
counts the computed tokens, appends the accepted guesses and the sampled token, forks a
request's other samples, names full blocks in the prefix cache, releases finished
sequences, and returns each sample's :class:`~.deltas.RequestDelta`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..speculative import lookup_ngram
from .block_manager import BlockManager
from .deltas import RequestDelta
from .policies import (
    Plan,
    Preempt,
    check_plan,
    check_victims,
    plan_chunked_step,
    preemption_victims,
)
from .sampler import Sampled
from .sequence import FinishReason, Sequence, Status
from .step import NO_DRAFT, Draft, Proposer, Step

POLICIES = ("static", "dynamic", "continuous")


@dataclass
class SchedulerConfig:
    policy: str = "continuous"
    max_batch: int = 8  # sequences running at once
    max_tokens_per_step: int = 512  # the token budget of one forward pass
    chunked_prefill: bool = True
    max_wait: float = 0.05  # dynamic batching: seconds the oldest request may wait
    plan: Plan = plan_chunked_step  # chunked prefill: how a step's token budget is split
    preempt: Preempt = preemption_victims  # out of blocks: which running requests go
    speculative_tokens: int = 0  # γ: guesses a decode may have verified per step
    drafter: Callable[[list[int], int], list[int]] = lookup_ngram  # (tokens, γ) -> guesses
    # (prompt lookup's; an engine with a draft model has the model guess instead)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.max_batch < 1 or self.max_tokens_per_step < 1:
            raise ValueError("max_batch and max_tokens_per_step must be at least 1")
        if self.speculative_tokens < 0:
            raise ValueError(f"speculative_tokens must be >= 0, got {self.speculative_tokens}")


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager,
                 proposer: Proposer | None = None):
        """``proposer``: who guesses for speculating decodes (None: no speculation)."""
        self.config, self.blocks, self.proposer = config, blocks, proposer
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, seq: Sequence, reason: FinishReason = FinishReason.ABORT,
              error: str | None = None) -> None:
        """Stop ``seq`` wherever it is and give its blocks back."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self.blocks.free(seq)
        seq.finish(reason, error)

    def preempt(self, seq: Sequence, step: Step | None = None) -> None:
        """Send a running ``seq`` back to the front of the queue, its blocks freed: it will be
        recomputed (its cached prefix blocks may survive and make that cheap)."""
        if step is not None:
            step.preempted.append((seq, seq.num_computed))
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed, seq.status = 0, Status.WAITING
        self.waiting.appendleft(seq)

    # -- one step -----------------------------------------------------------------------

    def schedule(self, now: float | None = None) -> Step:
        """Choose the work of the next forward pass: the planned tokens, then the guesses."""
        now = time.perf_counter() if now is None else now
        step = Step()
        if self.config.chunked_prefill:
            self._schedule_chunks(step, now)
        else:
            self._schedule_whole_prompts(step, now)
        if self.proposer is not None and self.config.speculative_tokens:
            self._add_guesses(step)
        return step

    def _schedule_chunks(self, step: Step, now: float) -> None:
        """Split the token budget with ``config.plan``, then reserve blocks in its order:
        running requests (preempting if the pool is short), then joining ones."""
        # seated until their lockstep batch ends (static and dynamic policies):
        running = [seq for seq in self.running if not seq.finished]
        waiting = self._joinable() if self._may_admit(now) else []
        needs = [seq.num_uncomputed for seq in running]
        waiting_needs = [seq.num_tokens - self.blocks.block_size
                         * len(self.blocks.cached_prefix_blocks(seq)) for seq in waiting]
        budget = self.config.max_tokens_per_step
        counts = list(self.config.plan(needs, waiting_needs, budget, self.config.max_batch))
        check_plan(counts, needs, waiting_needs, budget)
        for seq, n in zip(running, counts, strict=False):
            if n and seq in self.running and self._reserve_or_preempt(seq, n, step):
                step.work.append((seq, n))
        for seq, n in zip(waiting, counts[len(running):], strict=False):
            if not (self.waiting and self.waiting[0] is seq and self._start(seq, n, step)):
                return  # a preempted request is first in the queue now, or no blocks

    def _schedule_whole_prompts(self, step: Step, now: float) -> None:
        """Prefill first: a step of whole prompts if any may join, else every decode."""
        if self._may_admit(now):
            self._admit_whole_prompts(step)
            if step.work:
                return
        for seq in list(self.running):
            if seq not in self.running or seq.finished:  # preempted, or seated (lockstep)
                continue
            if self._reserve_or_preempt(seq, seq.num_uncomputed, step):
                step.work.append((seq, seq.num_uncomputed))

    def _add_guesses(self, step: Step) -> None:
        """Give each decoding sequence of ``step`` up to γ guess slots, in order, from the
        token budget the plan left and the free blocks (no preemption)."""
        spare = self.config.max_tokens_per_step - step.num_tokens
        for seq, n in step.work:
            gamma = min(self.config.speculative_tokens, spare,
                        seq.max_tokens - len(seq.output) - 1)
            if gamma <= 0 or n != 1 or seq.num_uncomputed != 1 or seq.in_prefill \
                    or seq.params.uses_history:  # p would depend on the guesses
                continue
            slots = min(self.proposer.guess_count(seq, gamma), gamma)
            while slots and not self.blocks.can_reserve(seq, 1 + slots):
                slots -= 1
            if slots:
                step.copies += self.blocks.reserve(seq, 1 + slots)
                step.guesses[seq.id] = slots
                spare -= slots

    def _reserve_or_preempt(self, seq: Sequence, n: int, step: Step) -> bool:
        """Reserve blocks for ``n`` tokens of ``seq``; while the pool is short, preempt the
        victims ``config.preempt`` picks among ``seq`` and the unfinished requests that
        started after it (this step has not reached them yet). False if ``seq`` itself had
        to go. A block shared with a request that stays is counted in ``held`` but not
        freed: then the pool may still be short, and the plug-in is asked again."""
        while not self.blocks.can_reserve(seq, n):
            later = self.running[self.running.index(seq):]
            candidates = [s for s in later if not s.finished]
            need, free = self.blocks.new_blocks_needed(seq, n), self.blocks.num_free
            held = [len(s.block_table) for s in candidates]
            victims = list(self.config.preempt(need, free, held))
            check_victims(victims, need, free, held)
            for i in victims:
                self.preempt(candidates[i], step)
            if 0 in victims:
                return False
        step.copies += self.blocks.reserve(seq, n)
        return True

    def _joinable(self) -> list[Sequence]:
        """The waiting requests, first come first served, that fit in the free seats (a
        request for n samples takes n seats)."""
        free = self.config.max_batch - sum(seq.num_seats for seq in self.running)
        joinable = []
        for seq in self.waiting:
            if seq.num_seats > free:
                break
            joinable.append(seq)
            free -= seq.num_seats
        return joinable

    def _may_admit(self, now: float) -> bool:
        """Continuous batching admits every step; static and dynamic only into an empty
        batch (dynamic: once it can be filled or the oldest request has waited enough)."""
        if self.config.policy == "continuous":
            return True
        if self.running:
            return False
        if self.config.policy == "static" or not self.waiting:
            return True
        full = len(self.waiting) >= self.config.max_batch
        return full or now - self.waiting[0].arrival_time >= self.config.max_wait

    def _start(self, seq: Sequence, n: int, step: Step) -> bool:
        """Move the first waiting request to the running ones with ``n`` tokens to compute
        this step (after its cached prefix blocks), if the pool has the blocks."""
        self.blocks.start(seq)  # cached prefix blocks, if any
        if not self.blocks.can_reserve(seq, n):
            self.blocks.free(seq)  # give the cached blocks back; try again next step
            seq.num_computed = 0
            return False
        self.waiting.popleft()
        step.copies += self.blocks.reserve(seq, n)
        seq.status = Status.RUNNING
        self.running.append(seq)
        step.work.append((seq, n))
        return True

    def _admit_whole_prompts(self, step: Step) -> None:
        """Start waiting requests, first come first served, with their whole prompts while
        seats, the token budget (the first one always fits) and blocks allow; a request that
        does not fit blocks the queue (FCFS)."""
        budget = self.config.max_tokens_per_step
        for seq in self._joinable():
            cached = self.blocks.block_size * len(self.blocks.cached_prefix_blocks(seq))
            n = seq.num_tokens - cached
            if step.work and n > budget or not self._start(seq, n, step):
                return
            budget -= n

    # -- after the step -----------------------------------------------------------------

    def apply(self, step: Step, drafts: dict[int, Draft], sampled: dict[int, Sampled],
              now: float | None = None) -> list[RequestDelta]:
        """Record what the step computed: for each sequence, count its computed tokens (its
        accepted guesses, not the rejected ones), append its new tokens (accepted guesses,
        then the sampled token, then tokens its grammar forced), name its full verified
        blocks in the prefix cache, fork the other samples of a request whose prompt is now
        in, and release finished sequences. Returns a delta per sample that changed."""
        now = time.perf_counter() if now is None else now
        deltas, done = [], []
        for seq, n in step.work:
            draft = drafts.get(seq.id, NO_DRAFT)
            result = sampled.get(seq.id)
            forks = [s for s in seq.unforked_samples if s.id in sampled] if seq.samples else []
            if result is None:  # a prefill chunk short of its prompt's end
                seq.num_computed += n
                self.blocks.commit(seq)  # its full blocks may serve other prompts now
                continue
            if result.error is not None:  # it cannot go on: it fails, the others do not
                for failed in (seq, *forks):
                    self.abort(failed, FinishReason.ERROR, result.error)  # blocks freed
                    deltas.append(_delta(failed, result, 0, 0, 0, now))
                continue
            accepted = len(result.tokens) - 1 - result.forced if draft.tokens else 0
            seq.num_computed += n + accepted  # rejected guesses do not count
            appended = self._append(seq, result.tokens)
            seq.num_computed = min(seq.num_computed, seq.num_tokens)
            self.blocks.commit(seq)
            deltas.append(_delta(seq, result, appended, len(draft.tokens), accepted, now))
            for sample in forks:
                self._fork(seq, sample)
                deltas.append(_delta(sample, sampled[sample.id],
                                     self._append(sample, sampled[sample.id].tokens), 0, 0,
                                     now))
            done += [s for s in (seq, *forks) if s.finished]
        self._release(done)
        return deltas

    @staticmethod
    def _append(seq: Sequence, tokens: list[int]) -> int:
        """Append ``tokens`` until the sequence finishes; returns how many joined."""
        for count, token in enumerate(tokens, start=1):
            seq.append(token)
            if seq.finished:  # a stop token among the accepted guesses: drop the rest
                return count
        return len(tokens)

    def _release(self, done: list[Sequence]) -> None:
        """Give finished sequences' blocks back (lockstep policies: when all are done)."""
        if self.config.policy != "continuous":
            if all(seq.finished for seq in self.running):
                for seq in self.running:
                    self.blocks.free(seq)
                self.running = []
            return
        for seq in done:
            self.running.remove(seq)
            self.blocks.free(seq)

    def _fork(self, parent: Sequence, sample: Sequence) -> None:
        """Start one of ``parent``'s other samples: it shares the computed prompt's blocks
        (copy-on-write) and takes its first token, drawn from the same logits."""
        self.blocks.fork(parent, sample)
        sample.status = Status.RUNNING
        self.running.append(sample)


def _delta(seq: Sequence, result: Sampled, appended: int, drafted: int, accepted: int,
           now: float) -> RequestDelta:
    """The delta of one sequence whose first ``appended`` new tokens joined its output."""
    return RequestDelta(
        seq.request_id, seq.index, tuple(result.tokens[:appended]),
        tuple(result.logprobs[:appended]),
        seq.finish_reason.value if seq.finished else None, seq.error, drafted, accepted,
        min(result.forced, appended), now)
