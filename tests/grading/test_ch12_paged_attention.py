"""Graded tests for chapter 12's lab (12.5): paged attention for a batch of sequences.

Oracles: ordinary causal attention in float64 over each sequence's keys and values in
token order (on hidden random batches drawn by Hypothesis, and on edge cases), plain
``generate`` and the library's own engine for the runs in the engine (a tiny random model
with chunked prefill and with speculative decoding, and SmolLM2).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from ch12_engine_case import CONFIG, PARAMS, PROMPTS, SYSTEM
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.attention.paged import slot_mapping
from minillm.grading import load_impl
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import varied_random_model, watch_copies

impl = load_impl("ch12_paged_attention")


@dataclass
class Batch:
    """Sequences' queries and pools holding their keys and values in scattered blocks; every
    other slot (past a length, unused and padding blocks) is NaN."""

    q: torch.Tensor  # [total_queries, heads, head_dim]
    key_pool: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    value_pool: torch.Tensor
    tables: list[list[int]]  # each sequence's blocks, then `padding` blocks it does not fill
    query_lens: list[int]
    context_lens: list[int]
    keys: list[torch.Tensor]  # per sequence [length, kv_heads, head_dim], as the pool holds them
    values: list[torch.Tensor]

    def expected(self) -> torch.Tensor:
        """The oracle: causal attention in float64 over each sequence's keys in order."""
        rows, first = [], 0
        group = self.q.shape[1] // self.key_pool.shape[2]
        for n, length, keys, values in zip(self.query_lens, self.context_lens, self.keys,
                                           self.values, strict=True):
            keys, values = (x.double().repeat_interleave(group, 1) for x in (keys, values))
            q = self.q[first:first + n].double()
            scores = torch.einsum("qhd,thd->hqt", q, keys) / q.shape[-1] ** 0.5
            future = torch.arange(length) > torch.arange(length - n, length)[:, None]
            scores = scores.masked_fill(future, float("-inf"))
            rows.append(torch.einsum("hqt,thd->qhd", scores.softmax(-1), values))
            first += n
        return torch.cat(rows)

    def check(self, answer: torch.Tensor) -> None:
        assert answer.shape == self.q.shape and answer.dtype == self.q.dtype
        tolerance = 1e-9 if self.q.dtype == torch.float64 else 2e-4  # q's dtype computes
        torch.testing.assert_close(answer.double(), self.expected(), rtol=tolerance,
                                   atol=tolerance)

    def attend(self, *pools: torch.Tensor) -> torch.Tensor:
        """Your paged attention over this batch (through other pool objects, if given)."""
        key_pool, value_pool = pools or (self.key_pool, self.value_pool)
        return impl.paged_attention(self.q, key_pool, value_pool, [list(t) for t in self.tables],
                                    list(self.query_lens), list(self.context_lens))


def make_batch(seed: int, seqs=((9, 1),), heads: int = 4, kv_heads: int = 2, head_dim: int = 8,
               block_size: int = 4, padding: int = 0, q_dtype: torch.dtype = torch.float64,
               pool_dtype: torch.dtype | None = None, spread: float = 1.0,
               offset: float = 0.0) -> Batch:
    """``seqs``: (length, queries) of each sequence; ``spread``: the scale of q (how peaked
    the softmax is); ``offset``: a constant added to every score (through one key channel
    set to 8), ±1000 overflows a naive exp."""
    g, pool_dtype = torch.Generator().manual_seed(seed), pool_dtype or q_dtype
    sizes = [-(-length // block_size) + padding for length, _ in seqs]
    num_blocks = sum(sizes) + 2  # two blocks nobody holds
    order = torch.randperm(num_blocks, generator=g).tolist()
    pools = [torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"),
                        dtype=pool_dtype) for _ in range(2)]
    tables, keys, values, queries = [], [], [], []
    for (length, n), size in zip(seqs, sizes, strict=True):
        tables.append(order[:size])
        order = order[size:]
        k, v = torch.randn(2, length, kv_heads, head_dim, generator=g, dtype=torch.float64)
        q = spread * torch.randn(n, heads, head_dim, generator=g, dtype=torch.float64)
        if offset:
            k[..., 0], q[..., 0] = 8.0, offset * head_dim ** 0.5 / 8.0
        slots = torch.tensor(slot_mapping(tables[-1], 0, length, block_size))
        for pool, x, stored in zip(pools, (k, v), (keys, values), strict=True):
            stored.append(x.to(pool_dtype))
            pool.flatten(0, 1)[slots] = stored[-1]
        queries.append(q.to(q_dtype))
    return Batch(torch.cat(queries), *pools, tables, [n for _, n in seqs],
                 [length for length, _ in seqs], keys, values)


@st.composite
def batches(draw) -> Batch:
    kv_heads, group = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    seqs = []
    for _ in range(draw(st.integers(1, 3))):
        length = draw(st.integers(1, 6 * block_size))
        seqs.append((length, draw(st.sampled_from([1, 1, min(length, 5), length]) |
                                  st.integers(1, length))))
    q_dtype, pool_dtype = draw(st.sampled_from([(torch.float64, torch.float64)] + [
        (torch.float32, pool) for pool in (torch.float32, torch.bfloat16, torch.float16)]))
    return make_batch(
        draw(st.integers(0, 2**16)), seqs, heads=kv_heads * group, kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([1, 2, 4, 8, 16, 64])), block_size=block_size,
        padding=draw(st.integers(0, 2)), q_dtype=q_dtype, pool_dtype=pool_dtype,
        spread=draw(st.sampled_from([0.3, 1.0, 3.0])),
        offset=draw(st.sampled_from([0.0, 0.0, 1000.0, -1000.0])))


