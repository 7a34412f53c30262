"""Native decoding (one C++ call per step) computes what the Python model computes: the same
logits within float32 rounding at every step, the same cache contents, the same tokens."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import tiny_pair
from minillm.generate import generate
from minillm.kv_cache import StaticKVCache
from minillm.native_decode import check_native_decode, native_decode
from minillm.quant import QuantScheme, quantize_model
from minillm.quant.embedding import compact_embedding
from minillm.quant.int8_activations import to_int8_activations

INT8 = QuantScheme(8, symmetric=True, group_size=None)
Q4_1 = QuantScheme(4, symmetric=False, group_size=32, float_zero=True)


def w8a8(model, scheme=INT8):
    """Per-channel int8 weights (or ``scheme``'s) and an int8 embedding, int8 activations,
    decoding over a static cache (as the native model does, so both attend over the same
    slots)."""
    model = to_int8_activations(compact_embedding(quantize_model(model, "rtn", scheme), "int8"))
    model.cache_class = StaticKVCache
    return model


def teacher_forced_logits(model, prompt, continuation, slots=64):
    """Logits of every step when ``continuation`` is fed one token at a time, and the cache."""
    cache = StaticKVCache(model.config, 1, slots)
    with torch.no_grad():
        logits = [model(torch.tensor([prompt]), cache)[:, -1]]
        logits += [model(torch.tensor([[token]]), cache)[:, -1] for token in continuation]
    return torch.cat(logits), cache


@pytest.mark.parametrize("scheme", [INT8, Q4_1], ids=["W8A8", "W4A8"])
@pytest.mark.parametrize("overrides", [{}, {"hidden_size": 96, "intermediate_size": 160,
                                            "num_heads": 6, "num_kv_heads": 3}],
                         ids=["VNNI widths, GQA 4:2", "plain-loop widths, GQA 6:3"])
def test_every_step_matches_the_python_model(tmp_path, overrides, scheme):
    model = w8a8(tiny_pair(tmp_path, tie_word_embeddings=True, **overrides)[0], scheme)
    native = native_decode(copy.deepcopy(model))
    prompt, continuation = [3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4] * 3
    expected, expected_cache = teacher_forced_logits(model, prompt, continuation)
    logits, cache = teacher_forced_logits(native, prompt, continuation)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(cache.keys + cache.values, expected_cache.keys + expected_cache.values,
                            strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    assert int(cache.next_step) == len(prompt) + len(continuation)


@pytest.mark.parametrize("scheme", [INT8, Q4_1], ids=["W8A8", "W4A8"])
def test_greedy_tokens_equal_the_python_models(tmp_path, scheme):
    model = w8a8(tiny_pair(tmp_path, tie_word_embeddings=True)[0], scheme)
    native = native_decode(copy.deepcopy(model))
    prompt = [7, 100, 42, 3]
    with torch.no_grad():
        assert generate(native, prompt, 24) == generate(model, prompt, 24)


def test_batches_and_padding_run_the_python_model(tmp_path):
    model = w8a8(tiny_pair(tmp_path, tie_word_embeddings=True)[0])
    native = native_decode(copy.deepcopy(model))
    prompts = [[5, 17, 99, 3], [8, 2]]
    with torch.no_grad():
        assert generate(native, prompts, 6) == generate(model, prompts, 6)


def test_a_position_past_the_cache_is_an_error(tmp_path):
    native = native_decode(w8a8(tiny_pair(tmp_path, tie_word_embeddings=True,
                                          max_position_embeddings=1024)[0]))
    cache = StaticKVCache(native.config, 1, 1)
    cache.advance(cache.max_len)
    with pytest.raises(RuntimeError, match="outside the cache"), torch.no_grad():
        native(torch.tensor([[1]]), cache)


def test_models_without_int8_activations_are_refused_with_what_to_do(tmp_path):
    model, _ = tiny_pair(tmp_path)
    with pytest.raises(ValueError, match="to_int8_activations"):
        check_native_decode(model)
    with pytest.raises(ValueError, match="to_int8_activations"):
        native_decode(compact_embedding(quantize_model(model, "rtn", INT8), "int8"))


@pytest.mark.smollm2
@pytest.mark.slow
@pytest.mark.parametrize("scheme", [INT8, Q4_1], ids=["W8A8", "W4A8"])
def test_smollm2_native_decoding_follows_the_python_model(smollm2, tokenizer, scheme):
    """Teacher-forced on the Python model's own 32 greedy tokens, the native step picks the
    same token at (nearly) every step, and a typical step's logits agree to a few percent.

    Not closer: SmolLM2's activations have outliers, so one activation that a last-bit
    difference (another summation order) moves to the next int8 code can move a step's
    logits by several percent. With ~10^5 roundings per step that happens at most steps
    (measured for W8A8: median relative error of a step's logits 5.5% native vs eager, 6.0%
    compiled vs eager). The tiny-model tests above check the arithmetic to 1e-4."""
    model = w8a8(copy.deepcopy(smollm2), scheme)
    native = native_decode(copy.deepcopy(model))
    prompt = tokenizer.chat_prompt("What is a KV cache?")
    with torch.no_grad():
        expected_tokens = generate(model, prompt, 32)[0]
        expected, _ = teacher_forced_logits(model, prompt, expected_tokens, slots=256)
        logits, _ = teacher_forced_logits(native, prompt, expected_tokens, slots=256)
    errors = (logits - expected).norm(dim=-1) / expected.norm(dim=-1)
    agreement = (logits.argmax(-1) == expected.argmax(-1)).float().mean()
    print(f"median relative error {errors.median():.3f}, greedy agreement {agreement:.2f}")
    assert errors.median() < 0.15 and agreement >= 0.9
