"""Chapter 13: batching and scheduling — a continuous-batching step with chunked prefill,
latency metrics, what static batching costs, a roofline model of one engine step, and which
request to preempt when the KV blocks run out (and what it costs)."""

from __future__ import annotations

from minillm.engine.simulator import CostModel


def plan_step(running: list[int], waiting: list[int], token_budget: int,
              max_running: int) -> list[int]:
    """Exercise 13.1: Split one step's token budget: decodes first, then prompt chunks, FCFS.

    ``running``: the tokens each running request still has to compute (1 for a decode,
    more for a prompt not yet all computed), in the order they started; ``waiting``: the
    same for the queue, oldest first. In this order, each takes ``min(what it needs, budget
    left)``: first every decode (need 1), then the started prompts, then waiting requests
    while budget is left and fewer than ``max_running`` requests run (the running ones
    count). Returns one count per running request (0 if the budget ran out before it),
    followed by one count (>= 1) per waiting request that joins.
    Hint: two passes over ``running`` (decodes, then the rest) fill a list of zeros.
    """
    ### BEGIN SOLUTION
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
    ### END SOLUTION


def request_latencies(arrival: float, token_times: list[float]) -> dict:
    """Exercise 13.2: One request's latencies from its arrival and its tokens' times.

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
    """Exercise 13.3: How many steps static batching takes to produce these outputs.

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
    """Exercise 13.4: The time of one engine step on the roofline: the slower of memory and compute.

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


def preemption_victims(need: int, free: int, held: list[int]) -> list[int]:
    """Exercise 13.5: Which running requests to preempt when the pool runs short: latest first.

    A running request needs ``need`` more blocks and only ``free`` are free. ``held``: the
    blocks held by that request (``held[0]``, the requester) and by each running request
    that started after it, in the order they started (the step serves running requests in
    that order, so these are the ones it has not reached yet). vLLM preempts the latest
    started first (first come, first served: older requests keep their place); each victim
    frees the blocks it holds. Stop as soon as ``free`` plus the freed blocks reach
    ``need``; if they never do, the requester itself is the last victim (it gets nothing
    this step). Returns the victims' indices in the order they go ([] if nothing has to).
    Hint: walk ``held`` backwards.
    """
    ### BEGIN SOLUTION
    victims = []
    for i in reversed(range(len(held))):
        if free >= need:
            break
        victims.append(i)
        free += held[i]
    return victims
    ### END SOLUTION


def recompute_tokens(computed: int, num_tokens: int, cached_blocks: int,
                     block_size: int) -> int:
    """Exercise 13.5: The tokens a preempted request computes again when it restarts.

    Preemption by recompute threw away the keys and values of the ``computed`` tokens the
    request had (of its ``num_tokens``: prompt and output so far). Its freed full blocks
    stay in the prefix cache until the pool reuses them, so when it restarts it finds its
    first ``cached_blocks`` full blocks of ``block_size`` tokens there (another request
    with the same tokens may have filled some) and starts after them; but the block that
    holds its last token is always computed (that token's logits give the next token).
    Returns how many of the ``computed`` tokens it must compute again (never negative:
    tokens it had not computed yet are new work, not recompute).
    """
    ### BEGIN SOLUTION
    resumed = block_size * min(cached_blocks, (num_tokens - 1) // block_size)
    return max(computed - resumed, 0)
    ### END SOLUTION
