"""Generation, both ways: the course's dense reference loop (cached == uncached, batched
with padding == one by one, sliding window) and the engine's ``generate`` (equal to the
reference under every sampling option and executor), streaming, stop tokens, errors."""

from __future__ import annotations

import pytest
import torch

from minillm import reference
from minillm.generate import generate, generate_tokens
from minillm.kv_cache import KVCache, SlidingWindowKVCache, kv_cache_bytes
from minillm.reference import pad_left
from minillm.sampling import SamplingParams
from minillm.testing import tiny_pair

GENERATES = {"reference loop": reference.generate, "engine": generate}

PROMPTS = [[5, 17, 99, 3, 42, 7, 8], [1, 2], [200, 100, 50, 25]]


@pytest.fixture
def tiny(tmp_path):
    return tiny_pair(tmp_path)[0]


def test_cached_equals_uncached(tiny):
    assert reference.generate(tiny, PROMPTS[0], 30) == \
        reference.generate(tiny, PROMPTS[0], 30, use_cache=False)


SAMPLING_OPTIONS = {
    "greedy": SamplingParams(),
    "repetition penalty": SamplingParams(repetition_penalty=5.0),
    "temperature": SamplingParams(temperature=1.3, seed=11),
    "top-k": SamplingParams(temperature=1.0, top_k=5, seed=12),
    "top-p": SamplingParams(temperature=1.0, top_p=0.7, seed=13),
    "everything": SamplingParams(temperature=0.9, top_k=20, top_p=0.9, repetition_penalty=1.5,
                                 seed=14),
}


@pytest.mark.parametrize("params", SAMPLING_OPTIONS.values(), ids=SAMPLING_OPTIONS.keys())
@pytest.mark.parametrize("pad_id", [0, 15, 30])  # 15, 30: penalised as seen tokens, once
def test_batched_with_padding_equals_one_by_one(tiny, params, pad_id):
    batched = reference.generate(tiny, PROMPTS, 20, params, pad_id=pad_id)
    assert batched == [reference.generate(tiny, p, 20, params, pad_id=pad_id)[0]
                       for p in PROMPTS]


@pytest.mark.parametrize("params", SAMPLING_OPTIONS.values(), ids=SAMPLING_OPTIONS.keys())
@pytest.mark.parametrize("executor", ["eager", "native", "auto"])
def test_the_engine_generates_the_reference_tokens(tiny, params, executor):
    expected = reference.generate(tiny, PROMPTS, 20, params)
    assert generate(tiny, PROMPTS, 20, params, executor=executor) == expected
    assert [generate(tiny, p, 20, params, executor=executor)[0] for p in PROMPTS] == expected


def test_repetition_penalty_ignores_padding():
    """A padding id that the real tokens never contain is not penalised."""
    from minillm.sampling import apply_repetition_penalty

    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5]])
    previous, valid = torch.tensor([[3, 3, 1]]), torch.tensor([[False, False, True]])
    penalised = apply_repetition_penalty(logits, previous, 2.0, valid)
    assert penalised.tolist() == [[2.0, 0.5, -1.0, 0.5]]


def test_batched_uncached_equals_one_by_one(tiny):
    assert reference.generate(tiny, PROMPTS, 12, use_cache=False) == \
        [reference.generate(tiny, p, 12)[0] for p in PROMPTS]


