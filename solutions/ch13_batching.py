"""Chapter 13: batching and scheduling.

**The lab (13.1): the scheduling policy.** The engine's scheduler (:mod:`minillm.engine.
scheduler`) is mechanism: it keeps the queues, reserves KV blocks and applies what a step
computed. Every chunked-prefill step it hands a policy a read-only view of its state and
applies the decision it gets back: which requests compute how many tokens, who joins, and
who is preempted when the blocks run out, at what cost. You write that policy
(``schedule_step``, plugged in as ``SchedulerConfig(step_policy=...)``), with the cost of
one preemption (``recompute_tokens``). The engine checks every decision
(:func:`minillm.engine.policies.check_decision`) and says which rule a wrong one broke.

Warm-ups (13.2-13.4, small and step by step): latency metrics, what static batching
costs, a roofline model of one engine step.
"""

from __future__ import annotations

from minillm.engine.policies import SchedulerState, StepDecision
from minillm.engine.simulator import CostModel

# -- the lab: the scheduling policy --------------------------------------------------------


def schedule_step(state: SchedulerState) -> StepDecision:
    """Exercise 13.1: The scheduling policy: what one engine step runs, and who makes room.

    The engine's scheduler calls this once per chunked-prefill step, then checks the
    decision and applies it: it preempts the victims (their blocks go back to the pool,
    they return to the front of the queue), reserves blocks for the running requests in
    start order, then starts the joiners.

    Input, ``state`` (:class:`minillm.engine.policies.SchedulerState`, read-only):
    ``running``, in the order they started, each with ``uncomputed`` (1: a decode; more: a
    prompt, or a recomputed request, not all computed yet), ``computed``, ``num_tokens``,
    ``blocks`` and ``cached_blocks``; ``waiting``, the requests that could take a free seat,
    oldest first (a request preempted earlier is first again), each with ``uncomputed``
    (after its cached prefix); ``free_blocks``, ``block_size``, ``token_budget`` (>= 1) and
    ``max_batch`` (``running`` may hold that many or more). Block queries:
    ``state.blocks_needed(i, n, gone)``, ``state.free_after(gone)`` and
    ``state.join_blocks(j, n)``, for running requests ``gone`` preempted.

    Returns a :class:`~minillm.engine.policies.StepDecision`: ``tokens`` (one count per
    running request, 0: nothing), ``joins`` (prompt tokens per joining request, a prefix of
    ``waiting``) and ``preempted`` ((running index, tokens it will compute again) per
    victim, in the order they go).

    Invariants (checked on random states against the library's policy):
      * budget and seats: at most ``token_budget`` tokens in all, at most ``max_batch``
        requests once the joiners are in; a request never gets more than ``uncomputed``; a
        joiner gets >= 1; a long prompt may get just a chunk.
      * decodes first, then started prompts in start order, then the queue in order (FCFS);
        no budget is left unspent while a seated request could use it.
      * blocks: what is scheduled fits in the free blocks once the victims' blocks are
        back; when it does not, the latest started unserved request goes first, one at a
        time, just enough (the requester itself last: then it gets nothing); a victim
        gets no tokens; nobody joins in a step that preempts, and joiners stop at the
        first whose blocks do not fit.
      * progress: if anything fits, the oldest running request gets a token (or, with
        nobody running, the first waiting one joins).
      * a victim's cost is ``recompute_tokens`` of its state.

    Hints: sections 5, 6 and 9 of notebooks/13_batching.ipynb; Orca's iteration-level
    scheduling (Yu et al. 2022); Sarathi-Serve's stall-free batching (Agrawal et al. 2024);
    vLLM's preemption by recompute (Kwon et al. 2023, §4.5).
    """
    ### BEGIN SOLUTION
    running, budget = state.running, state.token_budget
    tokens = [0] * len(running)
    decodes = [i for i, r in enumerate(running) if r.uncomputed == 1]
    prompts = [i for i, r in enumerate(running) if r.uncomputed > 1]
    for i in decodes + prompts:  # Sarathi: decodes first, then chunks in start order
        tokens[i] = min(running[i].uncomputed, budget)
        budget -= tokens[i]
    joins = []
    for waiting in state.waiting[:max(state.max_batch - len(running), 0)]:
        if budget == 0:
            break
        joins.append(min(waiting.uncomputed, budget))
        budget -= joins[-1]

    gone: list[int] = []  # victims, the latest started first
    used = 0  # blocks reserved for the requests served so far
    for i, n in enumerate(tokens):
        if n == 0 or i in gone:
            continue
        while i not in gone and \
                state.blocks_needed(i, n, gone) > state.free_after(gone) - used:
            latest = max(j for j in range(i, len(running)) if j not in gone)
            gone.append(latest)  # its blocks are free for the others now
        if i not in gone:
            used += state.blocks_needed(i, n, gone)
    for i in gone:
        tokens[i] = 0

    free = state.free_after(gone) - used
    admitted = []
    for j, n in enumerate(joins if not gone else []):  # victims are first in the queue
        if state.join_blocks(j, n) > free:
            break
        admitted.append(n)
        free -= state.join_blocks(j, n)
    costs = [recompute_tokens(running[i].computed, running[i].num_tokens,
                              running[i].cached_blocks, state.block_size) for i in gone]
    return StepDecision(tuple(tokens), tuple(admitted), tuple(zip(gone, costs, strict=True)))
    ### END SOLUTION


