"""Plausible wrong answers to chapter 12 (the paged KV cache); the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``."""

import torch

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


def _online(q, key_pool, value_pool, block_table, length, *, rescale_acc=True,
            rescale_sum=True, tiled_heads=False, whole_last_block=False, scale=True,
            subtract_max=True, table_order=True, compute_dtype=None):
    """The lab's block walk with the online softmax; each switch breaks one thing."""
    heads, head_dim = q.shape
    block_size, kv_heads = key_pool.shape[1], key_pool.shape[2]
    dtype = compute_dtype or q.dtype
    if tiled_heads:  # query head h reads KV head h % kv_heads
        grouped = q.reshape(heads // kv_heads, kv_heads, head_dim).transpose(0, 1)
    else:
        grouped = q.reshape(kv_heads, heads // kv_heads, head_dim)
    grouped = grouped.to(dtype) / (head_dim ** 0.5 if scale else 1.0)
    running_max = torch.full(grouped.shape[:-1], float("-inf"), dtype=dtype)
    running_sum = torch.zeros_like(running_max)
    acc = torch.zeros_like(grouped)
    for i in range(-(-length // block_size)):
        filled = block_size if whole_last_block else min(block_size, length - i * block_size)
        block = block_table[i] if table_order else i
        keys = key_pool[block, :filled].to(dtype)
        values = value_pool[block, :filled].to(dtype)
        scores = torch.einsum("kgd,tkd->kgt", grouped, keys)
        if subtract_max:
            new_max = torch.maximum(running_max, scores.amax(-1))
            rescale = torch.exp(running_max - new_max)
        else:
            new_max, rescale = torch.zeros_like(running_max), torch.ones_like(running_max)
        weights = torch.exp(scores - new_max[..., None])
        running_sum = running_sum * (rescale if rescale_sum else 1.0) + weights.sum(-1)
        acc = acc * (rescale[..., None] if rescale_acc else 1.0) + \
            torch.einsum("kgt,tkd->kgd", weights, values)
        running_max = new_max
    out = acc / running_sum[..., None]
    return (out.transpose(0, 1) if tiled_heads else out).reshape(heads, head_dim).to(q.dtype)


def paged_attention__accumulator_not_rescaled(q, key_pool, value_pool, block_table, length):
    """Rescales the running sum but not the accumulator when the maximum grows."""
    return _online(q, key_pool, value_pool, block_table, length, rescale_acc=False)


def paged_attention__sum_not_rescaled(q, key_pool, value_pool, block_table, length):
    """Rescales the accumulator but not the running sum when the maximum grows."""
    return _online(q, key_pool, value_pool, block_table, length, rescale_sum=False)


def paged_attention__no_running_max(q, key_pool, value_pool, block_table, length):
    """Sums exp(score) with no maximum subtracted: overflows (or underflows) on large scores."""
    return _online(q, key_pool, value_pool, block_table, length, subtract_max=False)


def paged_attention__heads_tiled(q, key_pool, value_pool, block_table, length):
    """Pairs query head h with KV head h % kv_heads (tiled) instead of h // group."""
    return _online(q, key_pool, value_pool, block_table, length, tiled_heads=True)


def paged_attention__no_scale(q, key_pool, value_pool, block_table, length):
    """Forgets the 1/√head_dim scale of the scores."""
    return _online(q, key_pool, value_pool, block_table, length, scale=False)


def paged_attention__whole_last_block(q, key_pool, value_pool, block_table, length):
    """Attends to every slot of the last block, empty slots past ``length`` included."""
    return _online(q, key_pool, value_pool, block_table, length, whole_last_block=True)


def paged_attention__whole_table(q, key_pool, value_pool, block_table, length):
    """Walks every block the (padded) table names, every slot of each."""
    return _online(q, key_pool, value_pool, block_table, len(block_table) * key_pool.shape[1])


def paged_attention__pool_in_block_id_order(q, key_pool, value_pool, block_table, length):
    """Reads blocks 0, 1, 2... of the pool, as if the sequence were stored contiguously."""
    return _online(q, key_pool, value_pool, block_table, length, table_order=False)


def paged_attention__math_in_the_pool_dtype(q, key_pool, value_pool, block_table, length):
    """Casts the query to the pool's dtype: a bf16 or fp16 pool computes in half precision."""
    return _online(q, key_pool, value_pool, block_table, length,
                   compute_dtype=key_pool.dtype)


def paged_attention__gather_then_softmax(q, key_pool, value_pool, block_table, length):
    """Gathers the whole context into one copy, then an ordinary softmax: right answer, but
    the copy the lab is about avoiding (the old exercise)."""
    block_size = key_pool.shape[1]
    blocks = block_table[:-(-length // block_size)]
    keys = key_pool[blocks].flatten(0, 1)[:length].to(q.dtype)  # [length, kv_heads, head_dim]
    values = value_pool[blocks].flatten(0, 1)[:length].to(q.dtype)
    group = q.shape[0] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("hd,thd->ht", q, keys) / q.shape[-1] ** 0.5
    return torch.einsum("ht,thd->hd", scores.softmax(-1), values)


def paged_attention__all_scores_first(q, key_pool, value_pool, block_table, length):
    """Two passes: every block's scores into one row per head, softmax, then the values;
    no gathered keys, but a [heads, length] row that grows with the context."""
    heads, head_dim = q.shape
    block_size, kv_heads = key_pool.shape[1], key_pool.shape[2]
    grouped = q.reshape(kv_heads, heads // kv_heads, head_dim) / head_dim ** 0.5
    spans = [(block_table[i], min(block_size, length - i * block_size))
             for i in range(-(-length // block_size))]
    scores = torch.cat([torch.einsum("kgd,tkd->kgt", grouped, key_pool[b, :n].to(q.dtype))
                        for b, n in spans], dim=-1)
    weights, out, start = scores.softmax(-1), torch.zeros_like(grouped), 0
    for b, n in spans:
        out = out + torch.einsum("kgt,tkd->kgd", weights[..., start:start + n],
                                 value_pool[b, :n].to(q.dtype))
        start += n
    return out.reshape(heads, head_dim)