def test_padded_logits_match_unpadded(tiny):
    ids, mask = pad_left(PROMPTS, pad_id=0)
    with torch.no_grad():
        batched = tiny(ids, attention_mask=mask)[:, -1]
        for row, prompt in enumerate(PROMPTS):
            alone = tiny(torch.tensor([prompt]))[0, -1]
            torch.testing.assert_close(batched[row], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("run", GENERATES.values(), ids=GENERATES.keys())
def test_sampled_generation_is_reproducible_with_a_seed(tiny, run):
    params = SamplingParams(temperature=1.0, top_k=50, seed=123)
    first = run(tiny, PROMPTS, 16, params)
    assert first == run(tiny, PROMPTS, 16, params)
    assert first != run(tiny, PROMPTS, 16, SamplingParams(temperature=1.0, top_k=50, seed=7))


def test_sampled_cached_equals_uncached(tiny):
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    assert reference.generate(tiny, PROMPTS[0], 16, params) == \
        reference.generate(tiny, PROMPTS[0], 16, params, use_cache=False)


@pytest.mark.parametrize("module", [reference, None], ids=["reference loop", "engine"])
def test_streaming_yields_the_same_tokens(tiny, module):
    run, stream = (module.generate, module.generate_tokens) if module else \
        (generate, generate_tokens)
    streamed = [t.item() for t in stream(tiny, PROMPTS[0], 10)]
    seen = []
    assert run(tiny, PROMPTS[0], 10, on_token=lambda t: seen.append(t.item())) == [streamed]
    assert seen == streamed


@pytest.mark.parametrize("run", GENERATES.values(), ids=GENERATES.keys())
def test_stops_at_stop_token(tiny, run):
    free = run(tiny, PROMPTS[0], 20)[0]
    stop = free[5]
    first = free.index(stop)
    assert run(tiny, PROMPTS[0], 20, stop_tokens=[stop]) == [free[:first + 1]]


@pytest.mark.parametrize("stream", [reference.generate_tokens, generate_tokens],
                         ids=GENERATES.keys())
def test_stopped_rows_are_padded_while_others_continue(tiny, stream):
    free = reference.generate(tiny, PROMPTS, 10)
    stop = free[0][2]
    pad = 255
    steps = [t.tolist() for t in stream(tiny, PROMPTS, 10, stop_tokens=[stop], pad_id=pad)]
    row0, others = [s[0] for s in steps], [s[1:] for s in steps]
    cut = row0.index(stop) + 1
    assert cut < 10 and all(t == pad for t in row0[cut:])
    expected_others = [list(row[1:]) for row in zip(*free, strict=True)]
    assert others == expected_others[:len(others)]  # the other rows go on unchanged


def test_sliding_window_larger_than_sequence_changes_nothing(tiny):
    assert reference.generate(tiny, PROMPTS[0], 20, window=64) == \
        reference.generate(tiny, PROMPTS[0], 20)


def test_sliding_window_cache_equals_windowed_full_attention(tiny):
    """Decoding with a ring buffer of 8 steps == recomputing with an 8-token attention window."""
    window, prompt = 8, torch.tensor([PROMPTS[0] + PROMPTS[2]])  # 11 tokens > window
    with torch.no_grad():
        full = tiny(prompt, SlidingWindowKVCache(tiny.config, 1, window))
        ring = SlidingWindowKVCache(tiny.config, 1, window)
        stepwise = [tiny(prompt[:, :3], ring)]
        stepwise += [tiny(prompt[:, t:t + 1], ring) for t in range(3, prompt.shape[1])]
    torch.testing.assert_close(torch.cat(stepwise, dim=1), full, atol=1e-5, rtol=1e-5)
    assert ring.keys.shape[3] == window  # memory stays at the window size


def test_sliding_window_really_forgets(tiny):
    prompt = torch.tensor([PROMPTS[0] + PROMPTS[2]])
    with torch.no_grad():
        windowed = tiny(prompt, SlidingWindowKVCache(tiny.config, 1, 4))[0, -1]
        full = tiny(prompt)[0, -1]
    assert not torch.allclose(windowed, full, atol=1e-3)


def test_kv_cache_memory_formula(tiny):
    cache = KVCache(tiny.config, batch_size=3, max_len=40)
    assert cache.nbytes() == kv_cache_bytes(tiny.config, 40, batch_size=3, bytes_per_value=4)


@pytest.mark.parametrize("prompts, max_new, message", [
    ([[]], 5, "empty"),
    ([[1, 2, 3]], 0, "max_new_tokens"),
    ([[1, 2, 3]], -1, "max_new_tokens"),
    ([list(range(128))], 1, "context"),
    ([list(range(100))], 40, "exceeds the model's context"),
    ([], 5, "no prompts"),
])
@pytest.mark.parametrize("run", GENERATES.values(), ids=GENERATES.keys())
def test_bad_requests_get_clear_errors(tiny, prompts, max_new, message, run):
    with pytest.raises(ValueError, match=message):
        run(tiny, prompts, max_new)


def test_cache_overflow_is_a_clear_error(tiny):
    cache = KVCache(tiny.config, batch_size=1, max_len=4)
    with pytest.raises(ValueError, match="larger cache"):
        tiny(torch.tensor([[1, 2, 3, 4, 5]]), cache)


@pytest.mark.smollm2
def test_smollm2_batched_padding_and_cache(smollm2, tokenizer):
    prompts = [tokenizer.chat_prompt(q) for q in
               ("What is 2 + 2?", "Write a haiku about the sea in autumn, please.")]
    batched = reference.generate(smollm2, prompts, 12, pad_id=tokenizer.pad_id)
    assert batched == [reference.generate(smollm2, p, 12)[0] for p in prompts]
    assert reference.generate(smollm2, prompts[0], 12, use_cache=False) == [batched[0]]
    assert generate(smollm2, prompts, 12) == batched  # the engine, native decode steps


def test_the_reference_loop_takes_a_cache_class(tiny):
    class CountingCache(KVCache):
        updates = 0

        def update(self, layer, k, v):
            CountingCache.updates += 1
            return super().update(layer, k, v)

    expected = reference.generate(tiny, PROMPTS[0], 6)
    assert reference.generate(tiny, PROMPTS[0], 6, cache_class=CountingCache) == expected
    assert CountingCache.updates == 6 * tiny.config.num_layers  # prefill + 5 decode steps


def test_models_compiled_in_one_process_keep_their_own_graphs(tmp_path):
    """Dynamo's module guards are off in the compiled executor; another model (other sizes)
    compiled later must not run the first one's graph."""
    small, _ = tiny_pair(tmp_path / "small")
    wide, _ = tiny_pair(tmp_path / "wide", hidden_size=96, intermediate_size=160)
    expected = [reference.generate(model, PROMPTS[0], 6) for model in (small, wide)]
    assert [generate(model, PROMPTS[0], 6, executor="compiled")
            for model in (small, wide)] == expected


def test_benchmark_counts_the_tokens_two_runs_share():
    from minillm.experiments.decode import same_prefix_length, same_tokens

    a, b = [[1, 2, 3, 4], [5, 6, 7]], [[1, 2, 9, 4], [5, 6, 7]]
    assert same_prefix_length(a, b) == 2 and not same_tokens(a, b)
    assert same_prefix_length(a, a) == 3 and same_tokens(a, a)  # the shortest sequence
    assert same_prefix_length([[1, 2]], [[1, 2, 3]]) == 2
    assert same_prefix_length([[8]], [[9]]) == 0
