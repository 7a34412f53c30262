"""Chapter 12 lab: paged attention. Every sequence of an engine step attends over its own
cached tokens by reading the pool through its block table, block by block, with the online
softmax of chapter 05 and no gathered copy of the context: one query per sequence for a
decode, several for a speculative verification or a prefill chunk, all in one call
(``LLM(model, decode_attention=paged_attention)``)."""

from __future__ import annotations

import torch


def paged_attention(q: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor,
                    block_tables: list[list[int]], query_lens: list[int],
                    context_lens: list[int]) -> torch.Tensor:
    """Exercise 12.5: Lab: paged attention for a batch of sequences, causal, no gathered copy.

    What the engine calls (``LLM(model, decode_attention=paged_attention)``): in every
    layer of every eager step, once for all the step's sequences, after it wrote their new
    keys and values into the pool, with

    * ``q`` [total_queries, heads, head_dim]: the new tokens' queries, sequence after
      sequence (the flat batch of chapter 13), in fp32 (or float64 in the tests);
    * ``key_pool``, ``value_pool`` [num_blocks, block_size, kv_heads, head_dim]: one
      layer's pool, in any float dtype (fp32, bf16, fp16, float64), shared by every
      sequence; read them, never write them;
    * ``block_tables[s]``: sequence s's blocks in order. Its token t lives in block
      ``block_tables[s][t // block_size]`` at offset ``t % block_size``. The engine pads
      tables, so a table may name more blocks than its sequence fills;
    * ``query_lens[s]`` >= 1: how many rows of ``q`` are sequence s's (they sum to
      ``total_queries``): 1 for a decode, γ + 1 for a speculative verification of γ
      guesses, a chunk's length for a prefill chunk;
    * ``context_lens[s]`` >= ``query_lens[s]``: sequence s's tokens 0 .. length - 1 are in
      the pool, and its queries are its LAST ``query_lens[s]`` tokens, positions
      ``length - query_lens[s] .. length - 1``. Slots past ``length`` (the end of a
      part-full last block, padding blocks) hold anything, NaN included.

    Returns [total_queries, heads, head_dim] in q's dtype, row for row with ``q``: the query
    at position p gets softmax(q·kᵀ / √head_dim)·v over its sequence's tokens 0 .. p
    (causal; Vaswani et al. 2017, Eq. 1), computed in q's dtype, with query head ``h``
    reading KV head ``h // (heads // kv_heads)`` (grouped-query attention, chapter 4).

    Invariants the tests check, on random batches against a float64 reference:

    * the answer stays exact when every score is in the thousands (where exp overflows);
    * sequences do not mix: each row depends only on its own sequence's queries and blocks;
    * **no gathered copy**: with n the most queries any one sequence has in the call, no
      tensor computed from the pools holds more than n × block_size × heads × head_dim
      elements (one block's keys or values for every query of one sequence and every query
      head), whatever the lengths are: neither a gathered [length, ...] copy of a context
      nor a row of all ``length`` scores per query. Views of the pools (indexing one block,
      reshaping) are not copies; the answer itself may be one tensor.

    Raises ValueError, before computing anything, when ``query_lens`` do not sum to q's rows,
    a sequence has no query or more queries than tokens, or its table is too short for its
    length.

    Hints: the online softmax of chapter 05 (exercise 05.1, notebook 05 section 2;
    FlashAttention-2, Dao 2023, §3.1, for the causal mask: only blocks that overlap the
    queries' positions need it); PagedAttention (Kwon et al. 2023) §4.1; notebook 12
    section 7 (the recurrence, the causal picture and the engine run).
    """
    ### BEGIN SOLUTION
    total, heads, head_dim = q.shape
    block_size, kv_heads = key_pool.shape[1], key_pool.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} KV heads evenly")
    if sum(query_lens) != total:
        raise ValueError(f"query_lens sum to {sum(query_lens)}, but q has {total} rows")
    for table, n, length in zip(block_tables, query_lens, context_lens, strict=True):
        if not 1 <= n <= length or len(table) * block_size < length:
            raise ValueError(f"{n} queries over {length} tokens in {len(table)} blocks")
    group, out, first = heads // kv_heads, torch.empty_like(q), 0
    for table, n, length in zip(block_tables, query_lens, context_lens, strict=True):
        # query head h = kv * group + g reads KV head kv: [kv_heads, group, n, head_dim]
        queries = q[first:first + n].reshape(n, kv_heads, group, head_dim).permute(1, 2, 0, 3)
        queries = queries / head_dim ** 0.5
        answer = torch.empty_like(queries)
        # tiles of at most block_size queries, so a tile never reads the blocks after it
        for tile in range(0, n, block_size):
            rows = min(block_size, n - tile)
            lowest = length - n + tile  # the tile's queries are at lowest .. lowest + rows - 1
            positions = torch.arange(lowest, lowest + rows, device=q.device)
            running_max = torch.full((kv_heads, group, rows), float("-inf"), dtype=q.dtype,
                                     device=q.device)
            running_sum = torch.zeros_like(running_max)
            acc = torch.zeros_like(queries[:, :, tile:tile + rows])
            for i in range((lowest + rows - 1) // block_size + 1):  # up to the last query's
                start = i * block_size
                filled = min(block_size, length - start)  # the last may be part full
                keys = key_pool[table[i], :filled].to(q.dtype)  # [filled, kv_heads, head_dim]
                values = value_pool[table[i], :filled].to(q.dtype)
                scores = torch.einsum("kgqd,tkd->kgqt", queries[:, :, tile:tile + rows], keys)
                if start + filled - 1 > lowest:  # a key past the first query: causal mask
                    hidden = torch.arange(start, start + filled, device=q.device) > \
                        positions[:, None]
                    scores = scores.masked_fill(hidden, float("-inf"))
                # block 0 holds token 0, seen by every query: the maximum is finite after it
                new_max = torch.maximum(running_max, scores.amax(-1))
                rescale = torch.exp(running_max - new_max)  # 0 at the first block
                weights = torch.exp(scores - new_max[..., None])
                running_sum = running_sum * rescale + weights.sum(-1)
                acc = acc * rescale[..., None] + torch.einsum("kgqt,tkd->kgqd", weights, values)
                running_max = new_max
            answer[:, :, tile:tile + rows] = acc / running_sum[..., None]
        out[first:first + n] = answer.permute(2, 0, 1, 3).reshape(n, heads, head_dim)
        first += n
    return out
    ### END SOLUTION
