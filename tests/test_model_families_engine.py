"""The engine's other parts with the new families: which executors run them (native runs
every dense one, compiled refuses windows with the reason), an int8 KV cache under sliding
windows, blocks released behind a window, what refuses windows (int4 KV, the learner's
decode attention), the draft head, W8A8 weights, and tensor parallelism over 2 ranks (eager
and native steps) equal to one process. The native step's own checks:
``tests/test_native_families.py``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from family_parity import PROMPTS, hf_model

from minillm.checkpoint import load_model, resolve_checkpoint
from minillm.draft_head.head import DraftHead
from minillm.engine import EngineConfig, EngineCore, RequestRejected
from minillm.engine.executors import auto_executor, resolve_executor
from minillm.kv_cache import SlidingWindowKVCache
from minillm.model import Transformer
from minillm.quant import QuantScheme, quantize_model
from minillm.quant.checkpoint import copy_tokenizer_files
from minillm.quant.int8_activations import to_int8_activations
from minillm.reference import generate
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig

PARAMS = SamplingParams(max_tokens=10)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    """A saved tiny random model of each family, by family (with SmolLM2's tokenizer files:
    the engine's rank processes load a checkpoint by path, tokenizer included)."""
    paths = {}
    for family in ("qwen2", "qwen3", "mistral", "gemma3_text"):
        paths[family] = str(tmp_path_factory.mktemp(family))
        hf_model(family).save_pretrained(paths[family])
        copy_tokenizer_files(resolve_checkpoint("smollm2"), paths[family])
    return paths


def tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.tokens for o in llm.generate(prompts, PARAMS, progress=False)]


def test_each_executor_runs_what_it_implements_and_refuses_the_rest(checkpoints):
    models = {family: load_model(path) for family, path in checkpoints.items()}
    for family in ("qwen2", "qwen3", "mistral", "gemma3_text"):  # the dense blocks: native
        assert resolve_executor(models[family], "native") == "native"
        assert auto_executor(models[family]) == "native"
    for family in ("mistral", "gemma3_text"):  # windows: not compiled
        with pytest.raises(ValueError, match="compiled executor cannot run.*sliding window"):
            resolve_executor(models[family], "compiled")
    assert resolve_executor(models["qwen3"], "compiled") == "compiled"


@pytest.mark.slow
def test_compiled_decode_steps_give_the_dense_loops_tokens_for_qwen3(checkpoints):
    """QK-norm inside the compiled graph (one bucket: compiling is the slow part)."""
    model = load_model(checkpoints["qwen3"])
    llm = LLM(model, block_size=4, num_blocks=64, executor="compiled")
    assert tokens(llm, PROMPTS[:1]) == [generate(model, PROMPTS[0], 10, PARAMS)[0]]


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_an_int8_kv_cache_masks_the_window_too(checkpoints, family):
    """Teacher-forced through the engine's int8 pool (prefill chunks of 5, then decodes):
    the log-probabilities stay within int8 rounding of the dense model's, ten times
    closer than those of the model without its window."""
    model = load_model(checkpoints[family])
    prompt = PROMPTS[0] + PROMPTS[2]  # 32 tokens, 4 windows
    llm = LLM(model, block_size=4, num_blocks=64, executor="eager", kv_cache_dtype="int8",
              scheduler=SchedulerConfig(max_tokens_per_step=5))
    out = llm.generate([prompt], SamplingParams(max_tokens=6, logprobs=0),
                       progress=False)[0].outputs[0]
    with torch.no_grad():
        dense = model(torch.tensor([prompt + out.tokens]))[0, len(prompt) - 1:-1]
    got = torch.tensor([entry.logprob for entry in out.logprobs])
    chosen = dense.log_softmax(-1)[torch.arange(6), out.tokens]
    unwindowed = Transformer(replace(model.config, sliding_window=None, layer_types=None))
    unwindowed.load_state_dict(model.state_dict())
    with torch.no_grad():
        wrong = unwindowed(torch.tensor([prompt + out.tokens]))[0, len(prompt) - 1:-1]
    wrong = wrong.log_softmax(-1)[torch.arange(6), out.tokens]
    assert (got - chosen).abs().max() < min(0.2, (wrong - chosen).abs().max() / 10)


