"""Graded tests for chapter 12 (the paged KV cache).

Oracles: the library's BlockManager (its ref counts, free list, copy-on-write copies and
prefix hashes), its slot mapping, and plain ``generate`` for the engine runs on a tiny
random model. The lab (12.5) is graded in ``test_ch12_paged_attention.py``.
"""

from __future__ import annotations

import random

import pytest
from ch12_engine_case import CONFIG, PARAMS, PROMPTS

from minillm.attention.paged import slot_mapping as library_slot_mapping
from minillm.engine.block_manager import BlockManager, OutOfBlocks
from minillm.engine.sequence import Sequence
from minillm.grading import load_impl
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import varied_random_model

impl = load_impl("ch12_paged_kv_cache")


def pool_state(pool):
    return list(pool.ref_counts), list(pool.free)


def library_state(manager: BlockManager):
    return [block.ref_count for block in manager.blocks], list(manager.free_blocks)


# -- 12.1 reference counts --------------------------------------------------------------

@pytest.mark.exercise("12.1", points=1)
def test_allocate_hands_out_the_least_recently_freed_block():
    pool = impl.BlockPool.with_blocks(4)
    assert [impl.allocate(pool) for _ in range(2)] == [0, 1]
    assert pool_state(pool) == ([1, 1, 0, 0], [2, 3])
    impl.release(pool, 0)
    assert pool_state(pool) == ([0, 1, 0, 0], [2, 3, 0])  # freed blocks join the end
    assert [impl.allocate(pool) for _ in range(3)] == [2, 3, 0]


@pytest.mark.exercise("12.1", points=1)
def test_an_empty_pool_raises_out_of_blocks_and_changes_nothing():
    pool = impl.BlockPool.with_blocks(2)
    impl.allocate(pool), impl.allocate(pool)
    with pytest.raises(OutOfBlocks):
        impl.allocate(pool)
    assert pool_state(pool) == ([1, 1], [])


@pytest.mark.exercise("12.1", points=1)
def test_a_shared_block_is_free_only_when_its_last_holder_lets_go():
    pool = impl.BlockPool.with_blocks(3)
    block = impl.allocate(pool)
    impl.share(pool, block)
    impl.share(pool, block)
    assert pool.ref_counts[block] == 3
    impl.release(pool, block)
    impl.release(pool, block)
    assert pool.ref_counts[block] == 1 and block not in pool.free
    impl.release(pool, block)
    assert pool_state(pool) == ([0, 0, 0], [1, 2, 0])


@pytest.mark.exercise("12.1", points=1)
def test_a_cached_block_taken_from_the_free_list_is_not_handed_out_again():
    pool = impl.BlockPool.with_blocks(3)
    cached = impl.allocate(pool)
    impl.release(pool, cached)  # free, but its keys and values may be a cached prefix
    impl.share(pool, cached)  # a prefix-cache hit
    assert pool_state(pool) == ([1, 0, 0], [1, 2])
    assert sorted(impl.allocate(pool) for _ in range(2)) == [1, 2]
    with pytest.raises(OutOfBlocks):
        impl.allocate(pool)


@pytest.mark.exercise("12.1", points=1)
def test_releasing_a_free_block_is_an_error():
    pool = impl.BlockPool.with_blocks(2)
    with pytest.raises(ValueError):
        impl.release(pool, 1)
    assert pool_state(pool) == ([0, 0], [0, 1])


@pytest.mark.exercise("12.1", points=3)
def test_the_pool_follows_the_library_block_manager_through_prefix_hits():
    """Requests with shared prefixes start, grow and finish in the library's BlockManager;
    the same operations on your pool must give the same blocks, counts and free list."""
    rng = random.Random(0)
    manager = BlockManager(num_blocks=24, block_size=2)
    pool = impl.BlockPool.with_blocks(24)
    prefixes = [[1, 2, 3, 4], [1, 2, 5, 6], [7, 8]]
    live = []
    for _ in range(60):
        if live and (rng.random() < 0.4 or manager.num_free < 6):
            seq = live.pop(rng.randrange(len(live)))
            for block in reversed(seq.block_table):  # the library frees the last block first
                impl.release(pool, block)
            manager.free(seq)
        else:
            prompt = rng.choice(prefixes) + [rng.randrange(9, 12) for _ in range(rng.randrange(4))]
            seq = Sequence(prompt=prompt)
            manager.start(seq)
            for block in seq.block_table:  # prefix-cache hits
                impl.share(pool, block)
            hits = len(seq.block_table)
            manager.reserve(seq, seq.num_uncomputed)
            assert [impl.allocate(pool) for _ in seq.block_table[hits:]] == seq.block_table[hits:]
            seq.num_computed = seq.num_tokens
            manager.commit(seq)
            live.append(seq)
        assert pool_state(pool) == library_state(manager)


# -- 12.2 copy-on-write -----------------------------------------------------------------

@pytest.mark.exercise("12.2", points=1)
def test_a_block_held_once_is_written_in_place():
    pool = impl.BlockPool.with_blocks(4)
    table = [impl.allocate(pool), impl.allocate(pool)]
    assert impl.copy_on_write(pool, table, 1) is None
    assert table == [0, 1] and pool_state(pool) == ([1, 1, 0, 0], [2, 3])


