"""The engine's replaceable parts (the course's "your code in the engine"): a block manager
instance, the slot-mapping function, the decode attention, the scheduler's step policy
(its budget split and its preemption). With the chapter 12 and 13 solutions plugged in, the
engine still gives every request what ``generate`` gives it alone; a broken part shows (different
tokens, or a clear error). Also the engine's ``on_step`` observer (a
:class:`~minillm.engine.deltas.StepReport` per step, whose work adds up to what the
sequences computed), and what chapters 12 and 13 needed of the simulator: ``on_step``, and
a cost-model fit that survives CPU steps."""

from __future__ import annotations

import pytest
from engine_driving import sequence_of

from minillm.engine.block_manager import BlockManager
from minillm.engine.policies import StepDecision, plan_chunked_step, schedule_step
from minillm.engine.reserving import ReservingBlockManager
from minillm.grading import load_impl
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import tiny_pair

ch12 = load_impl("ch12_paged_kv_cache", "solutions")
lab12 = load_impl("ch12_paged_attention", "solutions")
ch13 = load_impl("ch13_batching", "solutions")
SYSTEM = list(range(100, 124))  # six full blocks of 4, shared by every prompt
PROMPTS = [SYSTEM + [5, 17, 99], SYSTEM + [1, 2], list(range(30, 60)), SYSTEM + [9] * 6]
PARAMS = SamplingParams(max_tokens=10)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_pair(tmp_path_factory.mktemp("tiny"))[0]


def alone(model) -> list[list[int]]:
    return [generate(model, prompt, PARAMS.max_tokens, PARAMS)[0] for prompt in PROMPTS]


class SolutionPrefixHashes(BlockManager):
    def prefix_hashes(self, tokens):
        return ch12.prefix_hashes(tokens, self.block_size)


def test_the_engine_uses_the_block_manager_it_is_given(tiny):
    manager = SolutionPrefixHashes(num_blocks=40, block_size=4)
    llm = LLM(tiny, block_manager=manager, scheduler=SchedulerConfig(max_batch=1))
    assert llm.blocks is manager and llm.core.runner.cache.keys[0].shape[:2] == (40, 4)
    requests = [llm.add_request(prompt, PARAMS) for prompt in PROMPTS]
    seqs = [sequence_of(llm, request) for request in requests]
    while llm.has_work:
        llm.step()
    assert [llm.output(request).tokens for request in requests] == alone(tiny)
    cached = [seq.cached_tokens for seq in seqs]
    assert cached == [0, 24, 0, 24]  # one at a time: the shared system prompt is hit
    assert manager.num_free == 40


def test_the_solution_slot_mapping_runs_the_engine(tiny):
    llm = LLM(tiny, block_size=4, num_blocks=64, slot_mapping=ch12.slot_mapping,
              scheduler=SchedulerConfig(max_batch=4, max_tokens_per_step=16))
    assert [o.tokens for o in llm.generate(PROMPTS, PARAMS, progress=False)] == alone(tiny)


def test_a_wrong_slot_mapping_changes_the_tokens(tiny):
    def contiguous(block_table, start, count, block_size):  # ignores the block table
        return list(range(start, start + count))

    llm = LLM(tiny, block_size=4, num_blocks=64, slot_mapping=contiguous,
              scheduler=SchedulerConfig(max_batch=4, max_tokens_per_step=16))
    assert [o.tokens for o in llm.generate(PROMPTS, PARAMS, progress=False)] != alone(tiny)


def test_the_solution_paged_attention_computes_every_step(tiny):
    calls = []

    def counted(q, key_pool, value_pool, block_tables, query_lens, context_lens):
        calls.append(list(zip(query_lens, context_lens, strict=True)))
        return lab12.paged_attention(q, key_pool, value_pool, block_tables, query_lens,
                                     context_lens)

    reports = []
    llm = LLM(tiny, block_size=4, num_blocks=64, decode_attention=counted,
              on_step=reports.append,
              scheduler=SchedulerConfig(max_batch=4, max_tokens_per_step=16))
    assert [o.tokens for o in llm.generate(PROMPTS, PARAMS, progress=False)] == alone(tiny)
    layers = tiny.config.num_layers
    assert len(calls) == layers * sum(1 for report in reports if report.work)  # one per layer
    decodes = sum(n == 1 for step in calls for n, _ in step) // layers
    assert decodes == len(PROMPTS) * (PARAMS.max_tokens - 1)  # the first token: a prefill
    assert any(1 < n < length for step in calls for n, length in step)  # a later prefill chunk
    assert llm.core.runner.executor_names == ["eager"]
    assert {report.executor for report in reports if report.work} == {"eager"}


