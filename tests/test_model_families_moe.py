"""Mixture-of-experts families through minillm's one decoder: Qwen2-MoE (gated shared
expert, q/k/v biases), Qwen3-MoE (per-head QK-norm), OLMoE (QK-norm over the whole
projections) and Mixtral (here with a sliding window), each with 6 experts, 2 per token,
and a dense layer among the sparse ones for the Qwens. The checks of
:class:`family_parity.FamilyChecks` (Hugging Face's logits and greedy tokens, the engine
matrix, a checkpoint transformers loads back), which executors run them, and tensor
parallelism over 2 ranks (experts split between the ranks) equal to one process."""

from __future__ import annotations

import pytest
import torch
from family_parity import MOE_FAMILIES, PROMPTS, FamilyChecks, hf_model, saved_pair

from minillm.architecture_costs import parameter_counts
from minillm.checkpoint import resolve_checkpoint
from minillm.engine.executors import auto_executor, resolve_executor
from minillm.model import Transformer
from minillm.moe import MoE
from minillm.quant.checkpoint import copy_tokenizer_files
from minillm.sampling import SamplingParams
from minillm.serve import LLM


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


def checkpoint_with_tokenizer(family: str, directory) -> str:
    """``family``'s saved tiny model with SmolLM2's tokenizer files (the engine's rank
    processes load a checkpoint by path, tokenizer included)."""
    hf_model(family).save_pretrained(directory)
    copy_tokenizer_files(resolve_checkpoint("smollm2"), directory)
    return str(directory)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_tensor_parallel_over_two_ranks_equals_one_process(family, tmp_path):
    """Each rank holds 3 of the 6 experts of every sparse layer (and half of Qwen3-MoE's
    dense layer); Mixtral's layers are all sparse and keep their window."""
    checkpoint = checkpoint_with_tokenizer(family, tmp_path)

    def run(**options):
        with LLM(checkpoint, block_size=4, num_blocks=64, executor="eager", **options) as llm:
            outputs = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=10), progress=False)
            return [o.tokens for o in outputs]

    assert run(tensor_parallel_size=2) == run()


def test_what_tensor_parallelism_cannot_split_is_refused(tmp_path):
    checkpoint = checkpoint_with_tokenizer("olmoe", tmp_path)
    with pytest.raises(ValueError, match="QK-norm spans every head.*shard_attention=False"):
        LLM(checkpoint, block_size=4, num_blocks=16, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="6 experts do not split evenly over 4 ranks"):
        LLM(checkpoint, block_size=4, num_blocks=16, tensor_parallel_size=4,
            shard_attention=False)
