"""Parameter and KV-cache counts read from configs equal the instantiated Hugging Face models."""

from __future__ import annotations

import pytest
import torch

from minillm.architecture_costs import (
    kv_bytes,
    kv_numbers_per_token,
    layer_windows,
    parameter_counts,
)
from minillm.published_configs import PUBLISHED_CONFIGS

transformers = pytest.importorskip("transformers")

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
TINY = {
    "llama": dict(COMMON),
    "mistral": dict(COMMON, sliding_window=8),
    "qwen2": dict(COMMON),
    "qwen3": dict(COMMON, head_dim=12),
    "gemma3_text": dict(COMMON, head_dim=16, sliding_window=8, sliding_window_pattern=2),
    "olmoe": dict(COMMON, num_experts=6, num_experts_per_tok=2),
    "qwen3_moe": dict(COMMON, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=20,
                      decoder_sparse_step=2, mlp_only_layers=[2]),
    "mixtral": dict(COMMON, num_local_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(COMMON, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=12,
                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                        moe_intermediate_size=10, first_k_dense_replace=1, n_group=2,
                        topk_group=1),
}


def _hf_model(family: str):
    config = transformers.AutoConfig.for_model(family, **TINY[family])
    with torch.device("meta"):
        return config, transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("family", sorted(TINY))
def test_total_parameters_equal_the_hugging_face_model(family):
    config, model = _hf_model(family)
    expected = sum(p.numel() for p in model.parameters())  # parameters() skips tied duplicates
    expected += sum(b.numel() for name, b in model.named_buffers()
                    if name.endswith("e_score_correction_bias"))
    counts = parameter_counts(config.to_dict())
    assert counts.total == expected
    assert counts.active <= counts.total


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text"])
def test_dense_models_read_every_parameter(family):
    counts = parameter_counts(_hf_model(family)[0].to_dict())
    assert counts.active == counts.total


def test_moe_active_parameters_count_top_k_experts():
    hf = _hf_model("qwen3_moe")[0].to_dict()  # layers 1 and 3 are sparse (step 2, 2 dense)
    counts = parameter_counts(hf)
    unused_experts_per_sparse_layer = (6 - 2) * 3 * 32 * 20
    assert counts.total - counts.active == 2 * unused_experts_per_sparse_layer


def test_windows_and_kv_bytes():
    gemma = _hf_model("gemma3_text")[0].to_dict()
    assert layer_windows(gemma) == [8, None, 8, None]
    assert kv_numbers_per_token(gemma) == 2 * 2 * 16
    assert kv_bytes(gemma, context=100, bytes_per_value=4) == 2 * 2 * 16 * 4 * (8 + 100) * 2
    deepseek = _hf_model("deepseek_v3")[0].to_dict()
    assert kv_numbers_per_token(deepseek) == 12 + 4
    assert layer_windows(_hf_model("qwen3_moe")[0].to_dict()) == [None] * 4  # window off


@pytest.mark.parametrize("name, total, active", [
    ("Llama-2-7B", 6.74e9, 6.74e9), ("Mistral-7B", 7.24e9, 7.24e9),
    ("Gemma-3-270M", 268.1e6, 268.1e6), ("Qwen3-30B-A3B", 30.5e9, 3.3e9),
    ("DeepSeek-V3", 671e9, 37e9)])
def test_published_totals(name, total, active):
    """The totals their model cards state (DeepSeek-V3: its paper, without the 14 B
    multi-token-prediction module; Gemma 3 270M: the instantiated transformers model)."""
    counts = parameter_counts(PUBLISHED_CONFIGS[name])
    assert counts.total == pytest.approx(total, rel=0.003)
    assert counts.active == pytest.approx(active, rel=0.03)
    tied = PUBLISHED_CONFIGS[name].get("tie_word_embeddings", False)
    assert counts.read_per_token == counts.active - (0 if tied else counts.embedding)
