"""The scheduler on its own, with a stand-in for the model: budgets, policies, chunked
prefill, preemption by recompute, speculative guess slots and block accounting; what
:meth:`Scheduler.apply` hands out adds up to each sequence's output. (Token-for-token
equality with plain generation is tested through the engine.)"""

from __future__ import annotations

from collections import defaultdict

import pytest

from minillm.engine.block_manager import BlockManager
from minillm.engine.sampler import Sampled
from minillm.engine.scheduler import Scheduler, SchedulerConfig
from minillm.engine.sequence import Sequence


def sample_all(step) -> dict[int, Sampled]:
    """The stand-in model: every sequence whose tokens are all in gets token length % 7."""
    return {seq.id: Sampled([seq.num_tokens % 7]) for seq, n in step.work
            if seq.num_computed + n == seq.num_tokens}


def run(scheduler: Scheduler, max_steps: int = 10_000):
    """Drive the scheduler to the end; each sequence's deltas must add up to its output."""
    steps, delivered, ended = [], defaultdict(list), {}
    seqs = [*scheduler.waiting, *scheduler.running]
    while scheduler.has_work:
        step = scheduler.schedule()
        assert step.work or step.preempted, "a step with nothing to do"
        for seq, n in step.work:  # only the written blocks are private
            assert all(scheduler.blocks.blocks[b].ref_count == 1
                       for b in scheduler.blocks.written_blocks(seq, n))
        for delta in scheduler.apply(step, {}, sample_all(step)):
            assert delta.request_id not in ended  # nothing after a sequence's last delta
            delivered[delta.request_id] += delta.token_ids
            if delta.finished:
                ended[delta.request_id] = delta.finish_reason
        steps.append(step)
        assert len(steps) < max_steps
    for seq in seqs:
        assert delivered[seq.request_id] == seq.output
        assert ended[seq.request_id] == seq.finish_reason.value
    return steps


def requests(lengths, max_tokens=5):
    return [Sequence(prompt=list(range(1, n + 1)), max_tokens=max_tokens) for n in lengths]


@pytest.mark.parametrize("policy", ["static", "dynamic", "continuous"])
@pytest.mark.parametrize("chunked", [True, False])
def test_every_request_finishes_and_every_block_comes_back(policy, chunked):
    blocks = BlockManager(num_blocks=64, block_size=4)
    config = SchedulerConfig(policy=policy, max_batch=3, max_tokens_per_step=16,
                             chunked_prefill=chunked, max_wait=0)
    scheduler = Scheduler(config, blocks)
    seqs = requests([3, 9, 20, 4, 1, 12], max_tokens=4)
    for seq in seqs:
        scheduler.add(seq)
    steps = run(scheduler)
    assert all(seq.finished and len(seq.output) == 4 for seq in seqs)
    assert all(seq.num_computed == seq.num_tokens - 1 for seq in seqs)  # last token unfed
    assert blocks.num_free == blocks.num_blocks
    if chunked:
        assert all(step.num_tokens <= 16 for step in steps)


def test_continuous_batching_takes_fewer_steps_than_static():
    def steps_for(policy):
        scheduler = Scheduler(SchedulerConfig(policy=policy, max_batch=2),
                              BlockManager(64, 4))
        seqs = [Sequence(prompt=[1, 2], max_tokens=m) for m in (1, 20, 1, 20)]
        for seq in seqs:
            scheduler.add(seq)
        return len(run(scheduler))
    assert steps_for("continuous") < steps_for("static")


def test_dynamic_batching_waits_for_a_full_batch_or_the_deadline():
    scheduler = Scheduler(SchedulerConfig(policy="dynamic", max_batch=2, max_wait=5.0),
                          BlockManager(64, 4))
    first = Sequence(prompt=[1, 2], arrival_time=0.0)
    scheduler.add(first)
    assert not scheduler.schedule(now=1.0).work  # alone, before its deadline
    assert scheduler.schedule(now=5.0).work == [(first, 2)]


def test_chunked_prefill_splits_a_long_prompt_and_keeps_decodes_running():
    scheduler = Scheduler(SchedulerConfig(max_batch=4, max_tokens_per_step=8),
                          BlockManager(64, 4))
    short = Sequence(prompt=[1, 2], max_tokens=10)
    scheduler.add(short)
    scheduler.apply(scheduler.schedule(), {}, {short.id: Sampled([3])})
    long = Sequence(prompt=list(range(30)), max_tokens=2)
    scheduler.add(long)
    for _ in range(4):  # 30 prompt tokens at 7 per step, beside the decode
        step = scheduler.schedule()
        assert dict((s.id, n) for s, n in step.work)[short.id] == 1
        assert step.num_tokens <= 8
        scheduler.apply(step, {}, {s.id: Sampled([3]) for s, n in step.work
                                   if s.num_computed + n == s.num_tokens})
    assert long.num_computed == 28 and not long.output



