"""DeepSeek-V3 (multi-head latent attention, sigmoid-routed experts with a shared expert,
a dense first layer) through minillm's one decoder, in the dense loop: a tiny random model
built with transformers' own classes gives Hugging Face's logits and greedy tokens, batched
as alone, from a cache of (kv_lora_rank + qk_rope_head_dim) numbers per token and layer.
The paged engine has no latent pool yet, and says so."""

from __future__ import annotations

import pytest
import torch
from family_parity import MAX_TOKENS, PROMPTS, hf_greedy, saved_pair

from minillm.checkpoint import save_model
from minillm.mla import LatentKVCache
from minillm.model import Transformer
from minillm.reference import generate, make_cache
from minillm.sampling import SamplingParams
from minillm.serve import LLM


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Transformer, torch.nn.Module]:
    return saved_pair("deepseek_v3", tmp_path_factory.mktemp("deepseek_v3"))


def test_teacher_forced_logits_equal_hugging_faces(pair):
    ours, hf = pair
    tokens = torch.tensor([PROMPTS[0] + PROMPTS[2], PROMPTS[2] + PROMPTS[0]])
    with torch.no_grad():
        assert torch.allclose(ours(tokens), hf(tokens).logits, atol=1e-4, rtol=0)


def test_greedy_tokens_equal_hugging_faces_alone_and_batched(pair):
    ours, hf = pair
    expected = [hf_greedy(hf, prompt) for prompt in PROMPTS]
    assert len({t for tokens in expected for t in tokens}) > 8  # the tokens vary
    params = SamplingParams(max_tokens=MAX_TOKENS)
    assert [generate(ours, p, MAX_TOKENS, params)[0] for p in PROMPTS] == expected
    assert generate(ours, PROMPTS, MAX_TOKENS, params) == expected  # left-padded batch


def test_the_latent_cache_holds_rank_plus_rope_numbers_per_token_and_layer(pair):
    ours = pair[0]
    cache = make_cache(ours, 1, 64)
    assert isinstance(cache, LatentKVCache)
    with torch.no_grad():
        ours(torch.tensor([PROMPTS[2]]), cache=cache)
    mla, layers = ours.config.mla, ours.config.num_layers
    per_token = (mla["kv_lora_rank"] + mla["qk_rope_head_dim"]) * 4 * layers  # fp32
    assert cache.nbytes() == per_token * len(PROMPTS[2]) == 24 * 4 * 3 * 20


def test_the_config_counts_the_parameters(pair):
    ours = pair[0]
    assert ours.config.num_parameters() == sum(p.numel() for p in ours.parameters())


def test_the_engine_and_saving_refuse_it_clearly(pair, tmp_path):
    ours = pair[0]
    with pytest.raises(ValueError, match="latent.*reference.generate"):
        LLM(ours, block_size=4, num_blocks=16)
    with pytest.raises(ValueError, match="saving a deepseek_v3 model.*not implemented"):
        save_model(ours, tmp_path)