@pytest.mark.exercise("12.5", points=3)
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(batch=batches())
def test_paged_attention_matches_causal_attention_on_random_batches(batch):
    """Random batches of sequences (lengths, query counts from 1 to the whole context),
    GQA shapes, block sizes, scattered and padded tables, fp32 / bf16 / fp16 / float64
    pools, scores in the thousands: float64 causal attention's answer."""
    before = batch.key_pool.clone(), batch.value_pool.clone()
    batch.check(batch.attend())
    torch.testing.assert_close((batch.key_pool, batch.value_pool), before, rtol=0, atol=0,
                               equal_nan=True, msg="the pools must be read, not written")


EDGES = {"one decode of length 1": dict(seqs=[(1, 1)]),
         "last block exactly full": dict(seqs=[(12, 1), (12, 3)]),
         "shorter than a block": dict(block_size=8, seqs=[(5, 1), (5, 2)]),
         "blocks of one slot": dict(block_size=1, seqs=[(7, 1), (7, 3)]),
         "padded block tables": dict(seqs=[(6, 1), (9, 2)], padding=3),
         "a whole prompt (queries = length)": dict(seqs=[(11, 11)]),
         "queries spanning several blocks": dict(seqs=[(23, 10)]),
         "queries from a block's first slot": dict(seqs=[(12, 4), (16, 8)]),
         "queries from mid-block": dict(seqs=[(14, 3), (10, 7)]),
         "decodes and verifications mixed": dict(seqs=[(9, 1), (17, 5), (3, 1), (30, 4)]),
         "multi-head (group 1)": dict(heads=3, kv_heads=3, seqs=[(10, 1), (10, 4)]),
         "multi-query (one KV head)": dict(heads=6, kv_heads=1, seqs=[(10, 1), (10, 4)]),
         "SmolLM2's heads, γ = 4": dict(heads=9, kv_heads=3, head_dim=64, block_size=16,
                                        seqs=[(37, 1), (50, 5)]),
         "bf16 pool": dict(heads=6, seqs=[(30, 1), (30, 6)], q_dtype=torch.float32,
                           pool_dtype=torch.bfloat16),
         "fp16 pool": dict(heads=6, seqs=[(30, 1), (30, 6)], q_dtype=torch.float32,
                           pool_dtype=torch.float16),
         # exp(±1000) is inf or 0 in any float: only a running maximum keeps softmax finite
         "scores near +1000": dict(seqs=[(23, 1), (23, 6)], offset=1000.0),
         "scores near -1000, fp32": dict(seqs=[(23, 1), (23, 6)], offset=-1000.0,
                                         q_dtype=torch.float32)}


@pytest.mark.exercise("12.5", points=3)
@pytest.mark.parametrize("case", EDGES)
def test_paged_attention_edge_cases(case):
    """Every slot a sequence does not hold is NaN: reading one poisons the answer."""
    for seed in range(3):
        batch = make_batch(seed, spread=2.0, **EDGES[case])
        batch.check(batch.attend())


@pytest.mark.exercise("12.5", points=2)
@pytest.mark.parametrize("shape", [
    dict(heads=6, kv_heads=2, head_dim=4, block_size=2, seqs=[(99, 1), (60, 3), (40, 1)]),
    dict(heads=9, kv_heads=3, head_dim=64, block_size=16, seqs=[(600, 5), (300, 1)]),
    dict(heads=4, kv_heads=1, head_dim=2, block_size=1, seqs=[(40, 2), (30, 1)])])