@pytest.mark.exercise("12.2", points=2)
def test_forked_samples_copy_the_shared_block_like_the_library():
    """Three samples of one prompt (n = 3): each writes its next token into the shared last
    block. The first two get private copies; the last holder writes in place."""
    manager = BlockManager(num_blocks=8, block_size=4, prefix_caching=False)
    parent = Sequence(prompt=[1, 2, 3, 4, 5, 6])
    manager.start(parent)
    manager.reserve(parent, 6)
    parent.num_computed = 6
    children = [Sequence(prompt=list(parent.prompt)) for _ in range(2)]
    for child in children:
        manager.fork(parent, child)
    pool = impl.BlockPool.with_blocks(8)
    tables = [[impl.allocate(pool), impl.allocate(pool)]]
    for _ in children:
        for block in tables[0]:
            impl.share(pool, block)
        tables.append(list(tables[0]))
    for seq, table in zip([*children, parent], [tables[1], tables[2], tables[0]], strict=True):
        seq.output.append(42)
        expected = manager.reserve(seq, 1)
        got = impl.copy_on_write(pool, table, 1)
        assert (got is None and expected == []) or [got] == expected
        assert table == seq.block_table
        assert pool_state(pool) == library_state(manager)


@pytest.mark.exercise("12.2", points=1)
def test_copy_on_write_with_an_empty_pool_raises_and_changes_nothing():
    pool = impl.BlockPool.with_blocks(1)
    table = [impl.allocate(pool)]
    impl.share(pool, table[0])
    with pytest.raises(OutOfBlocks):
        impl.copy_on_write(pool, table, 0)
    assert table == [0] and pool_state(pool) == ([2], [])


# -- 12.3 the prefix hash chain ---------------------------------------------------------

@pytest.mark.exercise("12.3", points=2)
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_prefix_hashes_match_the_library(block_size):
    manager = BlockManager(num_blocks=4, block_size=block_size)
    tokens = [(7 * i + 3) % 50 for i in range(70)]
    for n in range(1, 70):
        assert impl.prefix_hashes(tokens[:n], block_size) == manager.prefix_hashes(tokens[:n])


@pytest.mark.exercise("12.3", points=1)
def test_the_block_holding_the_last_token_is_never_named():
    assert len(impl.prefix_hashes(list(range(8)), 4)) == 1  # 8 tokens: block 1 holds the last
    assert len(impl.prefix_hashes(list(range(9)), 4)) == 2
    assert impl.prefix_hashes([5, 6, 7], 4) == [] and impl.prefix_hashes([5], 1) == []


@pytest.mark.exercise("12.3", points=1)
def test_a_name_depends_on_the_whole_prefix():
    first = impl.prefix_hashes([1, 2, 3, 4, 9, 9, 9, 9, 0], 4)
    second = impl.prefix_hashes([5, 6, 7, 8, 9, 9, 9, 9, 0], 4)
    again = impl.prefix_hashes([1, 2, 3, 4, 9, 9, 9, 9, 1, 2], 4)
    assert first[1] != second[1]  # the same four tokens after a different prefix
    assert again == first


# -- 12.4 the slot mapping --------------------------------------------------------------

@pytest.mark.exercise("12.4", points=1)
def test_slot_mapping_example():
    assert impl.slot_mapping([7, 2, 5], 3, 6, 4) == [31, 8, 9, 10, 11, 20]


@pytest.mark.exercise("12.4", points=2)
def test_slot_mapping_matches_the_library():
    rng = random.Random(1)
    for _ in range(200):
        block_size = rng.choice([1, 2, 4, 16])
        table = rng.sample(range(64), 6)
        start = rng.randrange(6 * block_size)
        count = rng.randrange(0, 6 * block_size - start + 1)
        assert impl.slot_mapping(table, start, count, block_size) == \
            library_slot_mapping(table, start, count, block_size)


# -- the engine with your parts ---------------------------------------------------------



@pytest.fixture(scope="module")
def model():
    return varied_random_model(CONFIG)


class YourPrefixHashes(BlockManager):
    """The library's block manager, naming blocks with your hash chain."""

    def prefix_hashes(self, tokens):
        return impl.prefix_hashes(tokens, self.block_size)


@pytest.mark.exercise("12.3", points=2)
def test_your_prefix_hashes_find_the_shared_prompt_in_the_engine(model):
    llm = LLM(model, block_manager=YourPrefixHashes(num_blocks=48, block_size=4),
              scheduler=SchedulerConfig(max_batch=1))
    ids = [llm.add_request(p, PARAMS) for p in PROMPTS]
    sequences = [llm.core.requests[i] for i in ids]  # the core forgets a finished request
    while llm.has_work:
        llm.step()
    assert [llm.output(i).tokens for i in ids] == [generate(model, p, 8, PARAMS)[0]
                                                   for p in PROMPTS]
    assert [seq.cached_tokens for seq in sequences] == [0, 24, 0, 24]


@pytest.mark.exercise("12.4", points=2)
def test_your_slot_mapping_runs_the_engine(model):
    """Four requests at once, prefill in chunks: block tables interleave in the pool."""
    llm = LLM(model, block_size=4, num_blocks=48, slot_mapping=impl.slot_mapping,
              scheduler=SchedulerConfig(max_batch=4, max_tokens_per_step=12))
    outputs = llm.generate(PROMPTS, PARAMS, progress=False)
    assert [o.tokens for o in outputs] == [generate(model, p, 8, PARAMS)[0] for p in PROMPTS]
