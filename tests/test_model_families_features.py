"""Structured output and speculative decoding for every family: tiny random models of each
(transformers' own classes) over SmolLM2's whole vocabulary and tokenizer. A constrained
request writes valid text and the tokens it gets alone, on its own and batched; speculation
by a guessing function and by a draft model of the same family gives plain greedy
decoding's tokens, guesses rejected and all."""

from __future__ import annotations

import json
import re

import pytest
from family_parity import FAMILIES, hf_model

from minillm.checkpoint import load_model, resolve_checkpoint
from minillm.quant.checkpoint import copy_tokenizer_files
from minillm.reference import generate
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.structured import JsonSchema, Regex

VOCAB = dict(vocab_size=49152)  # SmolLM2's tokenizer
DATE = r"\d{4}-\d{2}-\d{2}"
TAGS = {"type": "array", "minItems": 1, "maxItems": 3,
        "items": {"type": "string", "enum": ["red", "green", "blue"]}}
PROMPTS = [[5, 17, 99, 3, 42, 7, 8, 11, 60, 2, 71, 33], list(range(100, 120)), [9] * 13]


def saved(family: str, seed: int, directory, **overrides) -> str:
    hf_model(family, seed, **overrides).save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def with_tokenizer(request, tmp_path_factory) -> str:
    """The directory of a tiny model of the family over SmolLM2's vocabulary, with its
    tokenizer files (structured output needs the text of every token)."""
    directory = saved(request.param, 0, tmp_path_factory.mktemp(request.param), **VOCAB)
    copy_tokenizer_files(resolve_checkpoint("smollm2"), directory)
    return directory


@pytest.fixture(scope="module")
def family_model(request, tmp_path_factory) -> str:
    """The directory of a tiny model of the family (a 128-token vocabulary, no tokenizer:
    no token stops a generation)."""
    return saved(request.param, 0, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def draft(family_model, tmp_path_factory):
    """Another tiny model of the same family (another seed): it guesses wrong often."""
    return load_model(saved(load_model(family_model).config.family, 1,
                            tmp_path_factory.mktemp("draft")))


def engine(model, **options) -> LLM:
    """An eager engine of 4-token blocks for a model or a checkpoint's directory."""
    return LLM(model, block_size=4, num_blocks=96, executor="eager", **options)


@pytest.mark.parametrize("with_tokenizer", sorted(FAMILIES), indirect=True)
def test_constrained_output_is_valid_and_batched_equals_alone(with_tokenizer):
    specs = [Regex(DATE), JsonSchema.of(TAGS), Regex(DATE)]
    params = [SamplingParams(max_tokens=40, structured=spec) for spec in specs]
    batched = engine(with_tokenizer, scheduler=SchedulerConfig(max_batch=3)).generate(
        PROMPTS, params, progress=False)
    alone = [engine(with_tokenizer).generate([p], sp, progress=False)[0]
             for p, sp in zip(PROMPTS, params, strict=True)]
    assert [o.tokens for o in batched] == [o.tokens for o in alone]
    assert re.fullmatch(DATE, batched[0].text, re.ASCII)
    assert set(json.loads(batched[1].text)) <= {"red", "green", "blue"}


def repeat_the_last_token(tokens: list[int], gamma: int) -> list[int]:
    """A drafter that always guesses (and is mostly wrong)."""
    return [tokens[-1]] * gamma


def speculated(path: str, **options) -> tuple[list[list[int]], list[list[int]], int]:
    """(the engine's tokens, plain greedy tokens, guesses made) for prompts of 24 to 40
    tokens (past the window) and 12 new tokens each, 3 guesses a step."""
    params = SamplingParams(max_tokens=12)
    prompts = [p * 2 for p in PROMPTS]
    scheduler = SchedulerConfig(max_batch=3, speculative_tokens=3,
                                drafter=repeat_the_last_token)
    model = load_model(path)
    outputs = engine(model, scheduler=scheduler, **options).generate(prompts, params,
                                                                      progress=False)
    return ([o.tokens for o in outputs], [generate(model, p, 12, params)[0] for p in prompts],
            sum(o.outputs[0].drafted for o in outputs))


@pytest.mark.parametrize("family_model", sorted(FAMILIES), indirect=True)
def test_speculation_by_a_guessing_function_gives_greedy_tokens(family_model):
    got, expected, guesses = speculated(family_model)
    assert got == expected and guesses > 0


@pytest.mark.parametrize("family_model", ["mistral", "gemma3_text", "qwen3_moe", "deepseek_v3"],
                         indirect=True)
def test_speculation_by_a_draft_model_gives_greedy_tokens(family_model, draft):
    """A window on every layer, a hybrid of windows, MoE and MLA: the draft model shares the
    target's block tables, and never writes into blocks released behind the window."""
    got, expected, guesses = speculated(family_model, draft_model=draft)
    assert got == expected and guesses > 0
