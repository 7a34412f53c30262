"""Plausible wrong answers to chapter 12's lab (paged attention); the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``."""

import torch


def _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens, *,
          rescale_acc=True, rescale_sum=True, tiled_heads=False, whole_last_block=False,
          scale=True, subtract_max=True, table_order=True, compute_dtype=None,
          see_self=True, positions_from_zero=False, causal=True, mask_last_block_only=False,
          normalise_per_block=False, row_per_sequence=False, first_table=False):
    """The lab's walk (every query of a sequence at once, block by block, online softmax);
    each switch breaks one thing."""
    total, heads, head_dim = q.shape
    block_size, kv_heads = key_pool.shape[1], key_pool.shape[2]
    dtype, out, first = compute_dtype or q.dtype, torch.zeros_like(q), 0
    for s, (table, n, length) in enumerate(zip(block_tables, query_lens, context_lens,
                                               strict=True)):
        table = block_tables[0] if first_table else table
        rows = slice(s, s + n) if row_per_sequence else slice(first, first + n)
        chunk = q[rows]
        n = chunk.shape[0]
        if tiled_heads:  # query head h reads KV head h % kv_heads
            grouped = chunk.reshape(n, heads // kv_heads, kv_heads, head_dim).permute(2, 1, 0, 3)
        else:
            grouped = chunk.reshape(n, kv_heads, heads // kv_heads, head_dim).permute(1, 2, 0, 3)
        grouped = grouped.to(dtype) / (head_dim ** 0.5 if scale else 1.0)
        positions = torch.arange(n) + (0 if positions_from_zero else length - n)
        running_max = torch.full(grouped.shape[:-1], float("-inf"), dtype=dtype)
        running_sum, acc = torch.zeros_like(running_max), torch.zeros_like(grouped)
        blocks = -(-length // block_size)
        for i in range(blocks):
            start = i * block_size
            filled = block_size if whole_last_block else min(block_size, length - start)
            block = table[i] if table_order else i
            keys = key_pool[block, :filled].to(dtype)
            values = value_pool[block, :filled].to(dtype)
            scores = torch.einsum("kgqd,tkd->kgqt", grouped, keys)
            key_pos = torch.arange(start, start + filled)
            hidden = key_pos > positions[:, None] if see_self else \
                key_pos >= positions[:, None]
            if causal and (i == blocks - 1 or not mask_last_block_only):
                scores = scores.masked_fill(hidden, float("-inf"))
            if subtract_max:
                new_max = torch.maximum(running_max, scores.amax(-1))
                rescale = torch.exp(running_max - new_max)
            else:
                new_max, rescale = torch.zeros_like(running_max), torch.ones_like(running_max)
            new_max = new_max.nan_to_num(neginf=0.0)  # a row that sees nothing in the block
            weights = torch.exp(scores - new_max[..., None])
            if normalise_per_block:  # each block's softmax, then added up
                weights = weights / weights.sum(-1, keepdim=True).clamp(min=torch.finfo(dtype).tiny)
            running_sum = running_sum * (rescale if rescale_sum else 1.0) + weights.sum(-1)
            acc = acc * (rescale[..., None] if rescale_acc else 1.0) + \
                torch.einsum("kgqt,tkd->kgqd", weights, values)
            running_max = new_max
        answer = acc / running_sum[..., None]
        answer = answer.permute(2, 1, 0, 3) if tiled_heads else answer.permute(2, 0, 1, 3)
        out[rows] = answer.reshape(n, heads, head_dim).to(q.dtype)
        first += n
    return out


def paged_attention__accumulator_not_rescaled(q, key_pool, value_pool, block_tables,
                                              query_lens, context_lens):
    """Rescales the running sum but not the accumulator when the maximum grows."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 rescale_acc=False)


def paged_attention__sum_not_rescaled(q, key_pool, value_pool, block_tables, query_lens,
                                      context_lens):
    """Rescales the accumulator but not the running sum when the maximum grows."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 rescale_sum=False)


def paged_attention__no_running_max(q, key_pool, value_pool, block_tables, query_lens,
                                    context_lens):
    """Sums exp(score) with no maximum subtracted: overflows (or underflows) on large scores."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 subtract_max=False)


def paged_attention__normalised_per_block(q, key_pool, value_pool, block_tables, query_lens,
                                          context_lens):
    """Normalises each block's weights on their own and adds the blocks up: every block
    weighs the same, however its scores compare with the others'."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 normalise_per_block=True)


def paged_attention__heads_tiled(q, key_pool, value_pool, block_tables, query_lens,
                                 context_lens):
    """Pairs query head h with KV head h % kv_heads (tiled) instead of h // group."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 tiled_heads=True)


def paged_attention__no_scale(q, key_pool, value_pool, block_tables, query_lens, context_lens):
    """Forgets the 1/√head_dim scale of the scores."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens, scale=False)


def paged_attention__query_misses_itself(q, key_pool, value_pool, block_tables, query_lens,
                                         context_lens):
    """Off by one in the causal mask: a query sees the tokens before it but not its own."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 see_self=False)


def paged_attention__queries_from_position_zero(q, key_pool, value_pool, block_tables,
                                                query_lens, context_lens):
    """Puts a sequence's queries at positions 0 .. n - 1 (a fresh prompt) instead of its last
    n positions: a verification or later chunk sees almost nothing."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 positions_from_zero=True)


def paged_attention__no_causal_mask(q, key_pool, value_pool, block_tables, query_lens,
                                    context_lens):
    """Lets every query of a sequence see all its tokens, the later queries' included."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 causal=False)


def paged_attention__mask_on_the_last_block_only(q, key_pool, value_pool, block_tables,
                                                 query_lens, context_lens):
    """Masks only the block holding the last token: queries spanning several blocks see
    their future in the earlier ones."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 mask_last_block_only=True)


def paged_attention__one_row_per_sequence(q, key_pool, value_pool, block_tables, query_lens,
                                          context_lens):
    """Takes sequence s's queries from row s, as if every sequence were a decode."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 row_per_sequence=True)


def paged_attention__first_table_for_all(q, key_pool, value_pool, block_tables, query_lens,
                                         context_lens):
    """Reads every sequence through the first sequence's block table."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 first_table=True)


def paged_attention__whole_last_block(q, key_pool, value_pool, block_tables, query_lens,
                                      context_lens):
    """Reads every slot of the last block, empty slots past the length included."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 whole_last_block=True)


def paged_attention__pool_in_block_id_order(q, key_pool, value_pool, block_tables,
                                            query_lens, context_lens):
    """Reads blocks 0, 1, 2... of the pool, as if the sequence were stored contiguously."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 table_order=False)


def paged_attention__math_in_the_pool_dtype(q, key_pool, value_pool, block_tables,
                                            query_lens, context_lens):
    """Casts the queries to the pool's dtype: a bf16 or fp16 pool computes in half precision."""
    return _walk(q, key_pool, value_pool, block_tables, query_lens, context_lens,
                 compute_dtype=key_pool.dtype)


def paged_attention__gather_then_softmax(q, key_pool, value_pool, block_tables, query_lens,
                                         context_lens):
    """Gathers each context into one copy, then an ordinary causal softmax: right answer,
    but the copy the lab is about avoiding."""
    block_size, group = key_pool.shape[1], q.shape[1] // key_pool.shape[2]
    out, first = torch.empty_like(q), 0
    for table, n, length in zip(block_tables, query_lens, context_lens, strict=True):
        blocks = table[:-(-length // block_size)]
        keys, values = (pool[blocks].flatten(0, 1)[:length].to(q.dtype)
                        .repeat_interleave(group, 1) for pool in (key_pool, value_pool))
        scores = torch.einsum("qhd,thd->hqt", q[first:first + n], keys) / q.shape[-1] ** 0.5
        future = torch.arange(length) > torch.arange(length - n, length)[:, None]
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        out[first:first + n] = torch.einsum("hqt,thd->qhd", weights, values)
        first += n
    return out


def paged_attention__all_scores_first(q, key_pool, value_pool, block_tables, query_lens,
                                      context_lens):
    """Two passes: every block's scores into one row per query, softmax, then the values;
    no gathered keys, but a [heads, n, length] row that grows with the context."""
    heads, head_dim = q.shape[1:]
    block_size, kv_heads = key_pool.shape[1], key_pool.shape[2]
    out, first = torch.empty_like(q), 0
    for table, n, length in zip(block_tables, query_lens, context_lens, strict=True):
        grouped = q[first:first + n].reshape(n, kv_heads, heads // kv_heads, head_dim)
        grouped = grouped.permute(1, 2, 0, 3) / head_dim ** 0.5
        spans = [(table[i], min(block_size, length - i * block_size))
                 for i in range(-(-length // block_size))]
        scores = torch.cat([torch.einsum("kgqd,tkd->kgqt", grouped, key_pool[b, :m].to(q.dtype))
                            for b, m in spans], dim=-1)
        future = torch.arange(length) > torch.arange(length - n, length)[:, None]
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        answer, start = torch.zeros_like(grouped), 0
        for b, m in spans:
            answer = answer + torch.einsum("kgqt,tkd->kgqd", weights[..., start:start + m],
                                           value_pool[b, :m].to(q.dtype))
            start += m
        out[first:first + n] = answer.permute(2, 0, 1, 3).reshape(n, heads, head_dim)
        first += n
    return out
