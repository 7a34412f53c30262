"""The paged-cache block manager: examples of prefix caching and copy-on-write, and a
property-based test (hypothesis) of its accounting under any sequence of operations."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minillm.engine.block_manager import RELEASED, BlockManager, OutOfBlocks, chain_hash
from minillm.engine.sequence import Sequence


def compute(manager: BlockManager, seq: Sequence, n: int) -> list[tuple[int, int]]:
    """What one engine step does for ``seq``: reserve, (compute), count, commit."""
    copies = manager.reserve(seq, n)
    for block_id in manager.written_blocks(seq, n):
        assert manager.blocks[block_id].ref_count == 1, "a shared block would be written"
    seq.num_computed += n
    manager.commit(seq)
    return copies


def test_blocks_are_handed_out_as_a_sequence_grows():
    manager = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence(prompt=list(range(10)))
    assert manager.start(seq) == 0
    compute(manager, seq, 10)
    assert len(seq.block_table) == 3 and manager.num_free == 5
    seq.output.append(99)
    compute(manager, seq, 1)
    assert len(seq.block_table) == 3  # token 11 fits in the third block
    manager.free(seq)
    assert manager.num_free == 8 and seq.block_table == []


def test_a_shared_prompt_prefix_is_computed_once():
    manager = BlockManager(num_blocks=16, block_size=4)
    system = list(range(100, 112))  # three full blocks
    first = Sequence(prompt=system + [1, 2])
    manager.start(first)
    compute(manager, first, first.num_tokens)
    second = Sequence(prompt=system + [7])
    assert manager.start(second) == 12  # three cached blocks: only the last token to compute
    assert second.block_table == first.block_table[:3]
    assert all(manager.blocks[b].ref_count == 2 for b in second.block_table)


def test_a_full_hit_still_recomputes_the_last_prompt_token():
    manager = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(8))  # exactly two blocks
    first = Sequence(prompt=prompt)
    manager.start(first)
    compute(manager, first, 8)
    manager.free(first)
    again = Sequence(prompt=prompt)
    assert manager.start(again) == 4  # the block holding token 8 is recomputed
    assert again.num_uncomputed == 4


def test_a_hash_collision_is_not_a_hit(monkeypatch):
    manager = BlockManager(num_blocks=8, block_size=2)
    first = Sequence(prompt=[1, 2, 3])
    manager.start(first)
    compute(manager, first, 3)
    import minillm.engine.block_manager as module

    monkeypatch.setattr(module, "chain_hash", lambda parent, ids: chain_hash(None, (1, 2)))
    other = Sequence(prompt=[5, 6, 7])  # its first block "collides" with first's
    assert manager.start(other) == 0


def test_evicted_cache_blocks_are_the_least_recently_freed():
    manager = BlockManager(num_blocks=4, block_size=2)
    old, new = Sequence(prompt=[1, 2, 3]), Sequence(prompt=[4, 5, 6])
    for seq in (old, new):
        manager.start(seq)
        compute(manager, seq, 3)
        manager.free(seq)
    hungry = Sequence(prompt=[9, 9, 9, 9, 9])
    manager.start(hungry)
    compute(manager, hungry, 4)  # two blocks: old's (freed first) go first
    assert manager.start(Sequence(prompt=[4, 5, 6])) == 2
    assert manager.start(Sequence(prompt=[1, 2, 3])) == 0


def test_forked_sequences_copy_a_shared_block_before_writing():
    manager = BlockManager(num_blocks=8, block_size=4)
    parent = Sequence(prompt=[1, 2, 3, 4, 5, 6])
    manager.start(parent)
    compute(manager, parent, 6)
    child = Sequence(prompt=list(parent.prompt))
    manager.fork(parent, child)
    shared = parent.block_table[1]
    assert manager.blocks[shared].ref_count == 2
    child.output.append(42)
    copies = compute(manager, child, 1)
    assert copies == [(shared, child.block_table[1])] and child.block_table[1] != shared
    parent.output.append(43)
    assert compute(manager, parent, 1) == []  # now the only holder: writes in place


def test_running_out_of_blocks_is_an_error_not_a_corruption():
    manager = BlockManager(num_blocks=2, block_size=2)
    seq = Sequence(prompt=[1, 2, 3, 4, 5])
    manager.start(seq)
    assert not manager.can_reserve(seq, 5)
    with pytest.raises(OutOfBlocks):
        manager.reserve(seq, 5)
    assert manager.num_free == 2 and seq.block_table == []


def test_blocks_behind_a_window_are_released_and_stay_cached():
    """Blocks of 4, 13 tokens computed: the next query (position 13) sees positions 4..13
    with a window of 10 (block 0 goes), 9..13 with a window of 5 (block 1, 4..7, goes too;
    block 2, 8..11, stays)."""
    manager = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence(prompt=list(range(13)))
    manager.start(seq)
    compute(manager, seq, 13)
    first, second = seq.block_table[:2]
    assert manager.release_behind_window(seq, window=11) == []  # sees 3..13
    assert manager.release_behind_window(seq, window=10) == [first]
    assert manager.release_behind_window(seq, window=5) == [second]
    assert manager.release_behind_window(seq, window=5) == []  # nothing twice
    assert seq.block_table[:2] == [RELEASED, RELEASED] and manager.num_free == 6
    assert list(manager.free_blocks)[-2:] == [first, second]  # evicted last
    again = Sequence(prompt=list(range(13)))  # the released prefix is still a cache hit
    assert manager.start(again) == 12
    manager.free(seq)
    manager.free(again)
    assert manager.num_free == 8


def test_a_shared_block_behind_the_window_loses_one_holder():
    manager = BlockManager(num_blocks=8, block_size=4)
    parent, child = Sequence(prompt=list(range(9))), Sequence(prompt=list(range(9)))
    manager.start(parent)
    compute(manager, parent, 9)
    manager.fork(parent, child)
    shared = parent.block_table[0]
    assert manager.release_behind_window(parent, window=6) == [shared]  # sees 4..9
    assert manager.blocks[shared].ref_count == 1 and shared not in manager.free_blocks
    manager.fork(parent, grandchild := Sequence(prompt=list(range(9))))  # released: not taken
    assert grandchild.block_table[0] == RELEASED and manager.blocks[shared].ref_count == 1
    for seq in (parent, child, grandchild):
        manager.free(seq)
    assert manager.num_free == 8


def test_blocks_named_after_a_released_block_chain_from_its_tokens():
    """The block after the last released one is sealed with the same name as if nothing had
    been released."""
    manager = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence(prompt=list(range(11)))
    manager.start(seq)
    compute(manager, seq, 11)
    manager.release_behind_window(seq, window=2)  # sees 10, 11: blocks 0 and 1 go
    seq.output.append(99)
    compute(manager, seq, 1)
    expected = chain_hash(chain_hash(chain_hash(None, (0, 1, 2, 3)), (4, 5, 6, 7)),
                          (8, 9, 10, 99))
    assert manager.blocks[seq.block_table[2]].hash == expected


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate/append/fork/free/evict sequences; the accounting must always hold."""

    def __init__(self):
        super().__init__()
        self.manager = BlockManager(num_blocks=12, block_size=3)
        self.running: list[Sequence] = []

    @rule(prompt=st.lists(st.integers(0, 3), min_size=1, max_size=14))
    def add(self, prompt):
        seq = Sequence(prompt=prompt)
        self.manager.start(seq)
        if self.manager.can_reserve(seq, seq.num_uncomputed):
            compute(self.manager, seq, seq.num_uncomputed)
            self.running.append(seq)
        else:
            self.manager.free(seq)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100), token=st.integers(0, 3))
    def append(self, index, token):
        seq = self.running[index % len(self.running)]
        seq.output.append(token)
        if self.manager.can_reserve(seq, 1):
            compute(self.manager, seq, 1)
        else:  # preemption by recompute: give everything back
            self.manager.free(seq)
            self.running.remove(seq)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100))
    def fork(self, index):
        parent = self.running[index % len(self.running)]
        child = Sequence(prompt=list(parent.prompt), output=list(parent.output))
        self.manager.fork(parent, child)
        self.running.append(child)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100), window=st.integers(1, 7))
    def release(self, index, window):
        seq = self.running[index % len(self.running)]
        table = list(seq.block_table)
        released = self.manager.release_behind_window(seq, window)
        entries = [i for i, b in enumerate(table) if b != RELEASED and b in released]
        assert [table[i] for i in entries] == released  # in table order
        visible = max(seq.num_computed - window + 1, 0)  # the next query's first key
        assert all((i + 1) * 3 <= visible for i in entries)  # wholly out of its view
        assert all(seq.block_table[i] == RELEASED for i in entries)
        assert set(seq.block_table[:visible // 3]) <= {RELEASED}  # all of those went

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100))
    def free(self, index):
        self.manager.free(self.running.pop(index % len(self.running)))

    @invariant()
    def free_plus_used_is_the_pool(self):
        used = sum(1 for b in self.manager.blocks if b.ref_count > 0)
        assert used + self.manager.num_free == self.manager.num_blocks
        assert all(self.manager.blocks[i].ref_count == 0 for i in self.manager.free_blocks)

    @invariant()
    def ref_counts_are_the_number_of_holders(self):
        holders = Counter(b for seq in self.running for b in seq.block_table if b != RELEASED)
        assert all(block.ref_count == holders[block.id] for block in self.manager.blocks)

    @invariant()
    def held_blocks_are_named_by_their_whole_prefix(self):
        size = self.manager.block_size
        for seq in self.running:
            parent = None
            for i, block_id in enumerate(seq.block_table):
                if (i + 1) * size > seq.num_computed:
                    break
                parent = chain_hash(parent, tuple(seq.tokens[i * size:(i + 1) * size]))
                if block_id != RELEASED:
                    assert self.manager.blocks[block_id].hash == parent

    @invariant()
    def cached_blocks_hold_what_their_name_says(self):
        for block_hash, block_id in self.manager.cached.items():
            block = self.manager.blocks[block_id]
            assert block.hash == block_hash
            assert chain_hash(block.parent_hash, block.token_ids) == block_hash

    def teardown(self):
        for seq in self.running:
            self.manager.free(seq)
        assert self.manager.num_free == self.manager.num_blocks


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40,
                                            deadline=None, derandomize=True)