def test_the_solution_paged_attention_verifies_speculative_guesses(tiny):
    seen = []

    def counted(q, key_pool, value_pool, block_tables, query_lens, context_lens):
        seen.extend(zip(query_lens, context_lens, strict=True))
        return lab12.paged_attention(q, key_pool, value_pool, block_tables, query_lens,
                                     context_lens)

    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 7]  # repeats: the n-gram drafter guesses
    params = SamplingParams(max_tokens=16)
    library, yours = ([o.tokens for o in LLM(tiny, block_size=4, num_blocks=64,
                                              prefix_caching=False, **seam, scheduler=(
                                                  SchedulerConfig(max_batch=2,
                                                                  speculative_tokens=3)))
                       .generate(prompts, params, progress=False)]
                      for seam in ({}, dict(decode_attention=counted)))
    assert yours == library
    assert any(1 < n < length for n, length in seen)  # a verification of guesses


def test_a_wrong_paged_attention_changes_the_tokens_and_fast_executors_are_refused(tiny):
    def oldest_token_only(q, key_pool, value_pool, block_tables, query_lens, context_lens):
        return lab12.paged_attention(q, key_pool, value_pool, block_tables, query_lens,
                                     list(query_lens))

    llm = LLM(tiny, block_size=4, num_blocks=64, decode_attention=oldest_token_only)
    assert [o.tokens for o in llm.generate(PROMPTS, PARAMS, progress=False)] != alone(tiny)
    with pytest.raises(ValueError, match="decode_attention= runs in eager steps"):
        LLM(tiny, decode_attention=lab12.paged_attention, executor="compiled")


def test_reserving_for_max_tokens_runs_fewer_requests_at_once_than_paging(tiny):
    """A pool of 40 blocks of 4. A 23-token prompt takes 6 blocks; reserving for
    max_tokens=40 takes 16 from the start: paging starts all four requests at once (and
    preempts as they grow), reserving two at a time. Both give plain decoding's tokens."""
    prompts = [list(range(10 + i, 33 + i)) for i in range(4)]
    params = SamplingParams(max_tokens=40)
    most_at_once = {}
    for name, manager in [("paged", BlockManager(40, 4, prefix_caching=False)),
                          ("reserving", ReservingBlockManager(40, 4))]:
        llm = LLM(tiny, block_manager=manager, scheduler=SchedulerConfig(max_batch=8))
        requests = [llm.add_request(prompt, params) for prompt in prompts]
        running = []
        while llm.has_work:
            llm.step()
            running.append(llm.core.num_running)
        most_at_once[name] = max(running)
        assert manager.num_free == 40  # every block given back
        assert [llm.output(r).tokens for r in requests] == [generate(tiny, p, 40, params)[0]
                                                            for p in prompts]
    assert most_at_once == {"paged": 4, "reserving": 2}


def test_the_solution_policy_runs_the_engine_and_is_the_one_used(tiny):
    calls = []

    def policy(state):
        calls.append(state)
        return ch13.schedule_step(state)

    llm = LLM(tiny, block_size=4, num_blocks=64,
              scheduler=SchedulerConfig(max_batch=3, max_tokens_per_step=8, step_policy=policy))
    assert [o.tokens for o in llm.generate(PROMPTS, PARAMS, progress=False)] == alone(tiny)
    assert calls and all(s.token_budget == 8 and s.max_batch == 3 for s in calls)


def test_a_policy_that_breaks_the_rules_is_refused_with_a_reason(tiny):
    def greedy(state):  # ignores the budget
        return StepDecision(tuple(r.uncomputed for r in state.running),
                            tuple(w.uncomputed for w in state.waiting))

    llm = LLM(tiny, block_size=4, num_blocks=64,
              scheduler=SchedulerConfig(max_tokens_per_step=8, step_policy=greedy))
    llm.add_request(PROMPTS[0], PARAMS)
    with pytest.raises(ValueError, match="budget of 8"):
        llm.step()


def test_a_policy_that_never_admits_a_prompt_is_refused_not_looped_on(tiny):
    """A policy that gives nothing while a prompt waits would have the engine step forever
    without progress (a mutant of exercise 13.1 once did, until pytest's timeout)."""
    def only_decodes(state):
        return StepDecision(tuple(int(r.uncomputed == 1) for r in state.running))

    llm = LLM(tiny, block_size=4, num_blocks=64,
              scheduler=SchedulerConfig(max_tokens_per_step=8, step_policy=only_decodes))
    llm.add_request(PROMPTS[0], PARAMS)
    with pytest.raises(ValueError, match="no progress"):
        llm.step()


