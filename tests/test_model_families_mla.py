"""DeepSeek-V3 (multi-head latent attention, sigmoid-routed experts with a shared expert,
a dense first layer) through minillm's one decoder: a tiny random model built with
transformers' own classes gives Hugging Face's logits and greedy tokens, in the dense loop
(batched as alone) and in the engine (alone, batched, chunked, preempted, a short pool),
from caches of (kv_lora_rank + qk_rope_head_dim) numbers per token and layer."""

from __future__ import annotations

import pytest
import torch
from family_parity import MATRIX, MAX_TOKENS, PROMPTS, engine, hf_greedy, saved_pair

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


@pytest.fixture(scope="module")
def expected(pair) -> list[list[int]]:
    return [hf_greedy(pair[1], prompt) for prompt in PROMPTS]


def test_greedy_tokens_equal_hugging_faces_in_the_dense_loop_and_the_engine(pair, expected):
    ours = pair[0]
    assert len({t for tokens in expected for t in tokens}) > 8  # the tokens vary
    params = SamplingParams(max_tokens=MAX_TOKENS)
    assert [generate(ours, p, MAX_TOKENS, params)[0] for p in PROMPTS] == expected
    assert generate(ours, PROMPTS, MAX_TOKENS, params) == expected  # left-padded batch
    alone = [engine(ours).generate([p], params, progress=False)[0].tokens for p in PROMPTS]
    assert alone == expected


@pytest.mark.parametrize("config", MATRIX.values(), ids=MATRIX.keys())
def test_the_engine_matrix_equals_each_request_alone(pair, expected, config):
    llm = engine(pair[0], **config)
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS), progress=False)
    assert [o.tokens for o in outputs] == expected
    assert llm.free_blocks() == llm.blocks.num_blocks


def test_the_latent_cache_holds_rank_plus_rope_numbers_per_token_and_layer(pair):
    ours = pair[0]
    cache = make_cache(ours, 1, 64)
    assert isinstance(cache, LatentKVCache)
    with torch.no_grad():
        ours(torch.tensor([PROMPTS[2]]), cache=cache)
    mla, layers = ours.config.mla, ours.config.num_layers
    per_token = (mla["kv_lora_rank"] + mla["qk_rope_head_dim"]) * 4 * layers  # fp32
    assert cache.nbytes() == per_token * len(PROMPTS[2]) == 24 * 4 * 3 * 20
    llm = engine(ours)  # blocks of 4 tokens
    assert llm.core.runner.cache.bytes_per_block() == per_token * 4


def test_the_config_counts_the_parameters(pair):
    ours = pair[0]
    assert ours.config.num_parameters() == sum(p.numel() for p in ours.parameters())


def test_what_does_not_run_it_refuses_clearly(pair, tmp_path):
    ours = pair[0]
    with pytest.raises(ValueError, match="latent pool is float"):
        LLM(ours, block_size=4, num_blocks=16, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="saving a deepseek_v3 model.*not implemented"):
        save_model(ours, tmp_path)
