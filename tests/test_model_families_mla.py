"""DeepSeek-V3 (multi-head latent attention, sigmoid-routed experts with a shared expert,
a dense first layer) through minillm's one decoder: the checks of
:class:`family_parity.FamilyChecks` (Hugging Face's logits and greedy tokens in the dense
loop and the engine, the engine matrix, prefix hits, n = 2, a checkpoint transformers
loads back), a left-padded batch in the dense loop, and caches of
(kv_lora_rank + qk_rope_head_dim) numbers per token and layer: the dense loop's and the
engine's latent pool."""

from __future__ import annotations

import pytest
import torch
from family_parity import MAX_TOKENS, PROMPTS, FamilyChecks, engine, saved_pair

from minillm.mla import LatentKVCache
from minillm.model import Transformer
from minillm.reference import generate, make_cache
from minillm.sampling import SamplingParams
from minillm.serve import LLM


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Transformer, torch.nn.Module]:
    return saved_pair("deepseek_v3", tmp_path_factory.mktemp("deepseek_v3"))


class TestLatentAttentionFamily(FamilyChecks):
    def test_a_left_padded_batch_in_the_dense_loop_equals_each_prompt_alone(self, pair,
                                                                           expected):
        params = SamplingParams(max_tokens=MAX_TOKENS)
        assert generate(pair[0], PROMPTS, MAX_TOKENS, params) == expected


def test_the_caches_hold_rank_plus_rope_numbers_per_token_and_layer(pair):
    ours = pair[0]
    cache = make_cache(ours, 1, 64)
    assert isinstance(cache, LatentKVCache)
    with torch.no_grad():
        ours(torch.tensor([PROMPTS[2]]), cache=cache)
    mla, layers = ours.config.mla, ours.config.num_layers
    per_token = (mla["kv_lora_rank"] + mla["qk_rope_head_dim"]) * 4 * layers  # fp32
    assert cache.nbytes() == per_token * len(PROMPTS[2]) == (16 + 8) * 4 * 3 * 20
    llm = engine(ours)  # blocks of 4 tokens
    assert llm.core.runner.cache.bytes_per_block() == per_token * 4


def test_what_does_not_read_a_latent_pool_refuses_it(pair):
    with pytest.raises(ValueError, match="latent pool is float"):
        LLM(pair[0], block_size=4, num_blocks=16, kv_cache_dtype="int8")