def test_paged_attention_makes_no_gathered_copy(shape):
    """Nothing computed from the pools may hold more than one block's keys for every query
    of one sequence and every query head (n × block_size × heads × head_dim, n the most
    queries of a sequence): a gathered context (length × kv_heads × head_dim) and a row of
    all the scores (heads × queries × length) are each several times that here."""
    batch = make_batch(5, **shape)
    pools, copies = watch_copies(batch.key_pool, batch.value_pool)
    batch.check(batch.attend(*pools).as_subclass(torch.Tensor))
    most = max(n for _, n in shape["seqs"])
    bound = most * shape["block_size"] * shape["heads"] * shape["head_dim"]
    assert copies and max(copies) <= bound, f"a copy of {max(copies, default=0)} > {bound}"


@pytest.mark.exercise("12.5", points=1)
@pytest.mark.parametrize("query_lens, context_lens", [
    ([1, 3], [9, 5]),  # the queries sum to 4, q has 3 rows
    ([0, 3], [9, 5]),  # a sequence without a query
    ([2, 1], [1, 5]),  # more queries than tokens
    ([2, 1], [9, 13])])  # 13 tokens do not fit in the table's 3 blocks of 4
def test_paged_attention_refuses_an_inconsistent_batch(query_lens, context_lens):
    batch = make_batch(0, seqs=[(9, 2), (5, 1)])
    with pytest.raises(ValueError):
        impl.paged_attention(batch.q, batch.key_pool, batch.value_pool, batch.tables,
                             query_lens, context_lens)


# -- the engine with your attention ------------------------------------------------------



@pytest.fixture(scope="module")
def model():
    return varied_random_model(CONFIG)


def watched(seen: list):
    """Your paged attention, noting (queries, length) of every sequence it is given."""
    def attention(q, key_pool, value_pool, block_tables, query_lens, context_lens):
        seen.extend(zip(query_lens, context_lens, strict=True))
        return impl.paged_attention(q, key_pool, value_pool, block_tables, query_lens,
                                    context_lens)
    return attention


@pytest.mark.exercise("12.5", points=2)
def test_your_paged_attention_runs_every_step_in_the_engine(model):
    """Four requests at once, prefill in chunks of 12 tokens over a shared prefix: every
    attention of every step is yours, and the tokens equal plain decoding."""
    seen = []
    llm = LLM(model, block_size=4, num_blocks=48, decode_attention=watched(seen),
              scheduler=SchedulerConfig(max_batch=4, max_tokens_per_step=12))
    outputs = llm.generate(PROMPTS, PARAMS, progress=False)
    assert [o.tokens for o in outputs] == [generate(model, p, 8, PARAMS)[0] for p in PROMPTS]
    assert any(n == 1 for n, _ in seen) and any(1 < n < length for n, length in seen)


@pytest.mark.exercise("12.5", points=2)
def test_your_paged_attention_verifies_speculative_guesses_in_the_engine(model):
    """Prompt-lookup speculation with γ = 3: each verification's γ + 1 queries attend
    causally through your function; the tokens equal the library engine's."""
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 7, SYSTEM[:9] * 2]
    params, seen = SamplingParams(max_tokens=16), []
    library, yours = ([o.tokens for o in LLM(model, block_size=4, num_blocks=64, **seam,
                                              prefix_caching=False,
                                              scheduler=SchedulerConfig(max_batch=3,
                                                                        speculative_tokens=3))
                       .generate(prompts, params, progress=False)]
                      for seam in ({}, dict(decode_attention=watched(seen))))
    assert yours == library
    assert any(1 < n < length for n, length in seen), "no guess was verified"


@pytest.mark.exercise("12.5", points=2)
@pytest.mark.smollm2
def test_your_paged_attention_runs_smollm2_in_the_engine(smollm2, tokenizer):
    """SmolLM2 (9 query heads, 3 KV heads) with your attention in every step, blocks of 8
    so the contexts span several, the last part full, and speculation on (γ = 3): the
    library engine's tokens."""
    prompts = [tokenizer.chat_prompt(text) for text in
               ("What is a KV cache?", "Repeat after me: the sea, the sea, the sea.")]
    config = dict(block_size=8, num_blocks=64,
                  scheduler=SchedulerConfig(max_batch=2, speculative_tokens=3))
    library, yours = ([o.tokens for o in LLM(smollm2, **config, **seam)
                       .generate(prompts, SamplingParams(max_tokens=12), progress=False)]
                      for seam in ({}, dict(decode_attention=impl.paged_attention)))
    assert yours == library
