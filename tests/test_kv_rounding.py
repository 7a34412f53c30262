"""Attention through a rounded KV cache in the engine (minillm/experiments/kv_rounding.py).

Oracles: float64 causal attention over the keys and values as the rounding gives them back
(tolerance 1e-5: the engine computes in float32), plain ``generate`` for the tokens of
an unrounded read, and the library's rounding applied to each block by hand."""

from __future__ import annotations

import pytest
import torch

from minillm.attention.kv_int4 import dequantize_int4, quantize_int4
from minillm.attention.kv_quant import dequantize_int8, quantize_int8
from minillm.config import ModelConfig
from minillm.experiments.kv_rounding import (
    RoundedReads,
    int4_rounding,
    int8_rounding,
    layer_errors,
    no_rounding,
)
from minillm.reference import generate
from minillm.sampling import SamplingParams
from minillm.serve import LLM
from minillm.testing import TINY, varied_random_model

INT8 = int8_rounding(quantize_int8, dequantize_int8)
PROMPTS = [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12]]


@pytest.fixture(scope="module")
def model():
    return varied_random_model(ModelConfig(**TINY))


def causal_attention64(q, keys, values):
    """q [n, heads, d] the last n positions of keys/values [length, kv_heads, d]."""
    group = q.shape[1] // keys.shape[1]
    k, v = (x.double().repeat_interleave(group, 1) for x in (keys, values))
    scores = torch.einsum("qhd,thd->hqt", q.double(), k) / q.shape[-1] ** 0.5
    length, n = keys.shape[0], q.shape[0]
    future = torch.arange(length) > torch.arange(length - n, length)[:, None]
    return torch.einsum("hqt,thd->qhd", scores.masked_fill(future, -torch.inf).softmax(-1), v)


def test_a_read_through_int8_is_attention_over_the_rounded_blocks():
    g = torch.Generator().manual_seed(0)
    key_pool, value_pool = torch.randn(2, 6, 4, 2, 8, generator=g)
    q = torch.randn(1 + 3, 4, 8, generator=g)  # a decode, then a chunk of 3
    tables, query_lens, lengths = [[5, 1], [0, 3, 2]], [1, 3], [7, 10]
    reads = RoundedReads({"int8": (INT8, INT8), "none": (no_rounding, no_rounding)},
                         follow="int8")
    out = reads(q, key_pool, value_pool, tables, query_lens, lengths)
    first = 0
    for table, n, length in zip(tables, query_lens, lengths, strict=True):
        keys, values = (INT8(pool[table]).flatten(0, 1)[:length] for pool in (key_pool,
                                                                               value_pool))
        torch.testing.assert_close(out[first:first + n].double(),
                                   causal_attention64(q[first:first + n], keys, values),
                                   rtol=1e-5, atol=1e-5)
        first += n
    assert reads.errors["none"] == [0.0] and 0 < reads.errors["int8"][0] < 0.05


def test_int4_rounds_keys_per_channel_over_each_block_or_per_token():
    blocks = torch.randn(3, 4, 2, 8, generator=torch.Generator().manual_seed(1))
    per_channel = int4_rounding(quantize_int4, dequantize_int4, per_channel=True)(blocks)
    per_token = int4_rounding(quantize_int4, dequantize_int4, per_channel=False)(blocks)
    for b in range(3):
        torch.testing.assert_close(per_channel[b], dequantize_int4(*quantize_int4(blocks[b], 0),
                                                                   0), rtol=0, atol=0)
    torch.testing.assert_close(per_token, dequantize_int4(*quantize_int4(blocks, -1), -1),
                               rtol=0, atol=0)


def test_the_engine_on_unrounded_reads_gives_the_tokens_of_generate(model):
    reads = RoundedReads({"none": (no_rounding, no_rounding)}, follow="none")
    llm = LLM(model, block_size=4, num_blocks=16, decode_attention=reads)
    params = SamplingParams(max_tokens=6)
    outputs = llm.generate(PROMPTS, params, progress=False)
    assert [o.tokens for o in outputs] == [generate(model, p, 6, params)[0] for p in PROMPTS]
    assert set(reads.errors["none"]) == {0.0}


def test_layer_errors_gives_one_error_per_layer_and_wants_whole_blocks(model):
    errors = layer_errors(model, list(range(3, 11)), {"int8": (INT8, INT8)}, block_size=4)
    assert len(errors["int8"]) == TINY["num_layers"] and all(e > 0 for e in errors["int8"])
    with pytest.raises(ValueError, match="multiple of 4"):
        layer_errors(model, list(range(3, 12)), {"int8": (INT8, INT8)}, block_size=4)


def test_following_an_unknown_reading_is_refused():
    with pytest.raises(ValueError, match="names no reading"):
        RoundedReads({"int8": (INT8, INT8)}, follow="int4")
