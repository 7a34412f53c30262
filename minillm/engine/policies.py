"""The scheduling policy: what one engine step runs, decided from a read-only view.

The scheduler (:mod:`.scheduler`) is mechanism: it keeps the queues, reserves blocks and
applies what each step computed. *What* a chunked-prefill step runs is decided by one
policy, a function of a :class:`SchedulerState` (plain numbers, and two read-only block
queries) returning a :class:`StepDecision`, so it is tested without a model and it is the
seam the course's lab plugs into (``SchedulerConfig(step_policy=...)``):

* the token budget is split decodes first, then prompt chunks, first come first served
  (Agrawal et al. 2023, Sarathi-Serve; :func:`plan_chunked_step`);
* when the pool runs out of blocks, running requests are preempted by recompute, the
  latest started first (Kwon et al. 2023, vLLM §4.5), and each victim's cost in recomputed
  tokens is counted.

The scheduler checks every decision (:func:`check_decision`) and says which rule a wrong
one broke, so a bug in a policy gets a message, not a hang.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunningView:
    """A running request, as the policy sees it: the tokens it still has to compute
    (``uncomputed``: 1 for a decode), the tokens whose keys and values it holds
    (``computed``) of its ``num_tokens``, its KV ``blocks`` (ids; a block may be shared
    with another request; -1: released, behind a sliding window) and how many of its
    first blocks are named in the prefix cache (``cached_blocks``: a restart would find
    them)."""

    uncomputed: int
    computed: int
    num_tokens: int
    blocks: tuple[int, ...]
    cached_blocks: int = 0


@dataclass(frozen=True)
class WaitingView:
    """A waiting request: the tokens it has to compute once its cached prefix is reused
    (``uncomputed``), and the blocks that prefix takes from the free pool when it starts
    (``free_cached``: cached blocks nobody holds now)."""

    uncomputed: int
    free_cached: int = 0


@dataclass(frozen=True)
class SchedulerState:
    """What one step may use: the ``running`` requests in the order they started, the
    ``waiting`` ones that could take a seat (first come, first served), ``free_blocks``
    free blocks of ``block_size`` tokens, the step's ``token_budget`` and ``max_batch``
    seats (``running`` may hold that many or more: a request with n samples takes n)."""

    running: tuple[RunningView, ...]
    waiting: tuple[WaitingView, ...]
    free_blocks: int
    block_size: int
    token_budget: int
    max_batch: int
    ref_counts: Mapping[int, int] = field(default_factory=dict)  # holders of each block

    def free_after(self, gone: Collection[int] = ()) -> int:
        """Free blocks once the running requests ``gone`` (indices) are preempted: each
        block that only they hold goes back to the pool."""
        held: dict[int, int] = {}
        for i in set(gone):
            for block in self.running[i].blocks:
                if block >= 0:  # not released (behind a sliding window)
                    held[block] = held.get(block, 0) + 1
        return self.free_blocks + sum(n == self.ref_counts.get(b, 1) for b, n in held.items())

    def blocks_needed(self, i: int, tokens: int, gone: Collection[int] = ()) -> int:
        """New blocks running request ``i`` takes for ``tokens`` more tokens, with the
        running requests ``gone`` preempted (a shared block it writes into is copied)."""
        seq = self.running[i]
        end = seq.computed + tokens
        needed = max(-(-end // self.block_size) - len(seq.blocks), 0)
        first = seq.computed // self.block_size
        if tokens > 0 and first < len(seq.blocks):
            block = seq.blocks[first]
            sharers = sum(block in self.running[j].blocks for j in set(gone) if j != i)
            needed += self.ref_counts.get(block, 1) - sharers > 1
        return needed

    def join_blocks(self, j: int, tokens: int) -> int:
        """Blocks waiting request ``j`` takes from the free pool to join with ``tokens``
        prompt tokens (its cached prefix blocks nobody holds, then new ones)."""
        seq = self.waiting[j]
        return seq.free_cached + -(-tokens // self.block_size)


@dataclass(frozen=True)
class StepDecision:
    """One step: ``tokens`` per running request (0: nothing this step), ``joins``: prompt
    tokens per waiting request that starts (a prefix of the queue), and ``preempted``:
    (running index, tokens it will compute again) per victim, the latest started first."""

    tokens: tuple[int, ...]
    joins: tuple[int, ...] = ()
    preempted: tuple[tuple[int, int], ...] = ()


StepPolicy = Callable[[SchedulerState], StepDecision]


def plan_chunked_step(running: list[int], waiting: list[int], token_budget: int,
                      max_running: int) -> list[int]:
    """How one chunked-prefill step spends its token budget (Sarathi's order, FCFS):
    decodes first (one token each), then the started prompts in order, then waiting
    requests join in order while seats and budget remain; any prompt may get a chunk.
    Returns one count per running request, then one (>= 1) per waiting one that joins."""
    counts = [0] * len(running)
    for decodes_pass in (True, False):
        for i, need in enumerate(running):
            if (need == 1) == decodes_pass:
                counts[i] = min(need, token_budget)
                token_budget -= counts[i]
    for need in waiting[:max(max_running - len(running), 0)]:  # seats may be full already
        if token_budget == 0:
            break
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    return counts


def recompute_cost(seq: RunningView, block_size: int) -> int:
    """Tokens a preempted request computes again: its computed ones past the cached
    blocks a restart finds (never the block holding its last token)."""
    resumable = min(seq.cached_blocks, (seq.num_tokens - 1) // block_size)
    return max(seq.computed - block_size * resumable, 0)


def schedule_step(state: SchedulerState) -> StepDecision:
    """The library's policy: Sarathi's budget split, then blocks for the running requests
    in start order, preempting the latest started until each fits (the requester itself
    last); joiners only if nobody was preempted, while blocks last."""
    counts = plan_chunked_step([r.uncomputed for r in state.running],
                               [w.uncomputed for w in state.waiting],
                               state.token_budget, state.max_batch)
    tokens, joins = counts[:len(state.running)], counts[len(state.running):]
    gone: list[int] = []
    used = 0
    for i, n in enumerate(tokens):
        if not n or i in gone:
            continue
        while i not in gone and \
                state.blocks_needed(i, n, gone) > state.free_after(gone) - used:
            gone.append(max(j for j in range(i, len(tokens)) if j not in gone))
        if i not in gone:
            used += state.blocks_needed(i, n, gone)
    for i in gone:
        tokens[i] = 0
    free = state.free_after(gone) - used
    admitted = []
    for j, n in enumerate(joins if not gone else []):
        if state.join_blocks(j, n) > free:
            break
        admitted.append(n)
        free -= state.join_blocks(j, n)
    return StepDecision(tuple(tokens), tuple(admitted),
                        tuple((i, recompute_cost(state.running[i], state.block_size))
                              for i in gone))


def check_decision(decision: StepDecision, state: SchedulerState) -> None:
    """A decision may not overspend the budget or the seats, give a request more than it
    needs, admit out of turn, schedule a victim, run short of blocks, or do nothing while
    something could run (the engine would step forever): say which rule it broke."""
    tokens, joins = list(decision.tokens), list(decision.joins)
    victims = [i for i, _ in decision.preempted]
    if len(tokens) != len(state.running) or len(joins) > len(state.waiting):
        raise ValueError(f"step policy returned {len(tokens)} token counts and {len(joins)} "
                         f"joins for {len(state.running)} running and {len(state.waiting)} "
                         "waiting requests: one count per running request, joins a prefix "
                         "of the queue")
    if any(not 0 <= n <= r.uncomputed for n, r in zip(tokens, state.running, strict=True)) \
            or any(not 1 <= n <= w.uncomputed for n, w in zip(joins, state.waiting,
                                                              strict=False)):
        raise ValueError(f"step policy gave {tokens} + joins {joins} tokens to requests "
                         f"needing {[r.uncomputed for r in state.running]} (running) and "
                         f"{[w.uncomputed for w in state.waiting]} (waiting)")
    if sum(tokens) + sum(joins) > state.token_budget:
        raise ValueError(f"step policy spends {sum(tokens) + sum(joins)} tokens of a budget "
                         f"of {state.token_budget}")
    if joins and len(state.running) + len(joins) > state.max_batch:
        raise ValueError(f"step policy lets {len(joins)} join {len(state.running)} running "
                         f"requests: more than max_batch={state.max_batch}")
    if len(set(victims)) != len(victims) or any(
            not 0 <= i < len(tokens) or tokens[i] for i in victims):
        raise ValueError(f"step policy preempted {victims}: distinct running indices, each "
                         "scheduled for 0 tokens (a victim runs nothing this step)")
    if any(not 0 <= cost <= state.running[i].computed for i, cost in decision.preempted):
        raise ValueError(f"step policy says the victims {list(decision.preempted)} recompute "
                         "more tokens than they had computed, or fewer than none")
    if victims and joins:
        raise ValueError("step policy preempted requests and admitted others: a victim goes "
                         "back to the front of the queue, so nobody may join before it")
    need = sum(state.blocks_needed(i, n, victims) for i, n in enumerate(tokens) if n) + \
        sum(state.join_blocks(j, n) for j, n in enumerate(joins))
    if need > state.free_after(victims):
        raise ValueError(f"step policy needs {need} blocks with {state.free_after(victims)} "
                         f"free once its victims {victims} are preempted: preempt more")
    if not (sum(tokens) or joins or victims) and state.token_budget and (
            state.running or state.waiting and state.free_blocks >= state.join_blocks(
                0, min(state.token_budget, state.waiting[0].uncomputed))):
        raise ValueError(f"step policy gave no tokens to any of {len(state.running)} running "
                         f"and {len(state.waiting)} waiting requests with a budget of "
                         f"{state.token_budget}, and preempted nobody: the engine would make "
                         "no progress; give at least one token")
