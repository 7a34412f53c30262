"""Reading Hugging Face configs: what minillm cannot run is refused with the reason, never
loaded to compute something else."""

from __future__ import annotations

import pytest

from minillm.config import ModelConfig
from minillm.testing import TINY

MISTRAL = {"model_type": "mistral", "vocab_size": 256, "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "max_position_embeddings": 512, "rope_theta": 1e4}


def test_a_sliding_window_is_read_not_silently_ignored():
    """Past its window a Mistral layer attends to fewer tokens than full attention: every
    layer gets the window (tests/test_model_families.py checks the logits)."""
    config = ModelConfig.from_hf({**MISTRAL, "sliding_window": 128})
    assert config.sliding_window == 128
    assert {kind.window for kind in config.attention_kinds()} == {128}


@pytest.mark.parametrize("window", [None, 512, 4096])
def test_a_window_that_covers_the_whole_context_changes_nothing(window):
    config = ModelConfig.from_hf({**MISTRAL, "sliding_window": window})
    assert config.num_kv_heads == 2 and config.max_position_embeddings == 512
    assert not config.has_windows()


def test_a_llama_config_round_trips():
    config = ModelConfig(**TINY)
    assert ModelConfig.from_hf(config.to_hf()) == config


# Gemma 3 270M's config.json as published (the older layout: rope bases at the top level,
# no layer_types, tie_word_embeddings left to its default)
GEMMA3_270M = {"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
               "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
               "num_key_value_heads": 1, "head_dim": 256, "max_position_embeddings": 32768,
               "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
               "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
               "rope_scaling": None, "sliding_window": 512, "_sliding_window_pattern": 6,
               "attn_logit_softcapping": None, "final_logit_softcapping": None}


def test_gemma3_270m_reads_as_local_layers_between_global_ones():
    config = ModelConfig.from_hf(GEMMA3_270M)
    kinds = config.attention_kinds()
    assert [kind.window for kind in kinds] == ([512] * 5 + [None]) * 3
    assert all(kind.local_rope == (kind.window is not None) for kind in kinds)
    assert (config.rope_theta, config.rope_local_theta) == (1e6, 1e4)
    assert config.tie_word_embeddings and config.qk_norm and config.gemma_norms
    assert config.embedding_scale == 640 ** 0.5 and config.hidden_act == "gelu_pytorch_tanh"
    assert 268e6 < config.num_parameters() < 268.2e6  # transformers: 268.1 M
    assert ModelConfig.from_hf(config.to_hf()) == config


QWEN2 = {**MISTRAL, "model_type": "qwen2", "num_hidden_layers": 4, "sliding_window": 128,
         "max_window_layers": 2}


def test_qwen_windows_apply_only_when_asked_and_from_max_window_layers_up():
    assert not ModelConfig.from_hf(QWEN2).has_windows()  # use_sliding_window defaults off
    config = ModelConfig.from_hf({**QWEN2, "use_sliding_window": True})
    assert [kind.window for kind in config.attention_kinds()] == [None, None, 128, 128]
    assert config.qkv_bias and not config.attention_bias


def test_what_minillm_does_not_compute_is_refused():
    with pytest.raises(ValueError, match="soft-capping"):
        ModelConfig.from_hf({**GEMMA3_270M, "final_logit_softcapping": 30.0})
    with pytest.raises(ValueError, match="not a causal decoder"):
        ModelConfig.from_hf({**GEMMA3_270M, "use_bidirectional_attention": True})
    with pytest.raises(ValueError, match="activation 'relu'"):
        ModelConfig.from_hf({**MISTRAL, "hidden_act": "relu"})