@pytest.mark.parametrize("family", ["qwen2", "gemma3_text"])
def test_w8a8_models_run_in_the_engine(checkpoints, family):
    """Quantization replaces the linear layers (Qwen2's biases kept) and nothing else: the
    quantized model's engine tokens are its dense loop's."""
    model = to_int8_activations(quantize_model(load_model(checkpoints[family]), "rtn",
                                               QuantScheme(8, symmetric=True, group_size=None)))
    expected = [generate(model, p, 10, PARAMS)[0] for p in PROMPTS]
    assert tokens(LLM(model, block_size=4, num_blocks=64, executor="eager")) == expected


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "int8"])
def test_a_windowed_model_generates_past_its_pool_releasing_blocks(checkpoints, kv_cache_dtype):
    """Mistral's every layer sees the last 8 tokens, so blocks behind them go back to the
    pool: two requests of 80 tokens (20 blocks each) run together in 12 blocks, preempting
    as they must, and give the dense loop's tokens (Gemma's global layers keep every
    block: its requests still need all theirs)."""
    model = load_model(checkpoints["mistral"])
    params = SamplingParams(max_tokens=60)
    prompts = [PROMPTS[2], PROMPTS[0] + PROMPTS[2]]
    llm = LLM(model, block_size=4, num_blocks=12, executor="eager",
              kv_cache_dtype=kv_cache_dtype,
              scheduler=SchedulerConfig(max_batch=2, max_tokens_per_step=8))
    out = [o.tokens for o in llm.generate(prompts, params, progress=False)]
    if kv_cache_dtype == "float32":
        assert out == [generate(model, p, 60, params)[0] for p in prompts]
    else:
        assert out == [o.tokens for o in LLM(model, block_size=4, num_blocks=64,
                                             executor="eager", kv_cache_dtype="int8")
                       .generate(prompts, params, progress=False)]
    assert llm.free_blocks() == 12
    gemma = EngineCore(load_model(checkpoints["gemma3_text"]),
                       EngineConfig(block_size=4, num_blocks=12, executor="eager"))
    with pytest.raises(RequestRejected, match="needs 20 KV blocks but the pool has 12"):
        gemma.add(0, prompts[0], params)


def test_a_cached_prefix_longer_than_the_pool_is_reused_behind_the_window(checkpoints):
    """The first request leaves all 16 blocks of the pool naming its prompt; the second
    starts from them (those behind the window go straight back) instead of waiting for
    room that never comes."""
    model = load_model(checkpoints["mistral"])
    prompt = list(range(20, 84))  # 16 blocks of 4
    params = SamplingParams(max_tokens=1)
    reports = []
    llm = LLM(model, block_size=4, num_blocks=16, executor="eager", on_step=reports.append,
              scheduler=SchedulerConfig(max_batch=1, max_tokens_per_step=8))
    longer = prompt + [5, 6, 7, 8, 9]
    outputs = llm.generate([prompt, longer], params, progress=False)
    assert [o.tokens for o in outputs] == [generate(model, p, 1, params)[0]
                                           for p in (prompt, longer)]
    assert [w.start for r in reports for w in r.work][-1] == 64  # the second: a hit of 64


def test_what_cannot_mask_a_window_refuses_it(checkpoints):
    model = load_model(checkpoints["gemma3_text"])
    with pytest.raises(ValueError, match="sliding-window layers.*int4 KV cache"):
        LLM(model, block_size=4, num_blocks=16, kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="sliding-window layers.*decode_attention"):
        LLM(model, block_size=4, num_blocks=16, decode_attention=lambda *args: None)
    with pytest.raises(ValueError, match="draft head is one Llama block.*QK-norm"):
        DraftHead(model.config, torch.arange(8))


def test_a_ring_buffer_cache_narrows_a_models_window(checkpoints):
    """The old sliding-window ring cache runs windowed models: a ring as long as the
    model's window gives the full cache's tokens."""
    model = load_model(checkpoints["mistral"])
    window = model.config.sliding_window
    prompt, ids = PROMPTS[2], torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ring = SlidingWindowKVCache(model.config, 1, window)
        logits = model(ids, cache=ring)
    assert torch.allclose(logits, model(ids), atol=1e-5)
    ringed = generate(model, prompt, 10, PARAMS, window=window)[0]
    assert ringed == generate(model, prompt, 10, PARAMS)[0]


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["eager", "native"])
@pytest.mark.parametrize("family", ["qwen2", "gemma3_text"])
def test_tensor_parallel_over_two_ranks_equals_one_process(checkpoints, family, executor):
    """Qwen2's q/k/v biases split with their columns; Gemma's extra norms and QK-norm are
    whole on every rank (the native step norms the attention and MLP outputs after their
    all-reduce), and its embedding scale applies after the vocabulary-parallel lookup."""
    def run(**options):
        with LLM(checkpoints[family], block_size=4, num_blocks=64, executor=executor,
                 **options) as llm:
            return tokens(llm, PROMPTS[:3])

    assert run(tensor_parallel_size=2) == run()
