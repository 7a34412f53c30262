"""The scheduler on its own, with a stand-in for the model: budgets, policies, chunked
prefill, preemption by recompute and block accounting. (Token-for-token equality with plain
generation is tested through the engine.)"""

from __future__ import annotations

import pytest

from minillm.serve.block_manager import BlockManager
from minillm.serve.scheduler import Scheduler, SchedulerConfig
from minillm.serve.sequence import Sequence


def run(scheduler: Scheduler, max_steps: int = 10_000):
    """Drive the scheduler to the end; the 'model' samples token = sequence length % 7."""
    steps = []
    while scheduler.has_work:
        step = scheduler.schedule()
        assert step.work or step.preempted, "a step with nothing to do"
        for seq, n in step.work:  # only the written blocks are private
            assert all(scheduler.blocks.blocks[b].ref_count == 1
                       for b in scheduler.blocks.written_blocks(seq, n))
        sampled = {seq.id: [seq.num_tokens % 7] for seq, n in step.work
                   if seq.num_computed + n == seq.num_tokens}
        scheduler.finish_step(step, sampled)
        steps.append(step)
        assert len(steps) < max_steps
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
    scheduler.finish_step(scheduler.schedule(), {short.id: [3]})
    long = Sequence(prompt=list(range(30)), max_tokens=2)
    scheduler.add(long)
    for _ in range(4):  # 30 prompt tokens at 7 per step, beside the decode
        step = scheduler.schedule()
        assert dict((s.id, n) for s, n in step.work)[short.id] == 1
        assert step.num_tokens <= 8
        scheduler.finish_step(step, {s.id: [3] for s, n in step.work
                                     if s.num_computed + n == s.num_tokens})
    assert long.num_computed == 28 and not long.output


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
