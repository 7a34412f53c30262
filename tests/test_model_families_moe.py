"""Mixture-of-experts families through minillm's one decoder: Qwen2-MoE (gated shared
expert, q/k/v biases), Qwen3-MoE (per-head QK-norm), OLMoE (QK-norm over the whole
projections) and Mixtral (here with a sliding window), each with 6 experts, 2 per token,
and a dense layer among the sparse ones for the Qwens. The checks of
:class:`family_parity.FamilyChecks` (Hugging Face's logits and greedy tokens, the engine
matrix, a checkpoint transformers loads back), and which executors run them."""

from __future__ import annotations

import pytest
import torch
from family_parity import MOE_FAMILIES, FamilyChecks, saved_pair

from minillm.architecture_costs import parameter_counts
from minillm.engine.executors import auto_executor, resolve_executor
from minillm.model import Transformer
from minillm.moe import MoE


@pytest.fixture(scope="module", params=list(MOE_FAMILIES))
def pair(request, tmp_path_factory) -> tuple[Transformer, torch.nn.Module]:
    """(minillm's model loaded from the checkpoint, Hugging Face's model)."""
    return saved_pair(request.param, tmp_path_factory.mktemp(request.param))


class TestMoEFamilies(FamilyChecks):
    def test_the_sparse_layers_are_moe_layers(self, pair):
        ours, hf = pair
        sparse = [i for i, block in enumerate(ours.layers) if isinstance(block.mlp, MoE)]
        assert sparse == ours.config.moe_layers
        assert sparse == ([0, 2] if "qwen" in ours.config.family else [0, 1, 2])

    def test_only_the_eager_executor_runs_them(self, pair):
        ours = pair[0]
        with pytest.raises(ValueError, match="native executor cannot run.*mixture-of-experts"):
            resolve_executor(ours, "native")
        with pytest.raises(ValueError, match="compiled executor cannot run.*mixture-of-exp"):
            resolve_executor(ours, "compiled")
        assert auto_executor(ours) == "eager"

    def test_the_config_count_is_architecture_costs_total(self, pair):
        ours, hf = pair
        if ours.config.family != "qwen2_moe":  # its shared expert is not in that table
            assert ours.config.num_parameters() == parameter_counts(hf.config.to_dict()).total
