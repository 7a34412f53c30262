"""Multi-head latent attention: the absorbed form equals the expanded one, both equal Hugging
Face's DeepseekV3Attention, and the latent cache holds the numbers the formula says."""

from __future__ import annotations

import pytest
import torch

from minillm.mla import LatentAttention, LatentCache, LatentShape

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds  # noqa: E402

HIDDEN = 48


def _hf_config(q_lora_rank, rope_interleave):
    return transformers.DeepseekV3Config(
        hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank,
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=10,
        rope_interleave=rope_interleave, max_position_embeddings=64, vocab_size=32,
        num_hidden_layers=1, intermediate_size=32, moe_intermediate_size=16)


def _causal(queries: int, keys: int) -> torch.Tensor:
    q = torch.arange(keys - queries, keys)[:, None]
    return (torch.arange(keys)[None] <= q)[None, None]


def _rope_tables(config, positions):
    cos, sin = hf_ds.DeepseekV3RotaryEmbedding(config)(torch.zeros(1), positions[None])
    return cos[:, None], sin[:, None]


@pytest.mark.parametrize("q_lora_rank", [None, 12])
@pytest.mark.parametrize("rope_interleave", [True, False])
def test_equals_hugging_face_deepseek_v3_attention(q_lora_rank, rope_interleave):
    torch.manual_seed(0)
    config = _hf_config(q_lora_rank, rope_interleave)
    config._attn_implementation = "eager"
    reference = hf_ds.DeepseekV3Attention(config, layer_idx=0).eval()
    for p in reference.parameters():  # HF initialises norms to ones: make them matter
        p.data.normal_(0, 0.3)
    ours = LatentAttention(HIDDEN, LatentShape.from_hf(config.to_dict()),
                           softmax_scale=reference.scaling).eval()
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(2, 7, HIDDEN)
    cos, sin = _rope_tables(config, torch.arange(7))
    mask = _causal(7, 7)
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    with torch.no_grad():
        expected = reference(x, (cos[:, 0], sin[:, 0]), additive)[0]
        for absorbed in (True, False):
            ours.absorbed = absorbed
            torch.testing.assert_close(ours(x, cos, sin, mask), expected, atol=1e-5, rtol=1e-5)


def test_absorbed_equals_expanded_in_float64_with_a_cache():
    torch.manual_seed(1)
    shape = LatentShape(num_heads=3, kv_lora_rank=20, qk_nope_head_dim=6, qk_rope_head_dim=4,
                        v_head_dim=5, q_lora_rank=16)
    layer = LatentAttention(32, shape).double().eval()
    config = _hf_config(16, True)
    x = torch.randn(1, 9, 32, dtype=torch.float64)
    cos, sin = (t.double() for t in _rope_tables(config, torch.arange(9)))
    with torch.no_grad():
        whole = layer(x, cos[..., :4], sin[..., :4], _causal(9, 9))
        cache = LatentCache()
        steps = [layer(x[:, :5], cos[:, :, :5, :4], sin[:, :, :5, :4], _causal(5, 5), cache)]
        for t in range(5, 9):  # decode one token at a time, absorbed, from the latent cache
            steps.append(layer(x[:, t:t + 1], cos[:, :, t:t + 1, :4], sin[:, :, t:t + 1, :4],
                               None, cache))
        layer.absorbed = False
        expanded = layer(x, cos[..., :4], sin[..., :4], _causal(9, 9))
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(expanded, whole, atol=1e-12, rtol=1e-12)


def test_latent_cache_holds_rank_plus_rope_numbers_per_token():
    shape = LatentShape(num_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=6,
                        v_head_dim=10)
    layer, cache = LatentAttention(HIDDEN, shape).eval(), LatentCache()
    cos, sin = _rope_tables(_hf_config(None, True), torch.arange(11))
    with torch.no_grad():
        layer(torch.randn(3, 11, HIDDEN), cos, sin, _causal(11, 11), cache)
    assert cache.nbytes == 3 * 11 * (16 + 6) * 4 == 3 * 11 * shape.cached_numbers_per_token * 4
    assert shape.expanded_numbers_per_token == 4 * (14 + 10)


def test_deepseek_v3_numbers():
    """DeepSeek-V3's config (kv_lora_rank 512, rope 64, 128 heads of 128 + 64 / 128)."""
    v3 = LatentShape(num_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                     v_head_dim=128, q_lora_rank=1536)
    assert v3.cached_numbers_per_token == 576
    assert v3.expanded_numbers_per_token == 128 * (192 + 128)


def test_softmax_scale_follows_yarn_like_hugging_face():
    hf = {"num_attention_heads": 4, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
          "qk_rope_head_dim": 6, "v_head_dim": 10,
          "rope_parameters": {"rope_type": "yarn", "factor": 40.0, "mscale_all_dim": 1.0,
                              "rope_theta": 10000.0}}
    shape = LatentShape.from_hf(hf)
    assert shape.softmax_scale(hf["rope_parameters"]) == pytest.approx(
        hf_ds.yarn_apply_mscale(hf["rope_parameters"], 14 ** -0.5))
    assert shape.softmax_scale(None) == pytest.approx(14 ** -0.5)
