"""YaRN rope scaling (DeepSeek-V3's published config, Qwen's long-context recipe): the
inverse frequencies and the cos/sin scale equal transformers' own computation, and tiny
models of both families that use it give transformers' logits past their original
context."""

from __future__ import annotations

import pytest
import torch
from family_parity import hf_model
from transformers import DeepseekV3Config, Qwen3Config
from transformers.modeling_rope_utils import _compute_yarn_parameters

from minillm.checkpoint import load_model
from minillm.config import ModelConfig
from minillm.rope import attention_factor, inverse_frequencies

DEEPSEEK_V3_YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                    "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
QWEN_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
SHORT = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
         "mscale": 0.9, "mscale_all_dim": 0.7}  # tiny models: positions past 32 are stretched


@pytest.mark.parametrize("hf_class, fields, scaling", [
    (DeepseekV3Config, dict(qk_rope_head_dim=64, max_position_embeddings=163840,
                            rope_theta=10000), DEEPSEEK_V3_YARN),
    (Qwen3Config, dict(head_dim=128, max_position_embeddings=131072, rope_theta=1e6),
     QWEN_YARN),
    (Qwen3Config, dict(head_dim=16, max_position_embeddings=128, rope_theta=1e4), SHORT),
])
def test_frequencies_and_scale_equal_transformers(hf_class, fields, scaling):
    hf = hf_class(**fields, rope_scaling=dict(scaling))
    expected, expected_factor = _compute_yarn_parameters(hf)
    ours = ModelConfig.from_hf(hf.to_dict())
    assert ours.rope_scaling["rope_type"] == "yarn"
    torch.testing.assert_close(inverse_frequencies(ours), expected, rtol=1e-6, atol=0)
    assert attention_factor(ours) == pytest.approx(expected_factor)


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3"])
def test_tiny_models_with_yarn_give_transformers_logits_past_the_old_context(family,
                                                                             tmp_path):
    hf = hf_model(family, rope_scaling=dict(SHORT))
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    tokens = torch.randint(0, 128, (2, 80), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), hf(tokens).logits, atol=1e-4, rtol=0)
