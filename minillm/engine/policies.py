"""The scheduler's two policies, as pure functions of token and block counts.

The scheduler (:mod:`.scheduler`) is mechanism: it keeps the queues, reserves blocks and
applies what each step computed. *What* a step runs is decided by two functions of plain
numbers, so each is tested without a model and each is a seam the course's labs plug
into (``SchedulerConfig(plan=...)``, ``SchedulerConfig(preempt=...)``):

* :func:`plan_chunked_step`: how one chunked-prefill step spends its token budget
  (Agrawal et al. 2023, Sarathi-Serve: decodes first, then prompt chunks);
* :func:`preemption_victims`: which running requests give their blocks back when the
  pool runs out (vLLM's policy: the latest started first).

The scheduler checks what a plug-in returns (:func:`check_plan`, :func:`check_victims`)
and says which rule a wrong answer broke.
"""

from __future__ import annotations

from collections.abc import Callable


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
    for need in waiting[:max(max_running - len(running), 0)]:  # seats may be full already
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


def check_plan(counts: list[int], needs: list[int], waiting_needs: list[int],
                budget: int) -> None:
    """A plan may not overspend the budget, give a request more than it needs, admit a
    request out of turn, or give nothing at all while requests wait for tokens (the engine
    would step forever without progress): say which rule it broke."""
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
    if sum(counts) == 0 and (needs or waiting_needs):
        raise ValueError(f"plan gave no tokens to any of {len(needs)} running and "
                         f"{len(waiting_needs)} waiting requests with a budget of {budget}: "
                         "the engine would make no progress; give at least one token")


def check_victims(victims: list[int], need: int, free: int, held: list[int]) -> None:
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
    if victims and free + sum(freed[:-1]) >= need:  # [] is right when enough are free
        raise ValueError(f"preempt returned {victims}: the blocks were enough before the "
                         f"last victim ({free} free, {need} needed, held {held})")
