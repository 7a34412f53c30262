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
