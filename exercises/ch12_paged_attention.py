# Generated from solutions/ch12_paged_attention.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
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
    raise NotImplementedError("Exercise 12.5: Lab: paged attention for a batch of sequences, causal, no gathered copy")
