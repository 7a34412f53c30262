"""Plausible wrong answers to chapter 12 (the paged KV cache); the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``."""

from minillm.engine.block_manager import OutOfBlocks, chain_hash


def _solution():
    import solutions.ch12_paged_kv_cache as solution

    return solution


def allocate__most_recently_freed(pool):
    """Takes the block freed last (a stack), evicting the freshest cached prefix first."""
    if not pool.free:
        raise OutOfBlocks("no free block left in the pool")
    block = next(reversed(pool.free))
    del pool.free[block]
    pool.ref_counts[block] = 1
    return block


def allocate__left_on_the_free_list(pool):
    """Counts the block as held but leaves it on the free list: it is handed out again."""
    if not pool.free:
        raise OutOfBlocks("no free block left in the pool")
    block = next(iter(pool.free))
    pool.ref_counts[block] = 1
    return block


def allocate__no_empty_check(pool):
    """Forgets the empty pool: next() raises StopIteration instead of OutOfBlocks."""
    block = next(iter(pool.free))
    del pool.free[block]
    pool.ref_counts[block] = 1
    return block


def share__free_list_untouched(pool, block):
    """Counts the new holder but leaves a cached block on the free list."""
    pool.ref_counts[block] += 1


def share__always_takes_off_the_free_list(pool, block):
    """Removes the block from the free list even when it was already held (KeyError)."""
    del pool.free[block]
    pool.ref_counts[block] += 1


def release__to_the_front(pool, block):
    """Puts a freed block at the front of the free list: the next to be evicted."""
    if pool.ref_counts[block] == 0:
        raise ValueError(f"block {block} is already free")
    pool.ref_counts[block] -= 1
    if pool.ref_counts[block] == 0:
        pool.free[block] = None
        pool.free.move_to_end(block, last=False)


def release__free_while_shared(pool, block):
    """Puts the block on the free list at every release, even while others still hold it."""
    if pool.ref_counts[block] == 0:
        raise ValueError(f"block {block} is already free")
    pool.ref_counts[block] -= 1
    pool.free[block] = None


def release__silent_double_free(pool, block):
    """Never checks: releasing a free block drives its count below zero."""
    pool.ref_counts[block] -= 1
    if pool.ref_counts[block] == 0:
        pool.free[block] = None


def copy_on_write__copies_private_blocks(pool, table, index):
    """Copies every block before a write, even one only this table holds."""
    solution = _solution()
    block, private = table[index], solution.allocate(pool)
    solution.release(pool, block)
    table[index] = private
    return block, private


def copy_on_write__keeps_the_shared_reference(pool, table, index):
    """Makes the copy but never lets go of the shared block: it leaks."""
    block = table[index]
    if pool.ref_counts[block] == 1:
        return None
    private = _solution().allocate(pool)
    table[index] = private
    return block, private


def copy_on_write__table_unchanged(pool, table, index):
    """Reports the copy but leaves the shared block in the table: the write still hits it."""
    solution = _solution()
    block = table[index]
    if pool.ref_counts[block] == 1:
        return None
    private = solution.allocate(pool)
    solution.release(pool, block)
    return block, private


def copy_on_write__release_first(pool, table, index):
    """Lets go of the shared block before allocating: an empty pool leaves counts changed."""
    solution = _solution()
    block = table[index]
    if pool.ref_counts[block] == 1:
        return None
    solution.release(pool, block)
    private = solution.allocate(pool)
    table[index] = private
    return block, private


def prefix_hashes__includes_the_last_tokens_block(tokens, block_size):
    """Names every full block, the one holding the last token too: a full hit leaves
    nothing to compute."""
    hashes, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = chain_hash(parent, tuple(tokens[i * block_size:(i + 1) * block_size]))
        hashes.append(parent)
    return hashes


def prefix_hashes__no_chain(tokens, block_size):
    """Names each block by its own tokens only: equal blocks after different prefixes match."""
    return [chain_hash(None, tuple(tokens[i * block_size:(i + 1) * block_size]))
            for i in range((len(tokens) - 1) // block_size)]


def prefix_hashes__partial_last_block(tokens, block_size):
    """Also names the partly filled block before the last token's (rounds up)."""
    hashes, parent = [], None
    for i in range(-(-(len(tokens) - 1) // block_size)):
        parent = chain_hash(parent, tuple(tokens[i * block_size:(i + 1) * block_size]))
        hashes.append(parent)
    return hashes


def prefix_hashes__whole_prefix_tuple(tokens, block_size):
    """Hashes all tokens up to the block's end instead of chaining: right idea, not the
    engine's names, so nothing is ever found."""
    return [chain_hash(None, tuple(tokens[:(i + 1) * block_size]))
            for i in range((len(tokens) - 1) // block_size)]


def slot_mapping__ignores_the_table(block_table, start, count, block_size):
    """Uses the token's position as its slot, as if the cache were contiguous."""
    return list(range(start, start + count))


def slot_mapping__block_plus_offset(block_table, start, count, block_size):
    """Forgets to multiply the block id by the block size."""
    return [block_table[t // block_size] + t % block_size for t in range(start, start + count)]


def slot_mapping__from_token_zero(block_table, start, count, block_size):
    """Counts from token 0 instead of ``start``: every step rewrites the first slots."""
    return [block_table[t // block_size] * block_size + t % block_size for t in range(count)]

