"""Structured output in the engine: every constrained output is valid, a constraint that
allows everything changes nothing, and every scheduling path (batching policies,
preemption, prefix hits, n > 1 samples, speculation, jump-forward) gives a constrained
request exactly the tokens it gets alone."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import cache, partial

import jsonschema
import pytest
import torch
from engine_driving import preempt_at_random, sequence_of

from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.structured import Choice, JsonObject, JsonSchema, Regex
from minillm.structured.backend import AutomatonBackend, XGrammarBackend
from minillm.testing import saved_varied_model
from minillm.tokenizer import Tokenizer

PERSON = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"enum": ["Paris", "Rome", "Lima"]}}}
ORDER = {"type": "object", "additionalProperties": False, "required": ["id", "items", "paid"],
         "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999},
                        "items": {"type": "array", "maxItems": 3,
                                  "items": {"type": "object", "additionalProperties": False,
                                            "required": ["sku", "qty"],
                                            "properties": {
                                                "sku": {"type": "string", "maxLength": 5},
                                                "qty": {"type": "integer", "minimum": 1,
                                                        "maximum": 9}}}},
                        "paid": {"type": "boolean"}}}
TAGS = {"type": "array", "minItems": 1, "maxItems": 4,
        "items": {"type": "string", "enum": ["red", "green", "blue"]}}
SCHEMAS = [PERSON, ORDER, TAGS]
REGEXES = [r"\d{4}-\d{2}-\d{2}", r"(yes|no|maybe)", r"[A-Z][a-z]{1,6}( [A-Z][a-z]{1,6})?",
           r"-?(0|[1-9][0-9]{0,4})(\.[0-9]{1,3})?"]
PROMPTS = [[5, 17, 99, 3, 42, 7, 8], [1, 2], list(range(30, 70)), [9] * 13]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random model over SmolLM2's whole vocabulary (and its tokenizer), so masks
    are the real 49,152-token masks and the tokens it picks span several characters."""
    return saved_varied_model(tmp_path_factory.mktemp("tiny"), vocab_size=49152,
                              max_position_embeddings=512)


def engine(model, num_blocks=256, structured_backend=XGrammarBackend, preempt=None,
           **config) -> LLM:
    """An engine of 4-token blocks; ``config``: the scheduler's; ``preempt``: (chance,
    seed) of a random preemption before each step."""
    llm = LLM(model, block_size=4, num_blocks=num_blocks,
              scheduler=SchedulerConfig(**config), structured_backend=structured_backend)
    return llm if preempt is None else preempt_at_random(llm, *preempt)


@cache
def _alone(model, prompt: tuple[int, ...], params: SamplingParams) -> list[int]:
    return engine(model).generate([list(prompt)], params, progress=False)[0].tokens


def alone(model, prompt, params: SamplingParams) -> list[int]:
    """The tokens of ``prompt`` as the only request of a default engine."""
    return _alone(model, tuple(prompt), params)


def valid(spec, text: str) -> bool:
    if isinstance(spec, Regex):
        return re.fullmatch(spec.pattern, text, re.ASCII) is not None
    if isinstance(spec, Choice):
        return text in spec.options
    value = json.loads(text)
    if isinstance(spec, JsonObject):
        return isinstance(value, dict)
    jsonschema.validate(value, spec.as_dict)
    return True


def test_200_seeded_constrained_outputs_are_all_valid(tiny):
    """Greedy and sampled, over schemas and regexes whose outputs are bounded (a random
    model need never close an unbounded string; SmolLM2 does, below)."""
    specs = [JsonSchema.of(s) for s in SCHEMAS] + [Regex(r) for r in REGEXES] + \
        [Choice(("alpha", "beta", "gamma delta"))]
    params = [SamplingParams(max_tokens=100, structured=specs[i % len(specs)],
                             temperature=0.0 if i % 4 == 0 else 1.0, seed=i)
              for i in range(200)]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(200)]
    outputs = engine(tiny, max_batch=16, num_blocks=2048).generate(prompts, params,
                                                                   progress=False)
    for p, out in zip(params, outputs, strict=True):
        assert out.finish_reason == "stop", (p.structured, out.text)
        assert valid(p.structured, out.text), (p.structured, out.text)
    # sampled outputs differ (93 distinct texts when written; choices have few to give)
    assert len({out.text for out in outputs}) > 60


