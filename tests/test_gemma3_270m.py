"""Gemma 3 270M, the course's second real model: minillm's forward and engine against Hugging
Face transformers on the same fp32 checkpoint (``minillm fetch gemma3-270m``; fetched on
first use, a few minutes once).

Six held-out prompts: teacher-forced logits within 1e-4, and the engine's greedy tokens equal
transformers' ``generate``. One prompt longer than the 512-token window of the local layers,
so that five layers of six drop keys while the global ones keep them all. The native decode
step gives the eager engine's tokens, past the window too.
"""

from __future__ import annotations

import pytest
import torch

from minillm import SamplingParams, Tokenizer, load_model
from minillm.checkpoint import resolve_checkpoint
from minillm.data import load_documents
from minillm.serve import LLM

pytestmark = [pytest.mark.gemma3, pytest.mark.slow]
transformers = pytest.importorskip("transformers")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Photosynthesis is the process",
           "In 1969, the first humans", "The three primary colours are",
           "A KV cache stores the keys and values"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def models():
    ours = load_model("gemma3-270m").eval()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        resolve_checkpoint("gemma3-270m"), dtype=torch.float32).eval()
    return ours, hf, Tokenizer("gemma3-270m")


def hf_greedy(hf, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                      do_sample=False)
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def test_logits_and_greedy_tokens_equal_hugging_faces(models):
    ours, hf, tokenizer = models
    prompts = [tokenizer.prompt(text) for text in PROMPTS]
    assert all(p[0] == 2 for p in prompts), "Gemma's prompts start with <bos>"
    for prompt in prompts:
        ids = torch.tensor([prompt])
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=0)
    llm = LLM(ours, tokenizer=tokenizer, num_blocks=64, executor="eager")
    outputs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS), progress=False)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output.outputs[0].tokens == hf_greedy(hf, prompt)


@torch.no_grad()
def test_past_the_sliding_window(models):
    ours, hf, tokenizer = models
    window = ours.config.sliding_window
    article = tokenizer.prompt(load_documents("wikipedia", "eval")[0] * 4)[:window + 200]
    assert len(article) > window
    ids = torch.tensor([article])
    torch.testing.assert_close(ours(ids)[0, window:], hf(ids).logits[0, window:], atol=1e-4,
                               rtol=0)
    llm = LLM(ours, tokenizer=tokenizer, num_blocks=96, executor="eager")
    output = llm.generate([article], SamplingParams(max_tokens=NEW_TOKENS), progress=False)
    assert output[0].outputs[0].tokens == hf_greedy(hf, article)


@torch.no_grad()
def test_native_decode_steps_keep_the_eager_tokens(models):
    """The native step (QK-norm, four norms, GeGLU, local and global layers) past the
    window: the eager engine's greedy tokens, for two prompts and an article longer than the
    window of the local layers."""
    ours, _, tokenizer = models
    window = ours.config.sliding_window
    article = tokenizer.prompt(load_documents("wikipedia", "eval")[0] * 4)[:window + 200]
    prompts = [tokenizer.prompt(text) for text in PROMPTS[:2]] + [article]
    tokens = {}
    for executor in ("eager", "native"):
        reports = []
        llm = LLM(ours, tokenizer=tokenizer, num_blocks=128, executor=executor,
                  on_step=reports.append)
        outputs = llm.generate(prompts, SamplingParams(max_tokens=16), progress=False)
        tokens[executor] = [o.outputs[0].tokens for o in outputs]
        assert reports[-1].executor == executor
    assert tokens["native"] == tokens["eager"]
