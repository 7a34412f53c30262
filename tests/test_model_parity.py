"""minillm's model against Hugging Face transformers' LlamaForCausalLM, the reference."""

from __future__ import annotations

import pytest
import torch

from minillm.generate import generate
from minillm.testing import tiny_pair

SENTENCE = ("The Eiffel Tower was built for the 1889 World's Fair in Paris and was, for forty "
            "years, the tallest man-made structure in the world.")


@pytest.mark.parametrize("overrides", [
    {},  # GQA 4:2, untied
    {"num_kv_heads": 4},  # MHA
    {"num_kv_heads": 1, "tie_word_embeddings": True},  # MQA, tied
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    {"attention_bias": True, "mlp_bias": True},
])
def test_tiny_logits_match_hf(tmp_path, overrides):
    ours, hf = tiny_pair(tmp_path, **overrides)
    ids = torch.randint(0, 256, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)


def test_sharded_checkpoint_loads(tmp_path):
    from minillm.checkpoint import load_model

    _, hf = tiny_pair(tmp_path / "single")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    ours = load_model(tmp_path / "sharded")
    ids = torch.arange(20)[None]
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["naive", "sdpa"])
def test_tiny_backends_agree(tiny_models, backend):
    ours, hf = tiny_models
    ours.set_attention_backend(backend)
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)


def test_tiny_greedy_matches_hf_generate(tiny_models):
    ours, hf = tiny_models
    prompt = [5, 17, 99, 3, 42]
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert generate(ours, prompt, 24) == [expected]


@pytest.mark.smollm2
def test_smollm2_logits_match_hf(smollm2, smollm2_hf, tokenizer):
    ids = torch.tensor([tokenizer.encode(SENTENCE)])
    with torch.no_grad():
        torch.testing.assert_close(smollm2(ids), smollm2_hf(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.smollm2
def test_smollm2_greedy_matches_hf_for_32_tokens(smollm2, smollm2_hf, tokenizer):
    prompt = tokenizer.chat_prompt("Name three facts about the Moon.")
    ids = torch.tensor([prompt])
    with torch.no_grad():  # an explicit mask: the pad id (<|im_end|>) also occurs in the prompt
        expected = smollm2_hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                                       do_sample=False, eos_token_id=None,
                                       pad_token_id=tokenizer.pad_id)[0, len(prompt):].tolist()
    assert generate(smollm2, prompt, 32) == [expected]