def allow_everything(automaton, texts, stop_tokens):
    """A token index whose every mask allows every token."""
    return lambda state: torch.ones(len(texts), dtype=torch.bool)


def test_a_constraint_that_allows_everything_changes_no_greedy_token(tiny):
    """Through the whole masking path (mask, follow, forget) with a mask of all ones."""
    params = SamplingParams(max_tokens=24)
    plain = engine(tiny).generate(PROMPTS, params, progress=False)
    masked = engine(tiny, structured_backend=partial(AutomatonBackend,
                                                     index_fn=allow_everything)
                    ).generate(PROMPTS, replace(params, structured=Regex(r"[\s\S]*")),
                               progress=False)
    assert [o.tokens for o in masked] == [o.tokens for o in plain]


@pytest.mark.smollm2
def test_smollm2_greedy_text_is_unchanged_by_an_allow_all_regex(smollm2, tokenizer):
    prompts = [tokenizer.chat_prompt(q) for q in ("What is a KV cache?",
                                                  "Write a haiku about rain.")]
    params = SamplingParams(max_tokens=40)
    llm = LLM(smollm2, tokenizer=tokenizer, block_size=16, num_blocks=64)
    plain = llm.generate(prompts, params, progress=False)
    masked = llm.generate(prompts, replace(params, structured=Regex(r"[\s\S]*")),
                          progress=False)
    assert [o.tokens for o in masked] == [o.tokens for o in plain]


