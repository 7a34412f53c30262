"""KV-head conversions: expanding to MHA is exact; pooling gives a valid, smaller model."""

from __future__ import annotations

import copy

import pytest
import torch

from minillm.checkpoint import load_model, save_model
from minillm.gqa import expand_kv_heads, pool_kv_heads, with_kv_heads
from minillm.kv_cache import kv_cache_bytes
from minillm.testing import tiny_pair


def test_expand_to_mha_gives_identical_logits(tmp_path):
    model, _ = tiny_pair(tmp_path)  # 4 query heads, 2 KV heads
    mha = expand_kv_heads(model)
    assert mha.config.num_kv_heads == 4 and model.config.num_kv_heads == 2
    ids = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(mha(ids), model(ids), atol=1e-5, rtol=1e-5)
    assert kv_cache_bytes(mha.config, 100) == 2 * kv_cache_bytes(model.config, 100)


def test_pooled_model_is_a_valid_llama_checkpoint(tmp_path):
    """Save the pooled model, load it in Hugging Face: same logits (so the conversion is
    a real MQA Llama, not something only minillm can run)."""
    from transformers import LlamaForCausalLM

    model, _ = tiny_pair(tmp_path / "gqa")
    mqa = pool_kv_heads(model, 1)
    save_model(mqa, tmp_path / "mqa")
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "mqa").eval()
    assert hf.config.num_key_value_heads == 1
    ids = torch.arange(40)[None]
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, mqa(ids), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(mqa(ids), model(ids), atol=1e-3)  # pooling loses something
    reloaded = load_model(tmp_path / "mqa")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids), mqa(ids))


def test_pooling_takes_the_mean_of_each_group(tmp_path):
    model, _ = tiny_pair(tmp_path)
    pooled = pool_kv_heads(model, 1)
    w = model.layers[0].attn.k_proj.weight.view(2, 16, -1)
    torch.testing.assert_close(pooled.layers[0].attn.k_proj.weight, w.mean(0))


def test_impossible_head_counts_raise(tmp_path):
    model, _ = tiny_pair(tmp_path)  # 4 query heads, 2 KV heads
    with pytest.raises(ValueError, match="cannot go from 2 to 3"):
        with_kv_heads(model, 3)
    with pytest.raises(ValueError, match="expand_kv_heads"):
        pool_kv_heads(model, 4)


@pytest.mark.smollm2
def test_smollm2_expanded_to_mha_is_exact(smollm2, tokenizer):
    mha = expand_kv_heads(smollm2)
    ids = torch.tensor([tokenizer.encode("The capital of France is Paris, and")])
    with torch.no_grad():
        torch.testing.assert_close(mha(ids), smollm2(ids), atol=1e-4, rtol=1e-4)


def test_merging_copies_of_heads_gives_back_the_original(tmp_path):
    """MHA made of copied heads, merged back to 2 K/V heads with the PCA merge: the copies are
    one head, so nothing is lost (this checks every index of the key/query/value bookkeeping)."""
    from minillm.gqa import merge_kv_heads

    model, _ = tiny_pair(tmp_path)
    text = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    merged = merge_kv_heads(expand_kv_heads(model), 2, text)
    assert merged.config.num_kv_heads == 2
    ids = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids), model(ids), atol=1e-4, rtol=1e-4)


def test_merging_keeps_more_than_mean_pooling(tmp_path):
    from minillm.gqa import merge_kv_heads

    model, _ = tiny_pair(tmp_path)
    generator = torch.Generator().manual_seed(0)
    text = torch.randint(0, 256, (16, 64), generator=generator)
    held_out = torch.randint(0, 256, (4, 64), generator=generator)
    merged, pooled = merge_kv_heads(model, 1, text), pool_kv_heads(model, 1)
    assert merged.config.num_kv_heads == 1
    with torch.no_grad():
        reference = model(held_out)
        merged_error = (merged(held_out) - reference).pow(2).mean()
        assert merged_error < 0.5 * (pooled(held_out) - reference).pow(2).mean()


def test_fitting_pooled_kv_projections_moves_the_model_back_towards_the_original(tmp_path):
    from minillm.gqa import fit_kv_projections

    model, _ = tiny_pair(tmp_path)
    mqa = pool_kv_heads(model, 1)
    fitted = copy.deepcopy(mqa)
    generator = torch.Generator().manual_seed(0)
    train = torch.randint(0, 256, (16, 64), generator=generator)
    errors = fit_kv_projections(fitted, model, train, steps=30, progress=False)

    assert len(errors) == model.config.num_layers
    assert all(e.after < 0.9 * e.before for e in errors)
    changed = {name for name, p in fitted.named_parameters()
               if not torch.equal(p, mqa.get_parameter(name))}
    assert changed == {f"layers.{i}.attn.{proj}.weight" for i in range(2)
                       for proj in ("k_proj", "v_proj")}
    assert not any(p.requires_grad for p in fitted.parameters())
    held_out = torch.randint(0, 256, (4, 64), generator=generator)  # text it was not fitted on
    with torch.no_grad():
        reference = model(held_out)
        fitted_error = (fitted(held_out) - reference).pow(2).mean()
        assert fitted_error < (mqa(held_out) - reference).pow(2).mean()
    assert fitted.config.num_kv_heads == 1  # still MQA: a third of the cache
