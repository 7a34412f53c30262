"""Plausible wrong answers to chapter 13 (batching and scheduling); the graded tests must
catch each one. Each mutant replaces the solution function named before its ``__``."""

import math


def plan_step__running_in_start_order(running, waiting, token_budget, max_batch):
    """Serves running requests in the order they started: an older prompt's chunk can eat
    the budget of the decodes (no decodes-first rule)."""
    counts = []
    for need in running:
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    for need in waiting[:max(max_batch - len(running), 0)]:
        if token_budget == 0:
            break
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    return counts


def plan_step__whole_prompts_only(running, waiting, token_budget, max_batch):
    """Admits a waiting request only if its whole prompt fits (no chunked prefill)."""
    counts = [0] * len(running)
    for decodes_pass in (True, False):
        for i, need in enumerate(running):
            if (need == 1) == decodes_pass:
                counts[i] = min(need, token_budget)
                token_budget -= counts[i]
    for need in waiting[:max(max_batch - len(running), 0)]:
        if need > token_budget:
            break
        counts.append(need)
        token_budget -= need
    return counts


def plan_step__seats_ignore_running(running, waiting, token_budget, max_batch):
    """Lets up to max_batch waiting requests join whatever is already running."""
    counts = [0] * len(running)
    for decodes_pass in (True, False):
        for i, need in enumerate(running):
            if (need == 1) == decodes_pass:
                counts[i] = min(need, token_budget)
                token_budget -= counts[i]
    for need in waiting[:max_batch]:
        if token_budget == 0:
            break
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    return counts


def plan_step__budget_per_request(running, waiting, token_budget, max_batch):
    """Gives every request up to the whole budget instead of what is left of it."""
    counts = [min(need, token_budget) for need in running]
    seats = max(max_batch - len(running), 0)
    return counts + [min(need, token_budget) for need in waiting[:seats]]


def plan_step__ignores_max_batch(running, waiting, token_budget, max_batch):
    """Lets every waiting request join while budget is left, whatever the seats."""
    counts = [0] * len(running)
    for decodes_pass in (True, False):
        for i, need in enumerate(running):
            if (need == 1) == decodes_pass:
                counts[i] = min(need, token_budget)
                token_budget -= counts[i]
    for need in waiting:
        if token_budget == 0:
            break
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    return counts


def plan_step__joins_before_started_prompts(running, waiting, token_budget, max_batch):
    """Serves decodes, then newcomers, then the started prompts: a waiting request joins
    while a running one is still short of its need."""
    counts = [min(need, token_budget) if need == 1 else 0 for need in running]
    token_budget -= sum(counts)
    for need in waiting[:max(max_batch - len(running), 0)]:
        if token_budget == 0:
            break
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    for i, need in enumerate(running):
        if need > 1:
            counts[i] = min(need, token_budget)
            token_budget -= counts[i]
    return counts


def plan_step__budget_off_by_one(running, waiting, token_budget, max_batch):
    """Stops admitting with one token of budget left (``token_budget <= 1``): a one-token
    chunk is still work the step could do."""
    counts = [0] * len(running)
    for decodes_pass in (True, False):
        for i, need in enumerate(running):
            if (need == 1) == decodes_pass:
                counts[i] = min(need, token_budget)
                token_budget -= counts[i]
    for need in waiting[:max(max_batch - len(running), 0)]:
        if token_budget <= 1:
            break
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    return counts


def plan_step__negative_seats(running, waiting, token_budget, max_batch):
    """Slices the queue with ``max_batch - len(running)`` unguarded: when more requests run
    than there are seats, the negative slice lets nearly the whole queue join."""
    counts = [0] * len(running)
    for decodes_pass in (True, False):
        for i, need in enumerate(running):
            if (need == 1) == decodes_pass:
                counts[i] = min(need, token_budget)
                token_budget -= counts[i]
    for need in waiting[:max_batch - len(running)]:
        if token_budget == 0:
            break
        counts.append(min(need, token_budget))
        token_budget -= counts[-1]
    return counts


def request_latencies__tpot_over_all_tokens(arrival, token_times):
    """Divides the whole latency by n: TPOT = E2E / n, the first token's wait included."""
    ttft, e2e = token_times[0] - arrival, token_times[-1] - arrival
    return {"ttft": ttft, "e2e": e2e, "tpot": e2e / len(token_times),
            "itl": [b - a for a, b in zip(token_times[:-1], token_times[1:], strict=True)]}


def request_latencies__tpot_over_n(arrival, token_times):
    """Divides the time after the first token by n instead of n - 1."""
    n = len(token_times)
    ttft, e2e = token_times[0] - arrival, token_times[-1] - arrival
    return {"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / n if n > 1 else None,
            "itl": [b - a for a, b in zip(token_times[:-1], token_times[1:], strict=True)]}


def request_latencies__itl_from_arrival(arrival, token_times):
    """Counts the wait for the first token as an inter-token gap."""
    n = len(token_times)
    ttft, e2e = token_times[0] - arrival, token_times[-1] - arrival
    times = [arrival, *token_times]
    return {"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / (n - 1) if n > 1 else None,
            "itl": [b - a for a, b in zip(times[:-1], times[1:], strict=True)]}


