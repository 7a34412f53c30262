"""The native decode step on the dense families (Qwen2's biases, Qwen3's QK-norm, Mistral's
window, Gemma 3's norms, GeGLU, query scale and local/global layers), on tiny random models
built with transformers' own classes (window 8, blocks of 4, so windows cross blocks). At
every native step of a run past the window, the eager step from the same pool gives the
same logits (float32 rounding; with int8 activations or KV, a rare step where rounding
lands on the next code), and the greedy tokens are plain greedy decoding's; batched equals
alone; W8A8 (Gemma's tied int8 head in C++ too) and W4A8, an int8 KV pool, speculative
verification and blocks released behind the window too; the C++ window mask against
float64 attention under the eager mask."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from family_parity import PROMPTS, hf_model

from minillm.checkpoint import load_model
from minillm.engine.executors import auto_executor
from minillm.engine.executors.native import NativeExecutor, native_problem
from minillm.experiments.decode import QUANTIZED, quantized_reference
from minillm.model import Transformer
from minillm.native import native_kernels
from minillm.quant.int8_activations import Int8ActivationLinear, to_int8_activations
from minillm.reference import generate
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig

pytestmark = pytest.mark.skipif(native_kernels() is None, reason="no C++ compiler here")

FAMILIES = ("qwen2", "qwen3", "mistral", "gemma3_text")
NEW_TOKENS = 16  # the prompts (2 to 20 tokens) end up 2 to 4 windows long
WEIGHTS = {"W8A8": "int8", "W4A8": "int4"}  # each format's quantized weights (QUANTIZED)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """minillm's model of each family, loaded from the saved transformers model."""
    paths = {family: tmp_path_factory.mktemp(family) for family in FAMILIES}
    for family, path in paths.items():
        hf_model(family).save_pretrained(path)
    return {family: load_model(path) for family, path in paths.items()}


class CheckedNative:
    """The native executor, checked at every step: from the same pool (saved, then
    restored), the eager executor's logits too; ``gaps``: each step's largest difference,
    relative to the largest logit; ``widest``: the most tokens of one sequence in a step."""

    name = "native"

    def __init__(self, llm: LLM):
        runner = llm.core.runner
        self.native, self.eager = runner.executors
        self.cache, self.gaps, self.widest = runner.cache, [], 0
        runner.executors[0] = self

    def supports(self, metadata) -> bool:
        return self.native.supports(metadata)

    def __call__(self, batch) -> torch.Tensor:
        self.widest = max(self.widest, *batch.metadata.query_lens)
        saved = [t.clone() for t in self.cache.tensors()]
        expected = self.eager(batch)
        for t, before in zip(self.cache.tensors(), saved, strict=True):
            t.copy_(before)
        logits = self.native(batch)
        if logits.numel():  # (not a prompt chunk's inner step: no logits)
            self.gaps.append(((logits - expected).abs().max() / expected.abs().max()).item())
        return logits


def assert_within_rounding(gaps: list[float], rounded: bool = False,
                           steps: int = NEW_TOKENS - 1):
    """Every step's logits within float32 summation order of the eager step's; with int8
    rounding (activations or KV), a last-bit difference may move a number to the next
    code once in a while (~1e-2 here: a tiny random model is that sensitive), every other
    step within float32 rounding."""
    assert len(gaps) >= steps  # every decode step ran natively
    if rounded:
        assert max(gaps) < 5e-2 and sum(gap > 1e-4 for gap in gaps) <= len(gaps) // 8, gaps
        gaps = [gap for gap in gaps if gap <= 1e-4]
    assert max(gaps) < 1e-4, gaps


def run(model, executor: str, prompts=PROMPTS, max_batch: int = 4,
        new_tokens: int = NEW_TOKENS, **options):
    """(greedy tokens per prompt, the checked native executor or None) of an engine run
    with blocks of 4."""
    llm = LLM(model, block_size=4, num_blocks=options.pop("num_blocks", 64), executor=executor,
              kv_cache_dtype=options.pop("kv_cache_dtype", None),
              scheduler=SchedulerConfig(max_batch=max_batch, **options))
    checked = CheckedNative(llm) if executor == "native" else None
    outputs = llm.generate(prompts, SamplingParams(max_tokens=new_tokens), progress=False)
    assert llm.free_blocks() == llm.blocks.num_blocks
    return [o.tokens for o in outputs], checked


@pytest.mark.parametrize("family", FAMILIES)
def test_native_steps_give_the_eager_logits_and_greedy_tokens(models, family):
    model = models[family]
    assert native_problem(model) is None and auto_executor(model) == "native"
    tokens, checked = run(model, "native")
    assert_within_rounding(checked.gaps)
    assert tokens == [generate(model, p, NEW_TOKENS)[0] for p in PROMPTS]
    assert len({t for sample in tokens for t in sample}) > 8  # the tokens vary


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_batched_native_steps_equal_each_request_alone(models, family):
    batched, _ = run(models[family], "native", PROMPTS[:3], max_batch=3)
    assert batched == [run(models[family], "native", [p])[0][0] for p in PROMPTS[:3]]