@pytest.mark.parametrize("running, waiting, budget, seats, expected", [
    ([1, 1, 1], [20], 8, 4, [1, 1, 1, 5]),  # decodes, then a chunk of the waiting prompt
    ([30, 1, 1], [5], 8, 4, [6, 1, 1]),  # decodes before an older request's prompt chunk
    ([1, 1], [3, 3, 3], 64, 3, [1, 1, 3]),  # seats: three requests at most
    ([1, 1, 1], [4], 2, 8, [1, 1, 0]),  # the budget runs out before the last decode
    ([], [4, 9, 2], 10, 8, [4, 6]),  # the queue joins in order, the last with a chunk
    ([1, 1, 1], [5, 5], 10, 2, [1, 1, 1]),  # more running than seats (samples): none joins
])
def test_the_library_plan_follows_sarathi_order(running, waiting, budget, seats, expected):
    assert plan_chunked_step(running, waiting, budget, seats) == expected


def short_pool(tiny, policy=schedule_step, on_step=None, num_blocks=12) -> LLM:
    """An engine whose blocks of 4 cannot hold PROMPTS' caches at once (a prompt and its
    answer take up to 10): its requests preempt each other."""
    return LLM(tiny, block_size=4, num_blocks=num_blocks, on_step=on_step,
               scheduler=SchedulerConfig(max_batch=4, max_tokens_per_step=16, step_policy=policy))


def test_on_step_sees_every_step_once_it_is_done(tiny):
    seen, seqs = [], {}

    def on_step(report):  # called once the step is done: its sequences have advanced
        seen.append(report)
        for work in report.work:
            assert seqs[work.request_id].num_computed == work.start + work.tokens

    llm = short_pool(tiny, on_step=on_step)
    requests = [llm.add_request(prompt, PARAMS) for prompt in PROMPTS]
    seqs.update((request, sequence_of(llm, request)) for request in requests)
    steps = 0
    while llm.has_work:
        updates = llm.step()
        steps += 1
        assert len(seen) == steps  # one report per step, given during the step
        assert seen[-1].num_tokens == sum(work.tokens for work in seen[-1].work)
        worked = {(work.request_id, work.index) for work in seen[-1].work}
        assert {(u.request_id, u.index) for u in updates} <= worked
    assert any(report.preempted for report in seen)
    for report in seen:  # the model's time, and who computed it
        assert (report.seconds > 0) == (report.forward_seconds > 0) == bool(report.work)
        assert report.forward_seconds <= report.seconds
        assert bool(report.executor) == bool(report.work)
    assert [llm.output(r).tokens for r in requests] == alone(tiny)


def test_step_reports_add_up_to_every_token_computed(tiny):
    """Without preemption or prefix hits, every sample computes its prompt and its output
    but the last token (whose keys and values nobody needs), in steps that follow on: each
    starts where the sample's previous one ended, the first at 0 (a fork where its parent's
    prompt ended)."""
    reports = []
    llm = LLM(tiny, block_size=4, num_blocks=128, prefix_caching=False, on_step=reports.append,
              scheduler=SchedulerConfig(max_batch=6, max_tokens_per_step=8))
    params = [PARAMS, SamplingParams(temperature=1.0, seed=3, max_tokens=7, n=3),
              SamplingParams(max_tokens=1), PARAMS]
    outputs = llm.generate(PROMPTS, params, progress=False)
    assert not any(report.preempted for report in reports)
    assert all(report.num_tokens <= 8 for report in reports)
    computed = {}  # (request, sample) -> tokens computed so far
    for report in reports:
        for work in report.work:
            key = (work.request_id, work.index)
            fork_point = len(PROMPTS[work.request_id]) if work.index else 0
            assert work.tokens > 0
            assert work.start == computed.get(key, fork_point)
            computed[key] = work.start + work.tokens
    expected = {(out.request_id, s.index): len(out.prompt_tokens) + len(s.tokens) - 1
                for out in outputs for s in out.outputs}
    assert computed == expected
    prompts = sum(len(p) for p in PROMPTS)
    outputs_but_last = sum(len(s.tokens) - 1 for out in outputs for s in out.outputs)
    assert sum(report.num_tokens for report in reports) == prompts + outputs_but_last


def test_the_solution_preemption_policy_runs_the_engine_and_is_the_one_used(tiny):
    calls, preempted = [], []

    def policy(state):
        decision = ch13.schedule_step(state)
        calls.extend(decision.preempted)
        return decision

    llm = short_pool(tiny, policy, on_step=lambda step: preempted.extend(step.preempted))
    assert [o.tokens for o in llm.generate(PROMPTS, PARAMS, progress=False)] == alone(tiny)
    assert calls and preempted and llm.free_blocks() == 12
    assert [p.recompute for p in preempted] == [cost for _, cost in calls]


