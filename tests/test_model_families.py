"""Qwen2, Qwen3, Mistral (sliding window) and Gemma 3 (local and global layers) through
minillm's one decoder: a tiny random model built with transformers' own classes, saved and
loaded by ``minillm.load_model``, gives Hugging Face's logits and greedy tokens, in the
dense loop and in the engine (batched, chunked, preempted, prefix hits, n = 2): the checks
of :class:`family_parity.FamilyChecks`."""

from __future__ import annotations

import pytest
import torch
from family_parity import DENSE_FAMILIES, FamilyChecks, saved_pair

from minillm.config import ModelConfig
from minillm.model import Transformer


@pytest.fixture(scope="module", params=list(DENSE_FAMILIES))
def pair(request, tmp_path_factory) -> tuple[Transformer, torch.nn.Module]:
    """(minillm's model loaded from the checkpoint, Hugging Face's model)."""
    return saved_pair(request.param, tmp_path_factory.mktemp(request.param))


class TestDenseFamilies(FamilyChecks):
    pass


@pytest.mark.parametrize("model_type", ["deepseek_v2", "gemma2"])
def test_other_families_are_refused_with_the_supported_ones_named(model_type):
    hf = {"model_type": model_type, "vocab_size": 128, "hidden_size": 64,
          "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}
    with pytest.raises(ValueError, match="llama, smollm, mistral, qwen2, qwen3, gemma3_text, "
                                         "qwen2_moe, qwen3_moe, olmoe, mixtral, deepseek_v3"):
        ModelConfig.from_hf(hf)