@pytest.mark.parametrize("fmt", WEIGHTS)
@pytest.mark.parametrize("family", ["qwen2", "gemma3_text"])
def test_int8_activation_steps_equal_the_eager_ones(models, family, fmt):
    """Built as ``benchmarks/batched.py`` builds them: the embedding int8 too, so Gemma's
    tied head is an int8 product over the embedding's own table."""
    model = to_int8_activations(quantized_reference(models[family], QUANTIZED[WEIGHTS[fmt]]))
    if family == "gemma3_text":
        assert isinstance(model.lm_head, Int8ActivationLinear)
        assert model.lm_head.codes.data_ptr() == model.embed_tokens.table.data_ptr()
    tokens, checked = run(model, "native")
    assert_within_rounding(checked.gaps, rounded=True)
    assert tokens == run(model, "eager")[0]


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_an_int8_kv_pool_gives_the_eager_steps_logits(models, family):
    tokens, checked = run(models[family], "native", kv_cache_dtype="int8")
    assert_within_rounding(checked.gaps, rounded=True)
    assert tokens == run(models[family], "eager", kv_cache_dtype="int8")[0]


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_speculative_verification_keeps_the_greedy_tokens(models, family):
    """Each guess is a row of its own, whose window ends at it."""
    model = models[family]
    prompts = [[9, 8, 7] * 5, [5, 6] * 7]  # prompt lookup finds guesses
    tokens, checked = run(model, "native", prompts, speculative_tokens=4)
    assert_within_rounding(checked.gaps, steps=1)
    assert checked.widest > 1  # verifications ran natively
    assert tokens == [generate(model, p, NEW_TOKENS)[0] for p in prompts]


def test_blocks_released_behind_the_window_are_never_read(models):
    """Mistral's requests outgrow a 12-block pool: released table entries reach the step as
    block 0, which the window keeps out of every query's view."""
    model = models["mistral"]
    prompts = [PROMPTS[2], PROMPTS[0] + PROMPTS[2]]
    tokens, checked = run(model, "native", prompts, max_batch=2, num_blocks=12,
                       max_tokens_per_step=8, new_tokens=40)
    assert_within_rounding(checked.gaps)
    assert tokens == [generate(model, p, 40)[0] for p in prompts]


@pytest.mark.parametrize("window", [1, 5, 16, 300])
def test_the_cpp_window_mask_is_the_eager_one(window):
    """C++ paged attention with a window against float64 attention under the eager mask
    (``_attend_decodes``: key j is seen by the query at p = length - 1 iff j > p - window),
    with entries behind every window pointing at block 0 (released), over lengths that
    split into parts (> 256 tokens)."""
    g = torch.Generator().manual_seed(0)
    lengths, block_size, kv_heads, heads, d = [1, 7, 40, 600], 4, 2, 6, 16
    width = -(-max(lengths) // block_size)
    keys, values = torch.randn(2, 1 + len(lengths) * width, block_size, kv_heads, d, generator=g)
    tables = 1 + torch.arange(len(lengths) * width).reshape(len(lengths), width)
    for s, length in enumerate(lengths):  # released: wholly behind the window
        tables[s, :max(length - window, 0) // block_size] = 0
    q = torch.randn(len(lengths), heads, d, generator=g)
    out = native_kernels().paged_decode_read(q, keys, values, [], tables,
                                             torch.tensor(lengths), window)
    gathered = [pool[tables].flatten(1, 2).transpose(1, 2).double() for pool in (keys, values)]
    steps, context = torch.arange(width * block_size), torch.tensor(lengths)[:, None]
    visible = (steps < context) & (steps > context - 1 - window)
    scores = torch.einsum("sgqd,sgkd->sgqk", q.double().unflatten(1, (kv_heads, -1)),
                          gathered[0]) / d ** 0.5
    weights = scores.masked_fill(~visible[:, None, None], -torch.inf).softmax(-1)
    expected = torch.einsum("sgqk,sgkd->sgqd", weights, gathered[1]).flatten(1, 2)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_what_stays_unsupported_is_refused_with_the_reason(models):
    model = Transformer(replace(models["qwen3"].config, qk_norm_whole=True))  # OLMoE's
    assert "QK-norm over the whole q and k projections" in native_problem(model)
    assert auto_executor(model) != "native"
    with pytest.raises(ValueError, match="no native decode steps.*whole q and k"):
        NativeExecutor(model, None)
