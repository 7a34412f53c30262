"""Expert parallelism over 2 gloo processes: each rank holds half the experts, its own
tokens travel with all_to_all, and every rank's output equals one process running the
whole MoE layer on the same tokens (1e-5), with three all_to_all per call (or, when every
rank holds the same tokens, one all-reduce), including a
rank with a single token (most experts idle), Qwen2-MoE's gated shared expert and
DeepSeek's sigmoid routing. The layer the ranks were built from is left as it was."""

from __future__ import annotations

import copy

import pytest
import torch

from minillm.moe import MoE
from minillm.parallel.experts import expert_parallel
from minillm.parallel.launch import run_ranks
from minillm.parallel.layers import COLLECTIVES

LAYERS = {
    "qwen2_moe": dict(hidden_size=16, expert_intermediate_size=12, num_experts=8, top_k=2,
                      norm_topk_prob=False, shared_intermediate_size=20, shared_gate=True),
    "deepseek": dict(hidden_size=16, expert_intermediate_size=12, num_experts=8, top_k=3,
                     norm_topk_prob=True, shared_intermediate_size=12, scoring="sigmoid",
                     routed_scaling_factor=2.5, num_groups=4, top_groups=2),
}
TOKENS_PER_RANK = [(5, 1), (40, 7)]


def random_layer(name: str) -> MoE:
    torch.manual_seed(0)
    layer = MoE(**LAYERS[name])
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3)
        if layer.gate.scoring == "sigmoid":
            layer.gate.e_score_correction_bias.copy_(torch.randn(8) * 0.3)
    return layer


def rank_tokens(rank: int, counts: tuple[int, int]) -> torch.Tensor:
    return torch.randn(counts[rank], 16, generator=torch.Generator().manual_seed(rank))


def expert_parallel_forward(rank, world, layer):
    """On each rank: its half of the experts, a forward of its own tokens per case, then
    one of tokens every rank holds."""
    shard = expert_parallel(layer, rank, world)
    outputs, collectives = [], []
    for counts in TOKENS_PER_RANK:
        COLLECTIVES.clear()
        with torch.no_grad():
            outputs.append(shard(rank_tokens(rank, counts)))
        collectives.append(dict(COLLECTIVES))
    replicated = expert_parallel(layer, rank, world, tokens="replicated")
    COLLECTIVES.clear()
    with torch.no_grad():
        shared_out = replicated(rank_tokens(0, (9, 9)))
    return {"outputs": outputs, "collectives": collectives, "replicated": shared_out,
            "replicated_collectives": dict(COLLECTIVES), "experts_held": len(shard.gate_up_proj)}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_two_ranks_equal_one_process(name):
    layer = random_layer(name)
    before = copy.deepcopy(layer.state_dict())
    results = run_ranks(expert_parallel_forward, 2, layer, timeout=120, start_method="fork")
    for rank, result in enumerate(results):
        assert result["experts_held"] == 4
        for counts, out, collectives in zip(TOKENS_PER_RANK, result["outputs"],
                                            result["collectives"], strict=True):
            with torch.no_grad():
                expected = layer(rank_tokens(rank, counts))
            assert (out - expected).abs().max() < 1e-5, (name, counts, rank)
            assert collectives == {"all_to_all": 3}
        with torch.no_grad():
            expected = layer(rank_tokens(0, (9, 9)))
        assert (result["replicated"] - expected).abs().max() < 1e-5, (name, rank)
        assert result["replicated_collectives"] == {"all_reduce": 1}
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())


def test_experts_that_do_not_split_evenly_are_refused():
    with pytest.raises(ValueError, match="8 experts do not split evenly over 3 ranks"):
        expert_parallel(random_layer("qwen2_moe"), 0, 3)
