"""Tensor parallelism over gloo processes on this CPU: the sharded model's logits equal one
process's (1e-5 on tiny models; SmolLM2 to fp32 rounding), greedy tokens are identical,
every rank runs exactly 2 all-reduces per block plus the embedding's and one all-gather
for the head, and bad splits are refused before any process starts."""

from __future__ import annotations

import pytest
import torch

from minillm.checkpoint import load_model
from minillm.generate import generate
from minillm.parallel import COLLECTIVES, tensor_parallel
from minillm.parallel.launch import run_ranks
from minillm.parallel.tensor import check_split
from minillm.testing import tiny_pair

TOKENS = [[5, 17, 99, 3, 42, 7, 8, 5], [1, 2, 3, 4, 5, 6, 7, 8]]


def split_in_memory_forward(rank, world, checkpoint, tokens):
    """On each rank: load, keep this rank's shard, run a forward and a greedy generation."""
    model = tensor_parallel(load_model(checkpoint))
    COLLECTIVES.clear()
    with torch.no_grad():
        logits = model(torch.tensor(tokens))
    counts = dict(COLLECTIVES)
    return {"logits": logits, "collectives": counts, "heads": model.config.num_kv_heads,
            "greedy": generate(model, tokens[0], 10)[0]}


@pytest.mark.parametrize("world, kv_heads", [(2, 2), (4, 4), (2, 4)])
def test_tiny_model_under_tensor_parallelism_equals_one_process(tmp_path, world, kv_heads):
    tiny_pair(tmp_path, num_heads=8, num_kv_heads=kv_heads, head_dim=8, attention_bias=True)
    model = load_model(tmp_path)
    with torch.no_grad():
        expected = model(torch.tensor(TOKENS))
    results = run_ranks(split_in_memory_forward, world, str(tmp_path), TOKENS, timeout=120)
    for rank in results:
        assert torch.allclose(rank["logits"], expected, atol=1e-5)
        assert rank["greedy"] == generate(model, TOKENS[0], 10)[0]
        assert rank["heads"] == kv_heads // world  # KV caches sized from the rank's heads
        layers = model.config.num_layers
        assert rank["collectives"] == {"all_reduce": 2 * layers + 1, "all_gather": 1}


def test_smollm2_splits_three_ways_by_kv_group(smollm2):
    with torch.no_grad():
        expected = smollm2(torch.tensor(TOKENS))
    results = run_ranks(split_in_memory_forward, 3, "smollm2", TOKENS, timeout=300)
    for rank in results:
        # 1.1e-3 measured on logits of ~20: fp32 partial sums added in another order, over
        # 30 layers whose activations reach ~1e3 (chapter 06's outlier features)
        assert (rank["logits"] - expected).abs().max() < 5e-3
        assert torch.equal(rank["logits"].argmax(-1), expected.argmax(-1))
        assert rank["greedy"] == generate(smollm2, TOKENS[0], 10)[0]
        assert rank["collectives"] == {"all_reduce": 61, "all_gather": 1}


@pytest.mark.parametrize("world, message", [(2, "KV heads \\(3\\)"), (4, "KV heads"),
                                            (5, "KV heads")])
def test_uneven_splits_are_refused_before_any_process_starts(world, message):
    with pytest.raises(ValueError, match=message):
        check_split(9, 3, 1536, 49152, world)


def test_a_failing_rank_takes_the_group_down(tmp_path):
    with pytest.raises(Exception, match="needs the KV heads"):
        run_ranks(split_in_memory_forward, 2, "smollm2", TOKENS, timeout=120)
