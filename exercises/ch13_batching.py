# Generated from solutions/ch13_batching.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
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
    raise NotImplementedError("Exercise 13.1: The scheduling policy: what one engine step runs, and who makes room")


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
    raise NotImplementedError("Exercise 13.1: The scheduling policy: what one preemption costs in recomputed tokens")


# -- warm-ups ------------------------------------------------------------------------------


def request_latencies(arrival: float, token_times: list[float]) -> dict:
    """Exercise 13.2: (warm-up) One request's latencies from its arrival and its tokens' times.

    vLLM's definitions, for tokens that came at t_1 .. t_n. Returns a dict with ``ttft``
    (time to first token: t_1 - arrival), ``e2e`` (t_n - arrival), ``tpot`` (time per
    output token after the first: (e2e - ttft) / (n - 1), None for a single token) and
    ``itl`` (the list of inter-token gaps t_{i+1} - t_i, empty for a single token).
    """
    raise NotImplementedError("Exercise 13.2: (warm-up) One request's latencies from its arrival and its tokens' times")


def static_batching_steps(output_lengths: list[int], max_batch: int) -> int:
    """Exercise 13.3: (warm-up) How many steps static batching takes to produce these outputs.

    Requests are taken in order, ``max_batch`` at a time; a batch's first step computes
    the prompts and samples every request's first token, then one step per further token,
    until its LONGEST request is done (finished requests keep their seats). The next batch
    starts after that. Returns the total number of steps (every request has length >= 1).
    """
    raise NotImplementedError("Exercise 13.3: (warm-up) How many steps static batching takes to produce these outputs")


def roofline_step_time(new_tokens: int, cached_tokens: int, cost: CostModel) -> float:
    """Exercise 13.4: (warm-up) One step's time on the roofline: the slower of memory and compute.

    A step reads every weight once (``cost.weight_bytes``) and the keys and values of the
    ``cached_tokens`` its sequences attend to (``cost.kv_bytes_per_token`` each) at
    ``cost.bandwidth`` bytes/s, and does ``cost.flops_per_token`` FLOPs for each of its
    ``new_tokens`` at ``cost.flops`` FLOP/s. Memory and compute overlap, so the step takes
    the longer of the two, plus ``cost.overhead`` seconds outside the model.
    """
    raise NotImplementedError("Exercise 13.4: (warm-up) One step's time on the roofline: the slower of memory and compute")
