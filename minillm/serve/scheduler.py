"""Which tokens of which requests the next forward pass computes.

Every engine step runs one forward over a flat list of tokens from many sequences. The
scheduler fills it, and the policy is what this chapter is about:

* **static** batching: take up to ``max_batch`` requests, run them until *all* of them are
  done, then take the next batch. A finished request keeps its seat (and the others wait
  for the longest one): the cost of lockstep batches.
* **dynamic** batching: static, but a batch starts only when it is full or its oldest
  request has waited ``max_wait`` seconds (trading latency for fuller batches).
* **continuous** (iteration-level) batching (Yu et al. 2022, Orca): every step, finished
  requests leave and waiting ones join, as long as the token budget and the KV blocks
  allow.

Without chunked prefill, prompts go first (vLLM's original policy): when requests can
join, the step computes their whole prompts and nothing else, so every running decode
stalls for the length of that prefill. With ``chunked_prefill`` a step computes at most
``max_tokens_per_step`` tokens: running decodes first (one token each), then the prompts
already started, then as much of the waiting prompts as fits, so a long prompt is split
over several steps and the decodes keep flowing (Agrawal et al. 2023, Sarathi). That split
is a pure function of token counts, :func:`plan_chunked_step`; ``SchedulerConfig(plan=...)``
replaces it (chapter 13 plugs in the learner's), and the scheduler checks what it returns.

With ``speculative_tokens = γ > 0`` a decoding request also carries up to γ tokens
proposed by prompt lookup (:func:`~minillm.speculative.lookup_ngram`) from what is left
of the step's token budget; the runner verifies them in the same forward pass and only
accepted tokens count as computed, so blocks holding unverified tokens are never named in
the prefix cache. Drafts never preempt: they take blocks only while one free block per
running request remains.

When the pool runs out of blocks, the most recently started running request is
**preempted by recompute**: its blocks are freed, its counter of computed tokens goes back
to 0 and it returns to the front of the queue (its cached prefix blocks may survive and
make the recompute cheap). Requests are served first come, first served. Which requests
go is a pure function of block counts, :func:`preemption_victims`;
``SchedulerConfig(preempt=...)`` replaces it (chapter 13's exercise 13.5), and the
scheduler checks what it returns.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..speculative import lookup_ngram
from .block_manager import BlockManager
from .sequence import FinishReason, Sequence, Status

POLICIES = ("static", "dynamic", "continuous")


def plan_chunked_step(running: list[int], waiting: list[int], token_budget: int,
                      max_running: int) -> list[int]:
    """How one chunked-prefill step spends its token budget (Sarathi's order, FCFS).

    ``running``: the tokens each running request still has to compute (1 for a decode,
    more for a prompt not yet all computed), in the order they started; ``waiting``: the
    same for the queue, oldest first. Decodes go first (one token each), then the started
    prompts in order, then waiting requests join in order while seats (``max_running``
    requests in all) and budget remain; any of them may get just a chunk. Returns one count
    per running request (0: nothing this step), then one (>= 1) per waiting request that
    joins."""
    counts = [0] * len(running)
    for decodes_pass in (True, False):
        for i, need in enumerate(running):
            if (need == 1) == decodes_pass:
                counts[i] = min(need, token_budget)
                token_budget -= counts[i]
    for need in waiting[:max_running - len(running)]:
        if token_budget == 0:
            break
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    return counts


Plan = Callable[[list[int], list[int], int, int], list[int]]


def preemption_victims(need: int, free: int, held: list[int]) -> list[int]:
    """Which running requests to preempt so that one of them gets ``need`` more KV blocks
    from a pool with ``free`` free blocks: the latest started first (vLLM's policy).

    ``held``: the blocks of the request asking (``held[0]``) and of each running request
    that started after it, in the order they started: the step serves running requests
    in that order, so these are the ones it has not served yet, the only ones whose blocks
    can still be taken back. Victims are taken from the end, each freeing what it holds,
    until ``free`` reaches ``need``; if it never does, the requester itself goes last (and
    gets nothing this step). Returns the victims' indices, in the order they go."""
    victims = []
    for i in reversed(range(len(held))):
        if free >= need:
            break
        victims.append(i)
        free += held[i]
    return victims


Preempt = Callable[[int, int, list[int]], list[int]]


@dataclass
class SchedulerConfig:
    policy: str = "continuous"
    max_batch: int = 8  # sequences running at once
    max_tokens_per_step: int = 512  # the token budget of one forward pass
    chunked_prefill: bool = True
    max_wait: float = 0.05  # dynamic batching: seconds the oldest request may wait
    random_preemption: float = 0.0  # tests: chance per step of preempting a running request
    seed: int = 0  # ... drawn from a generator seeded with this
    plan: Plan = plan_chunked_step  # chunked prefill: how a step's token budget is split
    preempt: Preempt = preemption_victims  # out of blocks: which running requests go
    speculative_tokens: int = 0  # γ: prompt-lookup tokens a decode may verify per step
    drafter: Callable[[list[int], int], list[int]] = lookup_ngram  # (tokens, γ) -> guesses
    # (prompt lookup's; an engine with a draft model has the model guess instead)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.max_batch < 1 or self.max_tokens_per_step < 1:
            raise ValueError("max_batch and max_tokens_per_step must be at least 1")
        if self.speculative_tokens < 0:
            raise ValueError(f"speculative_tokens must be >= 0, got {self.speculative_tokens}")


@dataclass
class Step:
    """One forward pass: ``(sequence, tokens to compute)`` pairs, prefill chunks included,
    the cache blocks to copy first (copy-on-write), the requests preempted to make room,
    and (once the engine ran it) the seconds its drafts and forward pass took."""

    work: list[tuple[Sequence, int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.work)


Guess = Callable[[Sequence, int], list[int]]


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager, guess: Guess | None = None):
        """``guess(seq, γ)``: the guesses a decoding sequence gets this step (default:
        prompt lookup with ``config.drafter``; a draft model's are filled in later,
        :mod:`.proposers`)."""
        self.config, self.blocks = config, blocks
        self.guess = guess or (lambda seq, gamma: config.drafter(seq.tokens, gamma))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.random = random.Random(config.seed)

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

    # -- one step -----------------------------------------------------------------------

    def schedule(self, now: float | None = None) -> Step:
        """Choose the work of the next forward pass."""
        now = time.perf_counter() if now is None else now
        step = Step()
        candidates = [seq for seq in self.running if not seq.finished]
        if candidates and self.random.random() < self.config.random_preemption:
            self._preempt(self.random.choice(candidates), step)
        if self.config.chunked_prefill:
            self._schedule_chunks(step, now)
        else:
            self._schedule_whole_prompts(step, now)
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
        _check_plan(counts, needs, waiting_needs, budget)
        spare = budget - sum(counts)
        for seq, n in zip(running, counts, strict=False):
            if n and seq in self.running:
                n += self._propose(seq, spare) if n == 1 else 0
                spare -= len(seq.draft)
                if self._reserve_or_preempt(seq, n, step):
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
        spare = self.config.max_tokens_per_step - len(self.running)
        for seq in list(self.running):
            if seq not in self.running or seq.finished:  # preempted, or seated (lockstep)
                continue
            n = seq.num_uncomputed + self._propose(seq, spare)
            spare -= len(seq.draft)
            if self._reserve_or_preempt(seq, n, step):
                step.work.append((seq, n))

    def _propose(self, seq: Sequence, spare: int) -> int:
        """Draft up to ``speculative_tokens`` guesses for a decoding sequence, within the
        ``spare`` token budget, the request's remaining tokens and the blocks others may
        need; stores them in ``seq.draft`` and returns how many."""
        seq.clear_draft()
        gamma = min(self.config.speculative_tokens, spare,
                    seq.max_tokens - len(seq.output) - 1)
        if gamma <= 0 or seq.num_uncomputed != 1 or seq.in_prefill \
                or seq.params.uses_history:  # p would depend on the guesses
            return 0
        draft = self.guess(seq, gamma)[:gamma]
        extra_blocks = (self.blocks.new_blocks_needed(seq, 1 + len(draft))
                        - self.blocks.new_blocks_needed(seq, 1))
        if extra_blocks > self.blocks.num_free - len(self.running):
            return 0
        seq.draft = draft
        return len(draft)

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
            _check_victims(victims, need, free, held)
            for i in victims:
                self._preempt(candidates[i], step)
            if 0 in victims:
                return False
        step.copies += self.blocks.reserve(seq, n)
        return True

    def _preempt(self, seq: Sequence, step: Step) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed, seq.status = 0, Status.WAITING
        seq.clear_draft()
        self.waiting.appendleft(seq)
        step.preempted.append(seq)

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

    def finish_step(self, step: Step, sampled: dict[int, list[int]], now: float | None = None
                    ) -> list[Sequence]:
        """Count the computed tokens, append each sequence's new tokens (its accepted draft,
        then one sampled token, for sequences whose every token is now computed), name its
        full verified blocks (prefix cache), fork the other samples of a request whose
        prompt is now in (:meth:`_fork`), release finished sequences. Returns the finished
        ones."""
        done = []
        for seq, n in step.work:
            new = sampled.get(seq.id, [])
            accepted = len(new) - 1 if seq.draft else 0
            seq.num_computed += n - (len(seq.draft) - accepted)  # rejected guesses do not count
            seq.num_drafted += len(seq.draft)
            seq.num_accepted += accepted
            seq.clear_draft()
            forks = [s for s in seq.unforked_samples if s.id in sampled]
            for token in new:
                seq.append(token, now)
                if seq.finished:  # a stop token among the accepted guesses: drop the rest
                    seq.num_computed = min(seq.num_computed, seq.num_tokens)
                    break
            self.blocks.commit(seq)
            done += [s for s in forks if self._fork(seq, s, sampled[s.id][0], now).finished]
            if seq.finished:
                done.append(seq)
        if self.config.policy != "continuous":  # lockstep: seats free when all are done
            if all(seq.finished for seq in self.running):
                for seq in self.running:
                    self.blocks.free(seq)
                self.running = []
            return done
        for seq in done:
            self.running.remove(seq)
            self.blocks.free(seq)
        return done

    def _fork(self, parent: Sequence, sample: Sequence, token: int, now: float | None
              ) -> Sequence:
        """Start one of ``parent``'s other samples: it shares the computed prompt's blocks
        (copy-on-write) and takes ``token``, drawn from the same logits, as its first."""
        self.blocks.fork(parent, sample)
        sample.status = Status.RUNNING
        self.running.append(sample)
        sample.append(token, now)
        return sample


def _check_plan(counts: list[int], needs: list[int], waiting_needs: list[int],
                budget: int) -> None:
    """A plan may not overspend the budget, give a request more than it needs, or admit a
    request out of turn: say which rule it broke."""
    if not len(needs) <= len(counts) <= len(needs) + len(waiting_needs):
        raise ValueError(f"plan returned {len(counts)} counts for {len(needs)} running and "
                         f"{len(waiting_needs)} waiting requests")
    joining = counts[len(needs):]
    if any(not 0 <= n <= need for n, need in zip(counts, needs, strict=False)) \
            or any(not 1 <= n <= need for n, need in zip(joining, waiting_needs, strict=False)):
        raise ValueError(f"plan gave {counts} tokens to requests needing {needs} (running) "
                         f"and {waiting_needs} (waiting)")
    if sum(counts) > budget:
        raise ValueError(f"plan spends {sum(counts)} tokens of a budget of {budget}")


def _check_victims(victims: list[int], need: int, free: int, held: list[int]) -> None:
    """The victims must be distinct candidates that free enough blocks (or end with the
    requester, index 0), and no more than enough: say which rule they broke."""
    if len(set(victims)) != len(victims) or not all(
            isinstance(i, int) and 0 <= i < len(held) for i in victims):
        raise ValueError(f"preempt returned {victims}: give distinct indices of the "
                         f"{len(held)} candidates (0 is the requester)")
    if 0 in victims[:-1]:
        raise ValueError(f"preempt returned {victims}: the requester (0) gets nothing once "
                         "it is preempted, so it must be the last victim")
    freed = [held[i] for i in victims]
    if 0 not in victims and free + sum(freed) < need:
        raise ValueError(f"preempt returned {victims}, freeing {sum(freed)} blocks: with "
                         f"{free} free the requester needs {need}; preempt more, or the "
                         "requester (0) last")
    if free + sum(freed[:-1]) >= need:
        raise ValueError(f"preempt returned {victims}: the blocks were enough before the "
                         f"last victim ({free} free, {need} needed, held {held})")
