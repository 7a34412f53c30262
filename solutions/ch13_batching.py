"""Chapter 13: batching and scheduling.

**The lab (13.1): the scheduling policy.** The engine's scheduler (:mod:`minillm.engine.
scheduler`) is mechanism: it keeps the queues, reserves KV blocks and applies what a step
computed. Every step it asks a policy two questions, as pure functions of numbers, and you
write the answers: how the step's token budget is spent (``plan_step``, called as
``SchedulerConfig(plan=...)``) and which running requests give their blocks back when the
pool runs out (``preemption_victims``, ``SchedulerConfig(preempt=...)``); then what such a
preemption costs (``recompute_tokens``). The engine checks every answer
(:func:`minillm.engine.policies.check_plan`, :func:`~minillm.engine.policies.check_victims`)
and says which rule a wrong one broke.

Warm-ups (13.2-13.4, small and step by step): latency metrics, what static batching
costs, a roofline model of one engine step.
"""

from __future__ import annotations

from minillm.engine.simulator import CostModel

# -- the lab: the scheduling policy --------------------------------------------------------


def plan_step(running: list[int], waiting: list[int], token_budget: int,
              max_batch: int) -> list[int]:
    """Exercise 13.1: The scheduling policy: how one step spends its token budget.

    The engine calls this every step with chunked prefill (Sarathi, Agrawal et al. 2023)
    and then reserves blocks for what it returns.

    Inputs:
      ``running``: per running request, in the order they started, the tokens it still
      has to compute (1: a decode; more: a prompt, or a recomputed request, part of which
      is still to be computed). ``waiting``: the same for the queue, oldest first (a
      request preempted earlier is first again). ``token_budget`` >= 0: the most tokens
      one forward pass may compute. ``max_batch`` >= 1: the most requests running at once
      (``running`` may already hold that many, or more).

    Returns ``counts``: one count per running request (0: nothing this step), followed by
    one count per waiting request that joins this step; joiners are a prefix of
    ``waiting``.

    Invariants (the tests check each on random queues, against the library's policy):
      * budget: ``sum(counts) <= token_budget``, and ``0 <= count <= need`` for each
        request; a joiner gets at least 1 token. A prompt may get just a chunk.
      * seats: ``len(counts) <= max(len(running), max_batch)``.
      * decodes first: no prompt token (running or joining) is computed while a decode
        gets nothing; a decode's token is what its stream is waiting for.
      * first come, first served: started prompts in the order they started, then the
        queue in order; nobody joins while a running request is short of its need, and a
        prompt gets tokens only if every prompt before it got all it needs.
      * no budget wasted: ``sum(counts) == min(token_budget, N)``, where N is what the
        running requests need plus what the first ``max_batch - len(running)`` waiting
        requests (none if that is not positive) need.

    Hints: sections 5 and 9 of notebooks/13_batching.ipynb; Sarathi-Serve's "stall-free
    batching" (Agrawal et al. 2024); :func:`minillm.engine.policies.check_plan`.
    """
    ### BEGIN SOLUTION
    counts = [0] * len(running)
    decodes = [i for i, need in enumerate(running) if need == 1]
    started_prompts = [i for i, need in enumerate(running) if need > 1]
    for i in decodes + started_prompts:
        counts[i] = min(running[i], token_budget)
        token_budget -= counts[i]
    free_seats = max(max_batch - len(running), 0)
    for need in waiting[:free_seats]:
        if token_budget == 0:
            break
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    return counts
    ### END SOLUTION


def preemption_victims(need: int, free: int, held: list[int]) -> list[int]:
    """Exercise 13.1: The scheduling policy: whom to preempt when the KV blocks run out.

    The engine calls this when a running request (the *requester*) needs ``need`` more
    blocks and the pool has only ``free`` < ``need`` free ones (it may also be called with
    enough free: then nobody goes). Preemption is by recompute: a victim's blocks go back
    to the pool and it returns to the front of the queue, to be computed again later.

    Inputs: ``held``: the blocks held by the requester (``held[0]``) and by each running
    request that started after it, in the order they started (``len(held) >= 1``). Those
    are the only candidates: the step serves running requests in start order, so the
    ones before the requester already have their blocks for this step.

    Returns the victims' indices into ``held``, in the order they are preempted.

    Invariants:
      * first come, first served: a request is never preempted while a request that
        started after it keeps its blocks (so the oldest running request always makes
        progress and none starves; Kwon et al. 2023, §4.5); the requester counts as the
        oldest candidate.
      * enough: ``free`` plus the victims' blocks reach ``need``, or the requester itself
        is among the victims (then it is the last one: it gets nothing this step).
      * no more than enough: without the last victim the blocks would not have sufficed
        (``[]`` when ``free >= need``).

    Hints: section 6 of the notebook; the PagedAttention paper (Kwon et al. 2023, §4.5);
    :func:`minillm.engine.policies.check_victims`.
    """
    ### BEGIN SOLUTION
    victims = []
    for i in reversed(range(len(held))):  # the latest started first, the requester last
        if free >= need:
            break
        victims.append(i)
        free += held[i]
    return victims
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
    token).

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
