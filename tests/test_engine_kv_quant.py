"""The engine with a quantized KV cache (``LLM(kv_cache_dtype="int8" or "int4")``): every
request's tokens equal the same request run alone under the same KV dtype, through
prefix-cache hits, copy-on-write forks, preemption and speculation; the native step's int8
attention gives the eager path's logits; bad combinations are refused with the reason."""

from __future__ import annotations

import pytest
import torch

from minillm.attention.paged import slot_mapping
from minillm.config import ModelConfig
from minillm.engine.executors import resolve_executor
from minillm.engine.executors.batch import SequenceWork, flat_batch
from minillm.engine.runner import ModelRunner
from minillm.native import native_kernels
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import TINY, saved_varied_model, varied_random_model

PROMPTS = [[5, 17, 99, 3, 42, 7, 8], [1, 2], [200, 100, 50, 25], list(range(30, 70)),
           [9] * 13, [4, 4, 8, 15, 16, 23, 42]]
PARAMS = SamplingParams(max_tokens=12)


@pytest.fixture(scope="module")
def model():
    return varied_random_model(ModelConfig(**TINY))


def engine(model, executor="auto", kv="int8", **config) -> LLM:
    blocks = config.pop("num_blocks", 64)
    return LLM(model, block_size=4, num_blocks=blocks, kv_cache_dtype=kv,
               executor=executor, scheduler=SchedulerConfig(**config))


def alone(model, prompt, params=PARAMS, executor="auto", kv="int8") -> list[int]:
    """The request run by itself (one sequence at a time), under the same KV dtype."""
    return engine(model, executor, kv, max_batch=1).generate([prompt], params,
                                                             progress=False)[0].tokens


CASES = [("int8", "eager"), ("int8", "auto"), ("int4", "auto")]  # int4: eager steps only


@pytest.fixture(scope="module")
def expected(model):
    return {(kv, executor): [alone(model, p, executor=executor, kv=kv) for p in PROMPTS]
            for kv, executor in CASES}


CONFIGS = {
    "batched": dict(max_batch=4, max_tokens_per_step=512),
    "chunked prefill": dict(max_batch=4, max_tokens_per_step=8),
    "short pool (preemption)": dict(max_batch=6, max_tokens_per_step=64, num_blocks=24),
    "speculation": dict(max_batch=4, speculative_tokens=3),
}


@pytest.mark.parametrize("kv, executor", CASES)
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_quantized_kv_tokens_equal_each_request_alone(model, expected, kv, executor, config):
    llm = engine(model, executor, kv, **config)
    outputs = llm.generate(PROMPTS, PARAMS, progress=False)
    assert [o.tokens for o in outputs] == expected[kv, executor]
    assert llm.free_blocks() == llm.blocks.num_blocks


@pytest.mark.parametrize("kv", ["int8", "int4"])
def test_prefix_hits_and_forks_share_quantized_blocks_and_change_nothing(model, kv):
    system = list(range(100, 140))
    prompts = [system + [i, i + 1] for i in range(3)]
    llm = engine(model, kv=kv, max_batch=1)
    for prompt in prompts:  # one at a time: the later ones hit the cached system prompt
        assert llm.generate([prompt], PARAMS, progress=False)[0].tokens == \
            alone(model, prompt, kv=kv)
    forks = engine(model, kv=kv, max_batch=2).generate(
        [prompts[0]], SamplingParams(max_tokens=9, n=2), progress=False)[0]
    assert [s.tokens for s in forks.outputs] == [alone(model, prompts[0], kv=kv)[:9]] * 2


def test_quantized_pools_hold_more_tokens_per_byte(model):
    """Per token and KV head: float32 4d bytes; int8 d + 4 (a scale); int4 d / 2 codes and
    8 (a value scale and minimum) for values, d / 2 and 8d / block_size for keys."""
    bytes_per_block = {kv: engine(model, kv=kv, num_blocks=8).core.runner.cache
                       .bytes_per_block() for kv in ("float32", "int8", "int4")}
    d, heads = model.config.head_dim, model.config.num_kv_heads * model.config.num_layers
    assert bytes_per_block["float32"] == 4 * heads * 2 * 4 * d
    assert bytes_per_block["int8"] == 4 * heads * 2 * (d + 4)
    assert bytes_per_block["int4"] == heads * (4 * (d // 2 + 8) + 4 * d // 2 + 8 * d)


def batch_of(work, block_size=4):
    return flat_batch(work, [], block_size, slot_mapping, "cpu")


@pytest.mark.skipif(native_kernels() is None, reason="no C++ compiler here")
def test_native_int8_decode_gives_the_eager_logits(model):
    """Three sequences' prompts written by eager prefills, then one decode step, native vs
    eager, from the same int8 pool."""
    runner = ModelRunner(model, 32, 4, executor="native", kv_cache_dtype="int8")
    native, eager = runner.executors
    tables = [[0, 1], list(range(2, 13)), [13, 14, 15, 16]]
    prompts = [PROMPTS[0], PROMPTS[3], PROMPTS[4]]
    runner.forward(batch_of([SequenceWork(p, 0, t, 1) for p, t in
                             zip(prompts, tables, strict=True)]), eager)
    decode = batch_of([SequenceWork([7], len(p), t, 1) for p, t in
                       zip(prompts, tables, strict=True)])
    saved = [t.clone() for t in runner.cache.tensors()]
    logits = runner.forward(decode, native)
    native_pool = [t.clone() for t in runner.cache.tensors()]
    for t, before in zip(runner.cache.tensors(), saved, strict=True):
        t.copy_(before)
    torch.testing.assert_close(logits, runner.forward(decode, eager), atol=1e-4, rtol=1e-4)
    for written, expected in zip(native_pool, runner.cache.tensors(), strict=True):
        # the same rounding of keys that agree to float32 sums: a code at most one apart
        torch.testing.assert_close(written.float(), expected.float(), atol=1, rtol=1e-4)


def test_quantized_kv_refuses_what_cannot_read_it(model):
    with pytest.raises(ValueError, match="compiled executor cannot read a int8 KV cache"):
        resolve_executor(model, "compiled", "int8")
    with pytest.raises(ValueError, match="native executor cannot read a int4 KV cache"):
        resolve_executor(model, "native", "int4")
    assert resolve_executor(model, "auto", "int4") == "eager"
    with pytest.raises(ValueError, match="decode_attention= reads a float32 pool"):
        LLM(model, kv_cache_dtype="int8", decode_attention=lambda *args: None)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        LLM(model, kv_cache_dtype="q4")


@pytest.mark.slow
def test_tensor_parallel_int8_kv_equals_one_process(tmp_path):
    checkpoint = saved_varied_model(tmp_path)
    params = SamplingParams(max_tokens=8)

    def tokens(**options):
        with LLM(checkpoint, num_blocks=64, block_size=4, kv_cache_dtype="int8",
                 **options) as llm:
            return [o.tokens for o in llm.generate(PROMPTS[:3], params, progress=False)]

    assert tokens(tensor_parallel_size=2) == tokens()