def biggest_first(state):
    """The library's split, but out of blocks it preempts the later requests holding the
    most blocks first (the requester last); nobody joins then."""
    counts = plan_chunked_step([r.uncomputed for r in state.running],
                               [w.uncomputed for w in state.waiting],
                               state.token_budget, state.max_batch)
    tokens, joins = counts[:len(state.running)], counts[len(state.running):]
    gone, used = [], 0
    for i, n in enumerate(tokens):
        while n and i not in gone and \
                state.blocks_needed(i, n, gone) > state.free_after(gone) - used:
            later = [j for j in range(i + 1, len(tokens)) if j not in gone]
            gone.append(max(later, key=lambda j: len(state.running[j].blocks)) if later else i)
        if n and i not in gone:
            used += state.blocks_needed(i, n, gone)
    if gone:
        return StepDecision(tuple(0 if i in gone else n for i, n in enumerate(tokens)), (),
                            tuple((i, 0) for i in gone))
    while sum(state.join_blocks(j, n) for j, n in enumerate(joins)) > \
            state.free_after() - used:
        joins.pop()
    return StepDecision(tuple(tokens), tuple(joins))


def test_another_preemption_policy_changes_the_victims_not_the_tokens(tiny):
    histories = {}
    for policy in (schedule_step, biggest_first):
        history = []
        llm = short_pool(tiny, policy, num_blocks=20, on_step=lambda report, h=history: h.append(
            [(p.request_id, p.index, p.computed) for p in report.preempted]))
        assert [o.tokens for o in llm.generate(PROMPTS, PARAMS, progress=False)] == alone(tiny)
        assert llm.free_blocks() == 20
        histories[policy] = history
    assert histories[schedule_step] != histories[biggest_first]


def _without_preemption(state):
    decision = schedule_step(state)
    return StepDecision(decision.tokens, decision.joins, ())


def _preempt_and_run(state):
    decision = schedule_step(state)
    return StepDecision(tuple(r.uncomputed if (i, c) in decision.preempted else n
                              for i, (r, n, c) in enumerate(zip(
                                  state.running, decision.tokens,
                                  [dict(decision.preempted).get(i) for i in
                                   range(len(state.running))], strict=True))),
                        decision.joins, decision.preempted)


def _preempt_and_join(state):
    decision = schedule_step(state)
    if decision.preempted and state.waiting:
        return StepDecision(decision.tokens, (1,), decision.preempted)
    return decision


@pytest.mark.parametrize("policy, reason", [
    (_without_preemption, "preempt more"),
    (_preempt_and_run, "scheduled for 0 tokens"),
    (_preempt_and_join, "nobody may join"),
])
def test_a_preemption_policy_that_breaks_the_rules_is_refused_with_a_reason(tiny, policy,
                                                                            reason):
    llm = short_pool(tiny, policy)
    with pytest.raises(ValueError, match=reason):
        llm.generate(PROMPTS, PARAMS, progress=False)


def test_the_simulator_shows_every_step_to_on_step():
    from minillm.engine.simulator import CostModel, simulate
    from minillm.experiments.workload import TraceRequest

    cost = CostModel(1e9, 1e5, 2e8, bandwidth=20e9, flops=200e9)
    trace = [TraceRequest(0.01 * i, [i] * 9, 4) for i in range(6)]  # nothing shared
    seen, seqs = [], {}

    def on_step(clock, step, scheduler):
        seen.append((clock, step.num_tokens, sum(len(s.block_table) for s in scheduler.running)))
        seqs.update((seq.id, seq) for seq, _ in step.work)

    served = simulate(trace, cost, SchedulerConfig(max_batch=3), num_blocks=64, block_size=4,
                      on_step=on_step)
    assert seen and [clock for clock, *_ in seen] == sorted(clock for clock, *_ in seen)
    assert len(seqs) == len(trace) and all(len(r.tokens) == 4 for r in served)
    assert sum(n for _, n, _ in seen) == sum(s.num_computed for s in seqs.values())
    assert seen[-1][2] == 0  # every block is back once the last request is done


def test_fitting_steps_shaped_like_this_cpus_gives_a_usable_model():
    """On a CPU a one-sequence decode takes a faster kernel than a batch, whatever the bytes
    read, and a prefill has a large fixed cost: the overhead cannot be told from the bytes.
    (The first fit, a regression of decode time on bytes, predicted 619 s for these 10.8 s
    of steps.) The fit must give positive numbers that reproduce the total time."""
    from minillm.engine.simulator import CostModel

    steps = [(1, 40 + i, 0.09) for i in range(30)] + [(4, 160 + i, 0.19) for i in range(30)]
    steps += [(n, 0, 0.17 + 0.006 * n) for n in (20, 37, 85, 150)]
    fitted = CostModel(5.4e8, 4.6e4, 2.7e8, bandwidth=1.0, flops=1.0).fit(steps)
    assert fitted.bandwidth > 1e9 and fitted.flops > 1e10 and fitted.overhead >= 0
    predicted = sum(fitted.step_time(n, c) for n, c, _ in steps)
    assert predicted == pytest.approx(sum(t for *_, t in steps), rel=0.05)
