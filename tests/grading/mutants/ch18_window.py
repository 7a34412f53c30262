"""Plausible wrong answers to chapter 18's sliding-window lab; the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``."""

from minillm.engine.block_manager import RELEASED


def _release(manager, seq, behind, *, free_any=False, to_front=False, forward=False,
             forget_name=False, again=False):
    """Release the first ``behind`` entries of the table, each way of getting it wrong a
    switch."""
    order = range(min(behind, len(seq.block_table)))
    released = []
    for i in (order if forward else reversed(order)):
        block_id = seq.block_table[i]
        if block_id == RELEASED and not again:
            if forward:
                continue
            break
        block = manager.blocks[block_id]
        block.ref_count = 0 if free_any else block.ref_count - 1
        if block.ref_count == 0:
            manager.free_blocks[block_id] = None
            if to_front:
                manager.free_blocks.move_to_end(block_id, last=False)
            if forget_name:
                block.hash = block.parent_hash = None
                block.token_ids = ()
        seq.block_table[i] = RELEASED
        released.append(block_id)
    return released if forward else released[::-1]


def release_behind_window__keeps_the_first_visible_keys_block_one_step_late(manager, seq,
                                                                             window):
    """Counts the keys behind the window as num_computed - window (one too few)."""
    return _release(manager, seq, max(seq.num_computed - window, 0) // manager.block_size)


def release_behind_window__releases_the_partly_visible_block(manager, seq, window):
    """Rounds up: the block holding the first visible key goes too."""
    behind = -(-max(seq.num_computed - window + 1, 0) // manager.block_size)
    return _release(manager, seq, behind)


def release_behind_window__counts_the_uncomputed_token(manager, seq, window):
    """Measures the window from the newest token, computed or not."""
    return _release(manager, seq, max(seq.num_tokens - window + 1, 0) // manager.block_size)


def release_behind_window__frees_shared_blocks(manager, seq, window):
    """Puts a released block in the free list even while a fork still holds it."""
    behind = max(seq.num_computed - window + 1, 0) // manager.block_size
    return _release(manager, seq, behind, free_any=True)


def release_behind_window__reused_first(manager, seq, window):
    """Puts released blocks at the front of the free list: they are evicted first."""
    behind = max(seq.num_computed - window + 1, 0) // manager.block_size
    return _release(manager, seq, behind, to_front=True)


def release_behind_window__earliest_block_freed_first(manager, seq, window):
    """Frees in table order: a prompt's first block is the next to be evicted."""
    behind = max(seq.num_computed - window + 1, 0) // manager.block_size
    return _release(manager, seq, behind, forward=True)


def release_behind_window__forgets_the_prefix_cache_name(manager, seq, window):
    """Clears a freed block's name, so no other prompt can start from it."""
    behind = max(seq.num_computed - window + 1, 0) // manager.block_size
    return _release(manager, seq, behind, forget_name=True)


def release_behind_window__releases_again(manager, seq, window):
    """Does not skip entries released earlier (and so drops a stranger's block)."""
    behind = max(seq.num_computed - window + 1, 0) // manager.block_size
    return _release(manager, seq, behind, again=True)


def release_behind_window__keeps_the_table_entry(manager, seq, window):
    """Drops the holder but leaves the block's id in the table."""
    behind = max(seq.num_computed - window + 1, 0) // manager.block_size
    released = []
    for i in reversed(range(min(behind, len(seq.block_table)))):
        block_id = seq.block_table[i]
        if manager.blocks[block_id].ref_count == 0 or block_id in released:
            break
        manager.blocks[block_id].ref_count -= 1
        if manager.blocks[block_id].ref_count == 0:
            manager.free_blocks[block_id] = None
        released.append(block_id)
    return released[::-1]
