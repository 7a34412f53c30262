"""Graded tests for chapter 18's sliding-window lab (18.6): the block release.

Oracle: the library's :meth:`BlockManager.release_behind_window`. Twin block managers (one
calling yours, one the library's) go through the same random life of requests (prompts
sharing prefixes, steps of several tokens, forks, finishes, releases with windows of every
size) drawn by Hypothesis, and must agree after every release: the blocks returned, the
tables, the reference counts, the free list in order, the prefix cache. Then the engine: a
sliding-window model runs past the end of its pool with your release in the scheduler.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.config import ModelConfig
from minillm.engine.block_manager import RELEASED, BlockManager, chain_hash
from minillm.engine.sequence import Sequence
from minillm.grading import load_impl
from minillm.reference import generate
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import TINY, varied_random_model

impl = load_impl("ch18_window")
HIDDEN = settings(max_examples=60, deadline=None, derandomize=True, database=None)


class YourRelease(BlockManager):
    """The library's block manager, releasing with your function."""

    def release_behind_window(self, seq, window):
        return impl.release_behind_window(self, seq, window)


def state(manager: BlockManager, sequences) -> tuple:
    blocks = tuple((b.ref_count, b.hash, b.parent_hash, b.token_ids) for b in manager.blocks)
    return (blocks, list(manager.free_blocks), dict(manager.cached),
            [list(seq.block_table) for seq in sequences])


def computed(manager: BlockManager, seq: Sequence, n: int) -> None:
    """One engine step for ``seq``: reserve, (compute), count, name full blocks."""
    manager.reserve(seq, n)
    seq.num_computed += n
    manager.commit(seq)


def started(manager: BlockManager, prompt: list[int]) -> Sequence:
    seq = Sequence(prompt=list(prompt))
    manager.start(seq)
    return seq


def twin_lives(ops, block_size: int) -> None:
    """Replay ``ops`` on the library's manager and on yours; compare after each release."""
    mine, theirs = YourRelease(40, block_size), BlockManager(40, block_size)
    lives = {id(mine): [], id(theirs): []}
    for op, a, b in ops:
        for manager in (theirs, mine):
            running = lives[id(manager)]
            if op == "start":
                seq = started(manager, [a % 3] * 5 + list(range(b % 9)))  # shared prefixes
                if manager.can_reserve(seq, seq.num_uncomputed):
                    computed(manager, seq, seq.num_uncomputed)
                    running.append(seq)
                else:
                    manager.free(seq)
            elif not running:
                continue
            elif op == "grow":
                seq = running[a % len(running)]
                seq.output += [b % 4] * (1 + b % 3)
                if manager.can_reserve(seq, seq.num_uncomputed):
                    computed(manager, seq, seq.num_uncomputed)
                else:
                    seq.output = seq.output[:seq.num_computed - seq.num_prompt_tokens]
            elif op == "fork":
                parent = running[a % len(running)]
                child = Sequence(prompt=list(parent.prompt), output=list(parent.output))
                manager.fork(parent, child)
                running.append(child)
            elif op == "finish":
                manager.free(running.pop(a % len(running)))
            elif op == "release":
                seq = running[a % len(running)]
                expected = BlockManager.release_behind_window(manager, seq, 1 + b % 9) \
                    if manager is theirs else None
                got = manager.release_behind_window(seq, 1 + b % 9)
                if manager is theirs:
                    lives["expected"] = expected
                else:
                    assert got == lives["expected"], "the blocks released differ"
        if lives[id(mine)] or lives[id(theirs)]:
            assert state(mine, lives[id(mine)]) == state(theirs, lives[id(theirs)])