def test_a_prompts_full_blocks_are_shared_as_soon_as_a_chunk_computes_them():
    blocks = BlockManager(64, 4)
    scheduler = Scheduler(SchedulerConfig(max_tokens_per_step=8), blocks)
    system = list(range(100, 120))
    first = Sequence(prompt=system + [1, 2])
    scheduler.add(first)
    scheduler.apply(scheduler.schedule(), {}, {})  # its first 8 tokens: two full blocks
    assert first.num_computed == 8 and not first.output
    second = Sequence(prompt=system + [3])
    assert [b.id for b in blocks.cached_prefix_blocks(second)] == first.block_table[:2]
def test_a_short_pool_preempts_by_recompute_and_everything_still_finishes():
    blocks = BlockManager(num_blocks=7, block_size=2)  # too small for 3 growing sequences
    scheduler = Scheduler(SchedulerConfig(max_batch=3, max_tokens_per_step=64), blocks)
    seqs = requests([3, 3, 3], max_tokens=6)
    for seq in seqs:
        scheduler.add(seq)
    steps = run(scheduler)
    assert any(step.preempted for step in steps)
    assert all(len(seq.output) == 6 for seq in seqs)
    assert blocks.num_free == blocks.num_blocks


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError, match="policy"):
        SchedulerConfig(policy="fastest")
    with pytest.raises(ValueError, match="at least 1"):
        SchedulerConfig(max_batch=0)


class Guessing:
    """A stand-in proposer that can always make ``gamma`` guesses."""

    def guess_count(self, seq, gamma):
        return gamma

    def propose(self, step):
        raise AssertionError("the scheduler never proposes")

    def forget(self, seq):
        pass


def decoding(scheduler: Scheduler, prompts: list[list[int]], max_tokens: int = 10):
    """Start ``prompts`` and run one step: each has sampled its first token (a decode next)."""
    seqs = [Sequence(prompt=prompt, max_tokens=max_tokens) for prompt in prompts]
    for seq in seqs:
        scheduler.add(seq)
    step = scheduler.schedule()
    assert not step.guesses  # prefills get no guesses
    scheduler.apply(step, {}, sample_all(step))
    return seqs


def test_guesses_take_only_what_the_planned_work_leaves_of_the_budget():
    scheduler = Scheduler(SchedulerConfig(max_batch=4, max_tokens_per_step=8,
                                          speculative_tokens=3), BlockManager(64, 4),
                          Guessing())
    first, second, third = decoding(scheduler, [[1, 2], [3, 4], [5, 6]])
    step = scheduler.schedule()  # three decodes (3 tokens), then 5 spare: 3 + 2 guesses
    assert [(s, n) for s, n in step.work] == [(first, 1), (second, 1), (third, 1)]
    assert step.guesses == {first.id: 3, second.id: 2}
    assert step.num_tokens == 8 and not step.preempted
    for seq, n in step.work:  # the blocks for every guess were reserved
        assert len(seq.block_table) * 4 >= seq.num_computed + n + step.guesses.get(seq.id, 0)


def test_guesses_never_preempt_and_shrink_to_the_free_blocks():
    blocks = BlockManager(num_blocks=5, block_size=2)
    scheduler = Scheduler(SchedulerConfig(max_batch=2, max_tokens_per_step=64,
                                          speculative_tokens=4), blocks, Guessing())
    first, second = decoding(scheduler, [[1, 2], [3, 4]])  # a full block each, 3 free
    step = scheduler.schedule()
    # the decodes' tokens take a new block each; first's 3 guesses fill its second block
    # and take the last free one; second's guess fits its second block: nobody preempted
    assert step.work == [(first, 1), (second, 1)] and not step.preempted
    assert step.guesses == {first.id: 3, second.id: 1} and blocks.num_free == 0
    assert [len(first.block_table), len(second.block_table)] == [3, 2]


def test_guesses_stop_short_of_max_tokens():
    scheduler = Scheduler(SchedulerConfig(max_batch=2, speculative_tokens=5),
                          BlockManager(64, 4), Guessing())
    seq, = decoding(scheduler, [[1, 2, 3]], max_tokens=3)  # 1 token out, 2 to go
    step = scheduler.schedule()
    assert step.guesses == {seq.id: 1}  # the decode's token and one guess make max_tokens
