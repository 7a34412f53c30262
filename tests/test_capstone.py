"""The capstone's rows (minillm.experiments.capstone) on a tiny random model: the engine rows give
plain greedy decoding's tokens, the W8A8 row its own model's, and the memory columns count
what they say."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from minillm.config import ModelConfig
from minillm.experiments.capstone import (
    engine_row,
    equal_to,
    format_table,
    minillm_runner,
    one_at_a_time,
    w8a8_model,
)
from minillm.experiments.workload import TraceRequest
from minillm.kv_cache import kv_cache_bytes
from minillm.quant.int8_activations import Int8ActivationLinear
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.serve import SchedulerConfig
from minillm.testing import TINY, varied_random_model

STOP = [3]
TRACE = [TraceRequest(0.0, [5, 9, 17, 2, 40 + i, 8][:3 + i % 4], 6 + 3 * (i % 3))
         for i in range(6)]


@pytest.fixture(scope="module")
def model():
    return varied_random_model(ModelConfig(**{**TINY, "tie_word_embeddings": True}))


@pytest.fixture(scope="module")
def tokenizer():
    """Enough of a tokenizer for token-id prompts: stop tokens, and text nobody reads."""
    return SimpleNamespace(stop_tokens=STOP, decode=lambda tokens: "")


def plain_greedy(model):
    return [generate(model, [r.prompt], r.max_tokens, stop_tokens=STOP)[0] for r in TRACE]


def test_one_at_a_time_gives_plain_greedy_tokens_and_counts_the_longest_request(model):
    row = one_at_a_time("plain", minillm_runner(model, STOP), TRACE, model.config, 1)
    assert row.tokens == plain_greedy(model)
    held = max(len(r.prompt) + len(t) for r, t in zip(TRACE, row.tokens, strict=True))
    assert row.kv_bytes == held * kv_cache_bytes(model.config, 1, bytes_per_value=4)
    assert row.throughput > 0 and row.ttft_p95 > 0


@pytest.mark.parametrize("options", [dict(prefix_caching=False), dict(),
                                     dict(scheduler=SchedulerConfig(max_batch=4,
                                                                    speculative_tokens=3))],
                         ids=["batching", "prefix-caching", "speculation"])
def test_engine_rows_are_lossless(model, tokenizer, options):
    row = engine_row("engine", TRACE, model, tokenizer, num_blocks=64, block_size=4, **options)
    reference = SimpleNamespace(tokens=plain_greedy(model))
    assert equal_to(row, reference) == len(TRACE)
    block_bytes = kv_cache_bytes(model.config, 1, bytes_per_value=4) * 4
    assert row.kv_bytes % block_bytes == 0 and 0 < row.kv_bytes <= 64 * block_bytes


def test_w8a8_row_quantizes_a_copy_and_the_engine_keeps_its_tokens(model, tokenizer):
    before = copy.deepcopy(model.state_dict())
    int8 = w8a8_model(model)
    assert all(v.equal(model.state_dict()[k]) for k, v in before.items())  # plain untouched
    linears = [m for m in int8.modules() if isinstance(m, Int8ActivationLinear)]
    assert len(linears) == 7 * model.config.num_layers + 1  # every projection and the head
    row = engine_row("w8a8", TRACE, int8, tokenizer, num_blocks=64, block_size=4)
    assert row.tokens == plain_greedy(int8)
    assert row.weight_bytes < 0.5 * engine_row("fp32", TRACE, model, tokenizer,
                                               num_blocks=64, block_size=4).weight_bytes


def test_the_table_has_a_line_per_row_against_the_first(model):
    rows = [one_at_a_time(name, minillm_runner(model, STOP), TRACE[:2], model.config, 2**20)
            for name in ("first", "second")]
    table = format_table(rows, rows[0]).splitlines()
    assert len(table) == 4 and table[2].startswith("| first |") and "1.00x" in table[2]
    assert table[3].endswith("| 2/2 |  |")  # no perplexity: the weights are plain's