def request_latencies__e2e_from_first_token(arrival, token_times):
    """Measures the end-to-end latency from the first token, not from the arrival."""
    n = len(token_times)
    ttft, e2e = token_times[0] - arrival, token_times[-1] - token_times[0]
    return {"ttft": ttft, "e2e": e2e, "tpot": e2e / (n - 1) if n > 1 else None,
            "itl": [b - a for a, b in zip(token_times[:-1], token_times[1:], strict=True)]}


def static_batching_steps__continuous_ideal(output_lengths, max_batch):
    """Counts the tokens spread evenly over the seats: what continuous batching could reach."""
    return math.ceil(sum(output_lengths) / max_batch)


def static_batching_steps__sorted_batches(output_lengths, max_batch):
    """Groups requests of similar length first: not the arrival order static batching has."""
    ordered = sorted(output_lengths)
    return sum(max(ordered[i:i + max_batch]) for i in range(0, len(ordered), max_batch))


def static_batching_steps__extra_prefill_step(output_lengths, max_batch):
    """Adds a prefill step per batch, though the prefill already samples the first token."""
    return sum(max(output_lengths[i:i + max_batch]) + 1
               for i in range(0, len(output_lengths), max_batch))


def roofline_step_time__sum_not_max(new_tokens, cached_tokens, cost):
    """Adds memory and compute time, as if the machine could not overlap them."""
    memory = (cost.weight_bytes + cached_tokens * cost.kv_bytes_per_token) / cost.bandwidth
    return cost.overhead + memory + new_tokens * cost.flops_per_token / cost.flops


def roofline_step_time__no_kv_reads(new_tokens, cached_tokens, cost):
    """Forgets that attention reads the cached keys and values."""
    memory = cost.weight_bytes / cost.bandwidth
    return cost.overhead + max(memory, new_tokens * cost.flops_per_token / cost.flops)


def roofline_step_time__weights_per_token(new_tokens, cached_tokens, cost):
    """Reads the weights once per new token instead of once per step (no batching gain)."""
    memory = (new_tokens * cost.weight_bytes + cached_tokens * cost.kv_bytes_per_token) \
        / cost.bandwidth
    return cost.overhead + max(memory, new_tokens * cost.flops_per_token / cost.flops)


def roofline_step_time__no_overhead(new_tokens, cached_tokens, cost):
    """Leaves out the time spent outside the model."""
    memory = (cost.weight_bytes + cached_tokens * cost.kv_bytes_per_token) / cost.bandwidth
    return max(memory, new_tokens * cost.flops_per_token / cost.flops)


def preemption_victims__oldest_first(need, free, held):
    """Preempts the oldest of the later requests first (the requester still last): it throws
    away more computed work and breaks first come, first served."""
    victims = []
    for i in [*range(1, len(held)), 0]:
        if free >= need:
            break
        victims.append(i)
        free += held[i]
    return victims


def preemption_victims__requester_first(need, free, held):
    """Gives up at once: preempts the requester itself whenever the pool is short."""
    return [] if free >= need else [0]


def preemption_victims__ignores_free_blocks(need, free, held):
    """Frees ``need`` blocks by preemption alone, forgetting the ones already free."""
    victims, freed = [], 0
    for i in reversed(range(len(held))):
        if freed >= need:
            break
        victims.append(i)
        freed += held[i]
    return victims


def preemption_victims__one_too_many(need, free, held):
    """Stops only once the free blocks exceed the need: one victim too many on a tie."""
    victims = []
    for i in reversed(range(len(held))):
        if free > need:
            break
        victims.append(i)
        free += held[i]
    return victims


def preemption_victims__one_too_few(need, free, held):
    """Stops before the victim whose blocks would make enough: one victim too few, and the
    requester is still short."""
    victims = []
    for i in reversed(range(len(held))):
        if free >= need or free + held[i] >= need:
            break
        victims.append(i)
        free += held[i]
    return victims


def preemption_victims__biggest_first(need, free, held):
    """Preempts the biggest holders first (fewest victims), not the latest started."""
    victims = []
    for i in sorted(range(1, len(held)), key=lambda i: -held[i]) + [0]:
        if free >= need:
            break
        victims.append(i)
        free += held[i]
    return victims


def recompute_tokens__everything(computed, num_tokens, cached_blocks, block_size):
    """Forgets the prefix cache: every computed token is computed again."""
    return computed


def recompute_tokens__last_block_from_the_cache(computed, num_tokens, cached_blocks,
                                                block_size):
    """Takes the block holding the last token from the cache too."""
    return max(computed - block_size * cached_blocks, 0)


def recompute_tokens__negative(computed, num_tokens, cached_blocks, block_size):
    """Goes below zero when the cache holds more than the request had computed."""
    return computed - block_size * min(cached_blocks, (num_tokens - 1) // block_size)


def recompute_tokens__counts_new_work(computed, num_tokens, cached_blocks, block_size):
    """Counts every token after the cache hits, also those it had never computed."""
    return num_tokens - block_size * min(cached_blocks, (num_tokens - 1) // block_size)