def recompute_tokens(computed: int, num_tokens: int, cached_blocks: int,
                     block_size: int) -> int:
    """Exercise 13.1: The scheduling policy: what one preemption costs in recomputed tokens.

    A victim had computed the keys and values of its first ``computed`` tokens (of its
    ``num_tokens``: prompt and output so far, ``computed < num_tokens``); preemption
    dropped them. When it restarts, the prefix cache (chapter 12) holds its first
    ``cached_blocks`` full blocks of ``block_size`` tokens (its own freed blocks the pool
    has not handed out yet, or a twin request's), and the engine skips those, except that
    the block holding its last token is always computed (that token's logits give the next
    token). ``schedule_step`` reports this for each victim.

    Returns how many of the ``computed`` tokens the restart computes again: 0 <= result
    <= ``computed`` (tokens it had never computed are new work, not recompute).

    Hint: the cell "Whom to preempt, and what it costs" in the notebook.
    """
    ### BEGIN SOLUTION
    resumable_blocks = min(cached_blocks, (num_tokens - 1) // block_size)
    return max(computed - block_size * resumable_blocks, 0)
    ### END SOLUTION


# -- warm-ups ------------------------------------------------------------------------------


def request_latencies(arrival: float, token_times: list[float]) -> dict:
    """Exercise 13.2: (warm-up) One request's latencies from its arrival and its tokens' times.

    vLLM's definitions, for tokens that came at t_1 .. t_n. Returns a dict with ``ttft``
    (time to first token: t_1 - arrival), ``e2e`` (t_n - arrival), ``tpot`` (time per
    output token after the first: (e2e - ttft) / (n - 1), None for a single token) and
    ``itl`` (the list of inter-token gaps t_{i+1} - t_i, empty for a single token).
    """
    ### BEGIN SOLUTION
    n = len(token_times)
    ttft = token_times[0] - arrival
    e2e = token_times[-1] - arrival
    return {"ttft": ttft, "e2e": e2e,
            "tpot": (e2e - ttft) / (n - 1) if n > 1 else None,
            "itl": [b - a for a, b in zip(token_times[:-1], token_times[1:], strict=True)]}
    ### END SOLUTION


def static_batching_steps(output_lengths: list[int], max_batch: int) -> int:
    """Exercise 13.3: (warm-up) How many steps static batching takes to produce these outputs.

    Requests are taken in order, ``max_batch`` at a time; a batch's first step computes
    the prompts and samples every request's first token, then one step per further token,
    until its LONGEST request is done (finished requests keep their seats). The next batch
    starts after that. Returns the total number of steps (every request has length >= 1).
    """
    ### BEGIN SOLUTION
    return sum(max(output_lengths[i:i + max_batch])
               for i in range(0, len(output_lengths), max_batch))
    ### END SOLUTION


def roofline_step_time(new_tokens: int, cached_tokens: int, cost: CostModel) -> float:
    """Exercise 13.4: (warm-up) One step's time on the roofline: the slower of memory and compute.

    A step reads every weight once (``cost.weight_bytes``) and the keys and values of the
    ``cached_tokens`` its sequences attend to (``cost.kv_bytes_per_token`` each) at
    ``cost.bandwidth`` bytes/s, and does ``cost.flops_per_token`` FLOPs for each of its
    ``new_tokens`` at ``cost.flops`` FLOP/s. Memory and compute overlap, so the step takes
    the longer of the two, plus ``cost.overhead`` seconds outside the model.
    """
    ### BEGIN SOLUTION
    memory = (cost.weight_bytes + cached_tokens * cost.kv_bytes_per_token) / cost.bandwidth
    compute = new_tokens * cost.flops_per_token / cost.flops
    return cost.overhead + max(memory, compute)
    ### END SOLUTION
