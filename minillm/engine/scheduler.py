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
step computes at most ``max_tokens_per_step`` tokens, and one policy decides all of it:
``config.step_policy`` (:func:`~.policies.schedule_step`, the lab of chapter 13) reads a
:class:`~.policies.SchedulerState` (the queues as numbers, the free blocks) and returns a
:class:`~.policies.StepDecision`: tokens per running request, the waiting requests that
join with a prompt chunk each, and the running requests **preempted by recompute** to
free blocks (the latest started first), each with what it will compute again. The
scheduler checks the decision (:func:`~.policies.check_decision`) and applies it: the
victims' blocks are freed, their counter of computed tokens goes back to 0 and they
return to the front of the queue; then blocks are reserved in start order. Requests are
served first come, first served.

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
sequences, and returns each sample's :class:`~.deltas.RequestDelta`. For a model whose
every layer has a sliding window (``window``), it also gives back each sequence's blocks
that fell wholly behind the window
(:meth:`~.block_manager.BlockManager.release_behind_window`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..speculative import lookup_ngram
from .block_manager import RELEASED, BlockManager
from .deltas import RequestDelta
from .policies import (
    RunningView,
    SchedulerState,
    StepPolicy,
    WaitingView,
    check_decision,
    recompute_cost,
    schedule_step,
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
    step_policy: StepPolicy = schedule_step  # chunked prefill: what a step runs, who goes
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
                 proposer: Proposer | None = None, window: int | None = None):
        """``proposer``: who guesses for speculating decodes (None: no speculation).
        ``window``: the widest sliding window of the model's layers, None if any layer
        attends to everything (then no block is released before its sequence ends)."""
        self.config, self.blocks, self.proposer = config, blocks, proposer
        self.window = window
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

    def preempt(self, seq: Sequence, step: Step | None = None, recompute: int = 0) -> None:
        """Send a running ``seq`` back to the front of the queue, its blocks freed: it will be
        recomputed (its cached prefix blocks may survive and make that cheap; ``recompute``:
        the tokens the policy expects it to compute again)."""
        if step is not None:
            step.preempted.append((seq, seq.num_computed, recompute))
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
        """Ask ``config.step_policy`` what the step runs, check its decision, and apply it:
        preempt its victims (the latest started first), reserve blocks for the running
        requests in start order, then start the joiners."""
        # seated until their lockstep batch ends (static and dynamic policies):
        running = [seq for seq in self.running if not seq.finished]
        waiting = self._joinable() if self._may_admit(now) else []
        state = self.state(running, waiting)
        decision = self.config.step_policy(state)
        check_decision(decision, state)
        for i, cost in sorted(decision.preempted, reverse=True):
            self.preempt(running[i], step, cost)
        for seq, n in zip(running, decision.tokens, strict=True):
            if n:
                step.copies += self.blocks.reserve(seq, n)
                step.work.append((seq, n))
        for seq, n in zip(waiting, decision.joins, strict=False):
            if not self._start(seq, n, step):
                return  # its cached prefix went to this step's blocks: next step

    def state(self, running: list[Sequence], waiting: list[Sequence]) -> SchedulerState:
        """The read-only view a step policy decides from."""
        blocks, size = self.blocks, self.blocks.block_size
        held = {b for seq in running for b in seq.block_table if b != RELEASED}

        def cached(seq: Sequence) -> int:  # its first blocks named in the prefix cache
            return next((i for i, b in enumerate(seq.block_table)  # (released ones were)
                         if b != RELEASED and blocks.blocks[b].hash is None),
                        len(seq.block_table))

        def joining(seq: Sequence) -> WaitingView:  # hits behind a window go back at once
            hits = blocks.cached_prefix_blocks(seq)
            kept = hits if self.window is None else \
                hits[blocks.blocks_behind_window(size * len(hits), self.window):]
            return WaitingView(seq.num_tokens - size * len(hits),
                               sum(block.ref_count == 0 for block in kept))

        return SchedulerState(
            tuple(RunningView(seq.num_uncomputed, seq.num_computed, seq.num_tokens,
                              tuple(seq.block_table), cached(seq)) for seq in running),
            tuple(joining(seq) for seq in waiting), blocks.num_free, size,
            self.config.max_tokens_per_step, self.config.max_batch,
            {b: blocks.blocks[b].ref_count for b in held})

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
        """Whole-prompt steps: reserve blocks for ``n`` tokens of ``seq``, preempting the
        unfinished requests that started after it, the latest first, while the pool is short
        (``seq`` itself last). False if ``seq`` itself had to go."""
        while not self.blocks.can_reserve(seq, n):
            victim = [s for s in self.running[self.running.index(seq):] if not s.finished][-1]
            self.preempt(victim, step, recompute_cost(
                self.state([victim], []).running[0], self.blocks.block_size))
            if victim is seq:
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
        if self.window is not None:  # those behind the window are not needed
            self.blocks.release_behind_window(seq, self.window)
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
                self._computed(seq)
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
            self._computed(seq)
            deltas.append(_delta(seq, result, appended, len(draft.tokens), accepted, now))
            for sample in forks:
                self._fork(seq, sample)
                deltas.append(_delta(sample, sampled[sample.id],
                                     self._append(sample, sampled[sample.id].tokens), 0, 0,
                                     now))
            done += [s for s in (seq, *forks) if s.finished]
        self._release(done)
        return deltas

    def _computed(self, seq: Sequence) -> None:
        """After ``seq``'s computed tokens moved on: name its full blocks in the prefix cache
        (they may serve other prompts now), then give back those behind the window."""
        self.blocks.commit(seq)
        if self.window is not None:
            self.blocks.release_behind_window(seq, self.window)

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