OPS = st.lists(st.tuples(st.sampled_from(["start", "grow", "fork", "finish", "release",
                                          "release"]),
                         st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=30)


@pytest.mark.exercise("18.6", points=3)
@HIDDEN
@given(ops=OPS, block_size=st.sampled_from([1, 2, 3, 4]))
def test_twin_block_managers_agree_through_random_lives(ops, block_size):
    twin_lives(ops, block_size)


@pytest.mark.exercise("18.6", points=1)
@pytest.mark.parametrize("window, released", [(14, 0), (11, 0), (10, 1), (7, 1), (6, 2),
                                              (3, 2), (2, 3), (1, 3)])
def test_the_boundary_is_the_next_querys_first_visible_key(window, released):
    """Blocks of 4, 13 tokens computed: the next query (position 13) sees 13 - window + 1
    .. 13. Block 0 (0..3) goes once 4 is the first visible key, block 1 once 8 is, block 2
    (8..11) once 12 is."""
    manager = BlockManager(8, 4)
    seq = started(manager, list(range(13)))
    computed(manager, seq, 13)
    table = list(seq.block_table)
    assert impl.release_behind_window(manager, seq, window) == table[:released]
    assert seq.block_table == [RELEASED] * released + table[released:]
    assert manager.num_free == 4 + released
    assert impl.release_behind_window(manager, seq, window) == []  # nothing twice


@pytest.mark.exercise("18.6", points=1)
def test_only_computed_tokens_count():
    """The newest sampled token (not computed yet) moves nothing."""
    manager = BlockManager(8, 4)
    seq = started(manager, list(range(8)))
    computed(manager, seq, 8)
    seq.output.append(3)  # token 8, whose keys the next step computes
    assert impl.release_behind_window(manager, seq, 6) == []  # next query 8 sees 3..8


@pytest.mark.exercise("18.6", points=1)
def test_a_forked_block_loses_one_holder_and_stays_out_of_the_free_list():
    manager = BlockManager(8, 4)
    parent = started(manager, list(range(9)))
    computed(manager, parent, 9)
    child = Sequence(prompt=list(range(9)))
    manager.fork(parent, child)
    shared = parent.block_table[0]
    assert impl.release_behind_window(manager, parent, 5) == [shared]
    assert manager.blocks[shared].ref_count == 1 and shared not in manager.free_blocks
    assert impl.release_behind_window(manager, child, 5) == [shared]
    assert manager.blocks[shared].ref_count == 0 and list(manager.free_blocks)[-1] == shared


@pytest.mark.exercise("18.6", points=1)
def test_released_blocks_keep_their_names_and_are_reused_last_the_first_block_last():
    manager = BlockManager(6, 4)
    seq = started(manager, list(range(10)))
    computed(manager, seq, 10)
    first, second = seq.block_table[:2]
    names = [manager.blocks[b].hash for b in (first, second)]
    impl.release_behind_window(manager, seq, 3)  # sees 8..10: blocks 0 and 1 go
    assert list(manager.free_blocks)[-2:] == [second, first]
    assert [manager.blocks[b].hash for b in (first, second)] == names
    assert names[0] == chain_hash(None, (0, 1, 2, 3))
    again = started(manager, list(range(10)))  # another prompt starts from them
    assert again.num_computed == 8 and again.block_table == [first, second]


@pytest.mark.exercise("18.6", points=2)
def test_your_release_runs_a_windowed_model_past_the_end_of_its_pool():
    """A tiny model whose layers see the last 8 tokens: two 100-token requests run
    together in 10 blocks of 4 (each alone needs 25), with prefill chunks and preemption,
    and give the dense loop's tokens; the pool is whole afterwards."""
    model = varied_random_model(ModelConfig(**{**TINY, "sliding_window": 8}))
    params = SamplingParams(max_tokens=70)
    prompts = [list(range(5, 35)), list(range(40, 70))]
    blocks = YourRelease(num_blocks=10, block_size=4)
    llm = LLM(model, block_manager=blocks, executor="eager",
              scheduler=SchedulerConfig(max_batch=2, max_tokens_per_step=8))
    outputs = llm.generate(prompts, params, progress=False)
    assert [o.tokens for o in outputs] == [generate(model, p, 70, params)[0] for p in prompts]
    assert blocks.num_free == 10
