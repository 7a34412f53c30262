"""Graded tests for chapter 16 (structured output): your pieces in the engine.

The engine must write with your subset construction (16.1) and with your token index
(16.2) exactly the tokens it writes with the library's (a tiny random model over SmolLM2's
vocabulary), and SmolLM2 with your backend the tokens of the default xgrammar engine.
The file's name sorts after the exercises' own files: the mutant check runs the files in
name order, so a wrong answer is caught there by a quick test before it meets the engine.
"""

from __future__ import annotations

import functools
import re

import pytest
from ch16_patterns import PERSON, VOCAB

from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.sampling import SamplingParams
from minillm.serve import LLM
from minillm.structured import Choice, Regex
from minillm.structured.backend import AutomatonBackend
from minillm.structured.regex_automaton import compile_regex, thompson_nfa
from minillm.testing import TINY, varied_random_model

impl = load_impl("ch16_structured")


def tiny_model():
    """A tiny random model over SmolLM2's vocabulary, so masks are the real 49,152-token
    masks and its tokens span several characters."""
    return varied_random_model(ModelConfig(**{**TINY, "vocab_size": VOCAB,
                                              "max_position_embeddings": 256}))


def engine_tokens(tokenizer, backend) -> list[list[int]]:
    """The tiny model's tokens under bounded regexes and a choice, greedy and sampled."""
    specs = [Regex(PERSON), Regex(r"[0-9]{1,4}-[à-ÿ]{1,3}"), Regex(r"(Mr|Ms)\.? [A-Z][a-z]{1,5}"),
             Choice(("alpha", "beta", "gamma delta"))]
    params = [SamplingParams(max_tokens=40, structured=spec, temperature=temperature, seed=i)
              for i, (spec, temperature) in enumerate((s, t) for s in specs for t in (0.0, 1.0))]
    prompts = [[5 + i, 17, 99, 3 * i] for i in range(len(params))]
    llm = LLM(tiny_model(), tokenizer=tokenizer, block_size=4, num_blocks=512,
              structured_backend=backend)
    outputs = llm.generate(prompts, params, progress=False)
    for output in outputs:
        assert output.error is None and output.finish_reason == "stop", (output.error,
                                                                          output.text)
    return [output.tokens for output in outputs]


@pytest.fixture(scope="module")
def library_engine_tokens(tokenizer):
    return engine_tokens(tokenizer, AutomatonBackend)


@pytest.mark.exercise("16.1", points=2)
@pytest.mark.smollm2
def test_your_compiler_in_the_engine(tokenizer, library_engine_tokens):
    """The engine with your compiler (and the library's index) writes the library's tokens."""
    impl.determinize(*thompson_nfa("a"))  # fail here, before the engine
    backend = functools.partial(AutomatonBackend, compile_fn=impl.your_regex_compiler)
    assert engine_tokens(tokenizer, backend) == library_engine_tokens


@pytest.mark.exercise("16.2", points=2)
@pytest.mark.smollm2
def test_your_index_in_the_engine(tokenizer, library_engine_tokens):
    """The engine with your index (and the library's compiler) writes the library's tokens."""
    impl.token_index(compile_regex("a"), ["a"], [])  # fail here, before the engine
    backend = functools.partial(AutomatonBackend, index_fn=impl.token_index)
    assert engine_tokens(tokenizer, backend) == library_engine_tokens


@pytest.mark.exercise("16.2", points=2)
@pytest.mark.smollm2
def test_your_backend_on_smollm2_writes_xgrammars_tokens(smollm2, tokenizer):
    """SmolLM2, greedy, under regexes, with your compiler and your index as the engine's
    backend: the tokens of the default (xgrammar) engine, and they match. (This one runs
    your compiler of exercise 16.1 too.)"""
    impl.token_index(compile_regex("a"), ["a"], [])  # fail here, before the engine
    cases = [(r'\{"city": "[A-Z][a-z]+", "country": "[A-Z][a-z]+"\}',
              "Give the capital of Italy as JSON with keys city and country."),
             (r"\(?[0-9]{3}\)? [0-9]{3}-[0-9]{4}", "Write a US phone number for a pizza shop.")]
    prompts = [tokenizer.chat_prompt(question) for _, question in cases]
    params = [SamplingParams(max_tokens=24, temperature=0, structured=Regex(pattern))
              for pattern, _ in cases]
    mine = LLM(smollm2, tokenizer=tokenizer, num_blocks=64, structured_backend=impl.your_backend)
    default = LLM(smollm2, tokenizer=tokenizer, num_blocks=64)
    outputs = mine.generate(prompts, params, progress=False)
    expected = default.generate(prompts, params, progress=False)
    for (pattern, _), output, reference in zip(cases, outputs, expected, strict=True):
        assert output.error is None, output.error
        assert output.tokens == reference.tokens, (output.text, reference.text)
        assert output.finish_reason == "stop"
        assert re.fullmatch(pattern, output.text), output.text
