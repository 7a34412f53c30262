"""Plausible wrong answers to chapter 13 (batching and scheduling); the graded tests must
catch each one. Each mutant replaces the solution function named before its ``__``."""

import math

from minillm.engine.policies import StepDecision


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


def _policy(state, *, prompts_first=False, victim=max, free_victims=True, budget_slack=0,
            chunk=True, join_after_preempt=False, cost=None):
    """The solution's policy with one knob turned; each mutant below turns one."""
    from solutions.ch13_batching import recompute_tokens
    running, budget = state.running, state.token_budget + budget_slack
    tokens = [0] * len(running)
    decodes = [i for i, r in enumerate(running) if r.uncomputed == 1]
    prompts = [i for i, r in enumerate(running) if r.uncomputed > 1]
    for i in (prompts + decodes if prompts_first else decodes + prompts):
        tokens[i] = min(running[i].uncomputed, budget)
        budget -= tokens[i]
    joins = []
    for waiting in state.waiting[:max(state.max_batch - len(running), 0)]:
        if budget == 0 or not chunk and waiting.uncomputed > budget:
            break
        joins.append(min(waiting.uncomputed, budget))
        budget -= joins[-1]
    gone, used = [], 0
    for i, n in enumerate(tokens):
        if n == 0 or i in gone:
            continue
        while i not in gone and state.blocks_needed(i, n, gone) > \
                state.free_after(gone if free_victims else ()) - used:
            later = [j for j in range(i + 1, len(running)) if j not in gone]
            gone.append(victim(later) if later else i)
        if i not in gone:
            used += state.blocks_needed(i, n, gone)
    for i in gone:
        tokens[i] = 0
    free = state.free_after(gone) - used
    admitted = []
    for j, n in enumerate(joins if not gone or join_after_preempt else []):
        if state.join_blocks(j, n) > free:
            break
        admitted.append(n)
        free -= state.join_blocks(j, n)
    cost = cost or (lambda r: recompute_tokens(r.computed, r.num_tokens, r.cached_blocks,
                                               state.block_size))
    return StepDecision(tuple(tokens), tuple(admitted),
                        tuple((i, cost(running[i])) for i in gone))


def schedule_step__prompts_before_decodes(state):
    """Serves started prompts before decodes: a long prompt's chunk eats the decodes'
    budget (no decodes-first rule)."""
    return _policy(state, prompts_first=True)


def schedule_step__preempts_the_oldest(state):
    """Preempts the oldest of the later requests first, not the latest started: it throws
    away more computed work and breaks first come, first served."""
    return _policy(state, victim=min)


def schedule_step__victims_blocks_stay_taken(state):
    """Forgets that a victim's blocks become free: keeps preempting until the blocks that
    were free at the start suffice."""
    return _policy(state, free_victims=False)


def schedule_step__budget_off_by_one(state):
    """Spends one token more than the budget (``<=`` where ``<`` was meant)."""
    return _policy(state, budget_slack=1)


def schedule_step__no_chunking(state):
    """Admits a waiting request only if its whole prompt fits (no chunked prefill)."""
    return _policy(state, chunk=False)


def schedule_step__joins_after_preempting(state):
    """Lets waiting requests join in a step that preempted: they jump ahead of the victims,
    which went back to the front of the queue."""
    return _policy(state, join_after_preempt=True)


def schedule_step__recomputes_everything(state):
    """Reports every computed token of a victim as recomputed, forgetting its cached
    blocks."""
    return _policy(state, cost=lambda r: r.computed)


def schedule_step__biggest_first(state):
    """Preempts the later request holding the most blocks first (fewest victims), not the
    latest started."""
    return _policy(state, victim=lambda later: max(
        later, key=lambda j: len(state.running[j].blocks)))