CONFIGS = {
    "continuous": dict(max_batch=8, max_tokens_per_step=512),
    "chunked prefill": dict(max_batch=8, max_tokens_per_step=8),
    "whole prefills": dict(max_batch=6, chunked_prefill=False),
    "static": dict(policy="static", max_batch=6),
    "random preemption": dict(max_batch=8, max_tokens_per_step=16, preempt=(0.3, 2)),
    "short pool": dict(max_batch=8, max_tokens_per_step=64, num_blocks=40),
    "speculation": dict(max_batch=8, speculative_tokens=3),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_constrained_requests_get_their_lone_tokens_on_every_path(tiny, config):
    """n > 1 and prefix hits included: the repeated prompts find their blocks cached."""
    greedy_only = "speculative_tokens" in config  # speculation draws differently
    specs = [JsonSchema.of(PERSON), Regex(REGEXES[0]), JsonSchema.of(TAGS), Choice(("x", "y"))]
    params = [SamplingParams(max_tokens=60, structured=spec, seed=10 * i, n=1 + i % 2,
                             temperature=0.0 if greedy_only or i % 2 else 1.0)
              for i, spec in enumerate(specs)]
    prompts = PROMPTS + PROMPTS  # the second round hits the prefix cache
    outputs = engine(tiny, **config).generate(prompts, params + params, progress=False)
    for prompt, sp, out in zip(prompts, params + params, outputs, strict=True):
        for i, sample in enumerate(out.outputs):
            seed = sp.seed + i
            assert sample.tokens == alone(tiny, prompt, replace(sp, n=1, seed=seed))
            assert valid(sp.structured, sample.text)


def test_rejected_guesses_roll_the_automaton_back(tiny):
    """Guesses the grammar forbids, and guesses it allows that the target rejects: the
    output is the one decoding without speculation gives."""
    params = SamplingParams(max_tokens=40, structured=JsonSchema.of(PERSON))
    bad_guesses = ["}", "{", "]"]
    encode = Tokenizer(tiny).encode

    def drafter(tokens, gamma):  # a forbidden token after one or two allowed-looking ones
        return ([tokens[-1]] + encode(bad_guesses[len(tokens) % 3]) * gamma)[:gamma]

    spec_engine = engine(tiny, speculative_tokens=3, drafter=drafter)
    out = spec_engine.generate(PROMPTS, params, progress=False)
    assert sum(o.outputs[0].drafted for o in out) > 0
    assert [o.tokens for o in out] == [alone(tiny, p, params) for p in PROMPTS]


def test_jump_forward_saves_forward_passes_and_stays_valid(tiny):
    """Per output token, fewer steps: the forced tokens are computed together."""
    params = SamplingParams(max_tokens=80, structured=JsonSchema.of(ORDER))
    steps_per_token, forced = {}, {}
    for jump in (False, True):
        steps = []
        llm = LLM(tiny, block_size=4, num_blocks=256, jump_forward=jump, on_step=steps.append)
        out = llm.generate([PROMPTS[0]], params, progress=False)[0]
        assert valid(params.structured, out.text)
        steps_per_token[jump] = len(steps) / len(out.tokens)
        forced[jump] = out.outputs[0].forced
    assert forced == {False: 0, True: forced[True]} and forced[True] >= 5
    assert steps_per_token[True] < 0.9 * steps_per_token[False]


def test_bad_constraints_fail_only_their_request(tiny):
    llm = engine(tiny)
    good = SamplingParams(max_tokens=10, structured=Regex(r"[a-z]+"))
    outs = llm.generate(PROMPTS[:3], [
        SamplingParams(structured=JsonSchema.of({"type": "object", "minProperties": "two"})),
        SamplingParams(structured=Regex("a(b")),
        good], progress=False)
    assert "invalid JSON schema" in outs[0].error
    assert "regex cannot be compiled" in outs[1].error
    assert outs[2].error is None and re.fullmatch(r"[a-z]+", outs[2].text)
    out = llm.generate([PROMPTS[0]], SamplingParams(logit_bias={49152: 5.0}),
                       progress=False)[0]
    assert "logit_bias" in out.error
    assert llm.free_blocks() == 256


def test_a_constraint_the_vocabulary_cannot_write_fails_only_its_request(tiny):
    """SmolLM2's vocabulary has no token for the byte 0x04: a constraint that needs it at
    once is refused when it arrives; one that needs it after "ab" fails when it gets
    there (its n samples too), while the other requests of the same steps go on."""
    llm = engine(tiny)
    good = SamplingParams(max_tokens=10, structured=Regex(r"[a-z]+"))
    now, later = (SamplingParams(max_tokens=10, structured=Regex(pattern))
                  for pattern in ("\x04", "ab\x04"))
    outs = llm.generate(PROMPTS[:3], [now, replace(later, n=2), good], progress=False)
    assert "vocabulary cannot write" in outs[0].error and outs[0].tokens == []
    assert [(o.finish_reason, o.text) for o in outs[1].outputs] == [("error", "ab")] * 2
    assert "vocabulary cannot write" in outs[1].error
    assert outs[2].error is None and re.fullmatch(r"[a-z]+", outs[2].text)
    assert llm.free_blocks() == 256


def test_the_course_backend_refuses_what_it_cannot_compile(tiny):
    llm = engine(tiny, structured_backend=AutomatonBackend)
    out = llm.generate([PROMPTS[0]], SamplingParams(structured=JsonSchema.of(PERSON)),
                       progress=False)[0]
    assert "takes a regex or a choice" in out.error


def test_a_forgotten_sequence_drops_its_matcher(tiny):
    llm = engine(tiny)
    request = llm.add_request(PROMPTS[0], SamplingParams(
        max_tokens=30, structured=JsonSchema.of(PERSON)))
    seq = sequence_of(llm, request)
    matchers = llm.core.runner.sampler.structured.matchers
    llm.step()
    assert seq.id in matchers
    llm.abort(request)
    assert seq.id not in matchers
