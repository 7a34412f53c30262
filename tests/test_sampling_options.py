"""OpenAI's and vLLM's sampling options: logit_bias, presence and frequency penalties,
min-p and ``structured``. Each formula is checked on hand-made logits (exact values), each
distribution by 20,000 seeded draws against the formula's softmax (a chi-square test), and
the serving engine against the dense reference loop."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from minillm.config import ModelConfig
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import (
    SamplingParams,
    apply_logit_bias,
    apply_presence_frequency_penalties,
    apply_repetition_penalty,
    min_p_filter,
    process_logits,
    sample,
    top_k_filter,
    top_p_filter,
)
from minillm.serve import LLM, SchedulerConfig
from minillm.structured.spec import Choice, Grammar, JsonObject, JsonSchema, Regex
from minillm.testing import varied_random_model

INF = float("inf")
DRAWS = 20_000
# Chi-square critical values at significance 0.001 by degrees of freedom (any statistics
# table): a correct sampler fails one test in a thousand; the seeds are fixed, so never.
CHI2_CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}


def softmax(xs: list[float]) -> list[float]:
    """By hand, for the expected distributions (-inf gives probability 0)."""
    top = max(xs)
    weights = [math.exp(x - top) for x in xs]
    return [w / sum(weights) for w in weights]


def frequencies(params: SamplingParams, logits: list[float], seed: int,
                output: list[int] | None = None) -> list[int]:
    """How often each token comes in DRAWS draws from one row of ``logits`` (one batched
    call: every row draws independently), with ``output`` as every row's history."""
    batch = torch.tensor([logits]).expand(DRAWS, -1)
    history = None if output is None else torch.tensor([output]).expand(DRAWS, -1)
    generator = torch.Generator().manual_seed(seed)
    tokens = sample(batch, params, generator, output=history)
    return torch.bincount(tokens, minlength=len(logits)).tolist()


def chi_square(counts: list[int], expected: list[float]) -> float:
    """Pearson's statistic sum (O - E)^2 / E over the tokens expected at all; the others
    must never come."""
    assert all(c == 0 for c, p in zip(counts, expected, strict=True) if p == 0)
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, expected, strict=True) if p)


def assert_distributed_as(counts: list[int], expected: list[float],
                          wrong: list[float] | None = None):
    """The draws fit ``expected``; and (the test has power) they do not fit ``wrong``, the
    distribution without the option under test."""
    dof = sum(p > 0 for p in expected) - 1
    assert chi_square(counts, expected) < CHI2_CRITICAL[dof]
    if wrong is not None:
        assert sum(abs(c / sum(counts) - p) for c, p in zip(counts, wrong, strict=True)) > 0.1


# Formulas on hand-made logits ------------------------------------------------------------


def test_logit_bias_adds_each_bias_to_its_token():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]])
    biased = apply_logit_bias(logits, ((0, 1.5), (2, -0.5)))
    assert torch.equal(biased, torch.tensor([[1.5, 1.0, 1.5, 3.0], [5.5, 5.0, 5.5, 7.0]]))
    assert logits[0, 0] == 0.0  # the caller's logits are left alone


def test_logit_bias_past_the_vocabulary_is_a_clear_error():
    with pytest.raises(ValueError, match="vocabulary has 4 tokens"):
        process_logits(torch.zeros(1, 4), SamplingParams(logit_bias={4: 1.0}))


def test_presence_and_frequency_penalties_count_each_rows_output():
    logits = torch.zeros(2, 4)
    output = torch.tensor([[1, 1, 3], [0, 0, 0]])
    penalised = apply_presence_frequency_penalties(logits, output, presence=0.5,
                                                   frequency=0.25)
    # row 0: c = (0, 2, 0, 1): -(2·0.25 + 0.5) = -1, -(0.25 + 0.5) = -0.75
    # row 1: c = (3, 0, 0, 0): -(3·0.25 + 0.5) = -1.25
    assert torch.equal(penalised, torch.tensor([[0.0, -1.0, 0.0, -0.75],
                                                [-1.25, 0.0, 0.0, 0.0]]))


def test_negative_penalties_make_repeats_more_likely():
    penalised = apply_presence_frequency_penalties(torch.zeros(1, 3), torch.tensor([[2, 2]]),
                                                   presence=-1.0, frequency=-0.5)
    assert torch.equal(penalised, torch.tensor([[0.0, 0.0, 2.0]]))


def test_presence_and_frequency_penalties_ignore_the_prompt():
    """Only ``output`` counts: a prompt token (in ``previous``) is not penalised."""
    params = SamplingParams(presence_penalty=1.0, frequency_penalty=1.0)
    logits = torch.zeros(1, 4)
    prompt = torch.tensor([[0, 1, 2]])
    assert torch.equal(process_logits(logits, params, prompt), logits)
    assert torch.equal(process_logits(logits, params, prompt, output=torch.tensor([[3]])),
                       torch.tensor([[0.0, 0.0, 0.0, -2.0]]))
    empty = torch.zeros(1, 0, dtype=torch.long)  # the first token: nothing generated yet
    assert torch.equal(process_logits(logits, params, prompt, output=empty), logits)


def test_min_p_drops_tokens_below_min_p_times_the_top_probability():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    # min_p 0.3: threshold 0.3 · 0.5 = 0.15, so 0.125 goes and 0.25 stays
    assert torch.equal(min_p_filter(logits, 0.3), torch.tensor([[logits[0, 0], logits[0, 1],
                                                                 -INF, -INF]]))
    assert torch.equal(min_p_filter(logits, 1.0) > -INF,  # min_p 1: the top token only
                       torch.tensor([[True, False, False, False]]))
    assert torch.equal(min_p_filter(logits, 0.0), logits)


def test_min_p_applies_after_temperature():
    """p ratio of the two tokens is e^-1 = 0.37 at T = 1 but e^-2 = 0.14 at T = 0.5: a min_p
    of 0.3 keeps the second token at T = 1 only."""
    logits = torch.tensor([[0.0, -1.0]])
    hot = process_logits(logits, SamplingParams(temperature=1.0, min_p=0.3))
    cold = process_logits(logits, SamplingParams(temperature=0.5, min_p=0.3))
    assert torch.equal(hot, torch.tensor([[0.0, -1.0]]))
    assert torch.equal(cold, torch.tensor([[0.0, -INF]]))


def test_pipeline_order_bias_then_repetition_then_presence():
    """Token 0: 1 + (-2) = -1, then repetition penalty 2 on a negative logit: -2 (the other
    order would give 1/2 - 2 = -1.5). Token 1: 4 / 2 = 2, then presence 1: 1 (the other order
    would give (4 - 1) / 2 = 1.5). Greedy stops there: no temperature, no filter."""
    params = SamplingParams(logit_bias={0: -2.0}, repetition_penalty=2.0, presence_penalty=1.0,
                            min_p=1.0, top_k=1, top_p=0.1)
    logits = torch.tensor([[1.0, 4.0, 0.5]])
    out = process_logits(logits, params, previous=torch.tensor([[0, 1]]),
                         output=torch.tensor([[1]]))
    assert torch.equal(out, torch.tensor([[-2.0, 1.0, 0.5]]))


def test_greedy_picks_the_argmax_after_bias_and_penalties():
    logits = torch.tensor([[3.0, 2.0, 0.0]])
    assert sample(logits, SamplingParams()).item() == 0
    assert sample(logits, SamplingParams(logit_bias={2: 5.0})).item() == 2
    params = SamplingParams(frequency_penalty=0.75, min_p=0.9, top_k=1)
    assert sample(logits, params, output=torch.tensor([[0, 0]])).item() == 1  # 3 - 1.5 < 2


def test_defaults_leave_the_pipeline_as_it_was():
    """With the new options at their defaults (and an ``output`` given anyway), the logits
    are the repetition penalty, temperature, top-k and top-p of before, exactly."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    previous = torch.randint(0, 50, (3, 8), generator=torch.Generator().manual_seed(1))
    output = previous[:, 5:]
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, repetition_penalty=1.3)
    expected = apply_repetition_penalty(logits, previous, 1.3)
    expected = (expected - expected.max(-1, keepdim=True).values) / 0.8
    expected = top_p_filter(top_k_filter(expected, 10), 0.9)
    assert torch.equal(process_logits(logits, params, previous, output=output), expected)
    assert torch.equal(process_logits(logits, SamplingParams(), output=output), logits)
    assert torch.equal(sample(logits, SamplingParams(), output=output), logits.argmax(-1))


# Validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("bias, message", [
    ({1: 101}, r"logit_bias for token 1 must be a finite number in \[-100, 100\]"),
    ({1: -100.5}, r"\[-100, 100\]"),
    ({1: float("nan")}, "finite"),
    ({1: float("inf")}, "finite"),
    ({1: "high"}, "finite number"),
    ({-1: 1.0}, "token ids must be whole numbers >= 0"),
    ({"50256": 1.0}, r"int\(\)"),
    ({1.5: 1.0}, "whole numbers"),
    ([(3, 1.0), (3, 2.0)], "more than one bias"),
    (5, r"a dict \{token_id: bias\} or \(token_id, bias\) pairs"),
    ([(1, 2, 3)], "a dict"),
])
def test_bad_logit_bias_is_refused_clearly(bias, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(logit_bias=bias)


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -2.01, float("nan"), float("inf")])
def test_penalties_outside_openais_range_are_refused(name, value):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value})


@pytest.mark.parametrize("value", [-0.1, 1.1, float("nan")])
def test_min_p_outside_0_1_is_refused(value):
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=value)


def test_edges_of_the_ranges_are_accepted():
    SamplingParams(logit_bias={0: -100, 1: 100}, presence_penalty=-2, frequency_penalty=2,
                   min_p=1.0)
    SamplingParams(min_p=0.0, presence_penalty=2.0, frequency_penalty=-2.0)


@pytest.mark.parametrize("structured", [Regex("[0-9]+"), JsonSchema.of({"type": "integer"}),
                                        JsonObject(), Choice(("yes", "no")),
                                        Grammar('root ::= "a"'), None])
def test_structured_accepts_each_kind_of_constraint(structured):
    params = SamplingParams(structured=structured)
    assert params.structured == structured and hash(params) == hash(params)


@pytest.mark.parametrize("structured", ["[0-9]+", {"type": "integer"}, Regex])
def test_structured_of_another_type_is_refused_clearly(structured):
    with pytest.raises(ValueError, match="structured must be None or one of .*Regex.*Grammar"):
        SamplingParams(structured=structured)


def test_logit_bias_dict_becomes_sorted_pairs_and_params_stay_hashable():
    params = SamplingParams(logit_bias={5: 1, 2: -3.5})
    assert params.logit_bias == ((2, -3.5), (5, 1.0))
    assert all(type(t) is int and type(b) is float for t, b in params.logit_bias)
    same = SamplingParams(logit_bias=[(5, 1.0), (2, -3.5)])
    assert params == same and hash(params) == hash(same) and len({params, same}) == 1
    assert dataclasses.replace(params, temperature=1.0).logit_bias == params.logit_bias
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.logit_bias = ()  # type: ignore[misc]


def test_plain_greedy_and_uses_history():
    assert SamplingParams().plain_greedy and not SamplingParams().uses_history
    assert SamplingParams(min_p=0.5, top_k=3, top_p=0.5).plain_greedy
    assert SamplingParams(structured=JsonObject()).plain_greedy  # the engine's business
    assert not SamplingParams(temperature=1.0).plain_greedy
    assert not SamplingParams(logit_bias={1: 1.0}).plain_greedy
    assert not SamplingParams(logit_bias={1: 1.0}).uses_history
    for history in (dict(repetition_penalty=1.2), dict(presence_penalty=0.5),
                    dict(frequency_penalty=-0.5)):
        assert SamplingParams(**history).uses_history
        assert not SamplingParams(**history).plain_greedy


# Distributions: 20,000 seeded draws against the formula's softmax -------------------------

LOGITS = [1.0, 0.5, 0.0, -0.5, 2.0]


def test_logit_bias_samples_from_the_biased_softmax():
    bias = {0: -1.0, 2: 1.5, 4: -2.5}
    params = SamplingParams(temperature=1.0, logit_bias=bias, seed=0)
    expected = softmax([x + bias.get(j, 0.0) for j, x in enumerate(LOGITS)])
    assert_distributed_as(frequencies(params, LOGITS, seed=1), expected, softmax(LOGITS))


def test_logit_bias_of_minus_100_bans_a_token():
    params = SamplingParams(temperature=1.0, logit_bias={4: -100})
    assert frequencies(params, LOGITS, seed=2)[4] == 0


def test_presence_and_frequency_penalties_sample_from_the_penalised_softmax():
    output = [0, 0, 0, 1, 2, 2]  # c = (3, 1, 2, 0, 0)
    presence, frequency = 0.5, 0.3
    counts = [output.count(j) for j in range(5)]
    expected = softmax([x - c * frequency - (c > 0) * presence
                        for x, c in zip(LOGITS, counts, strict=True)])
    params = SamplingParams(temperature=1.0, presence_penalty=presence,
                            frequency_penalty=frequency)
    assert_distributed_as(frequencies(params, LOGITS, seed=3, output=output), expected,
                          softmax(LOGITS))


def test_min_p_never_draws_a_dropped_token_and_keeps_the_others_proportions():
    probs = [0.4, 0.3, 0.15, 0.1, 0.05]
    logits = [math.log(p) for p in probs]
    # min_p 0.3: threshold 0.3 · 0.4 = 0.12, so tokens 3 and 4 go; the rest renormalise
    kept = [p if p >= 0.12 else 0.0 for p in probs]
    expected = [p / sum(kept) for p in kept]
    params = SamplingParams(temperature=1.0, min_p=0.3)
    assert_distributed_as(frequencies(params, logits, seed=4), expected, probs)


def test_all_options_together_with_temperature_and_top_k():
    """z = l + b - c·α_f - 1[c > 0]·α_p, q = softmax(z / T), min-p on q, then top-k."""
    logits = [2.0, 1.0, 0.5, 0.0, -1.0]
    bias, output, presence, frequency, temperature = {3: 1.2}, [0, 0, 1], 0.4, 0.3, 0.7
    counts = [output.count(j) for j in range(5)]
    z = [x + bias.get(j, 0.0) - c * frequency - (c > 0) * presence
         for j, (x, c) in enumerate(zip(logits, counts, strict=True))]  # 1, 0.3, .5, 1.2, -1
    q = softmax([x / temperature for x in z])
    z = [x if p >= 0.1 * max(q) else -INF for x, p in zip(z, q, strict=True)]  # drops token 4
    third = sorted(z, reverse=True)[2]
    z = [x if x >= third else -INF for x in z]  # top-3 drops token 1
    expected = softmax([x / temperature for x in z])
    assert [p > 0 for p in expected] == [True, False, True, True, False]
    params = SamplingParams(temperature=temperature, top_k=3, min_p=0.1, logit_bias=bias,
                            presence_penalty=presence, frequency_penalty=frequency)
    assert_distributed_as(frequencies(params, logits, seed=5, output=output), expected,
                          softmax([x / temperature for x in logits]))


# The serving engine against the dense reference loop --------------------------------------

CONFIG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7], [9] * 11, [7, 8, 7, 8, 7]]
OPTIONS = [SamplingParams(presence_penalty=1.5, max_tokens=16),
           SamplingParams(frequency_penalty=0.8, logit_bias={3: 2.0}, max_tokens=16),
           SamplingParams(temperature=0.9, presence_penalty=-1.0, frequency_penalty=0.5,
                          min_p=0.05, seed=7, max_tokens=16),
           SamplingParams(temperature=1.1, logit_bias={0: -100, 5: 1.0}, min_p=0.1, seed=8,
                          max_tokens=16)]


@pytest.fixture(scope="module")
def model():
    return varied_random_model(CONFIG)


def alone(model, prompt, params):
    return generate(model, prompt, params.max_tokens, params)[0]


def test_engine_gives_what_the_dense_loop_gives(model):
    llm = LLM(model, block_size=4, num_blocks=96, scheduler=SchedulerConfig(max_batch=4))
    outputs = llm.generate(PROMPTS, OPTIONS, progress=False)
    assert [o.tokens for o in outputs] == [alone(model, p, sp)
                                           for p, sp in zip(PROMPTS, OPTIONS, strict=True)]
    assert llm.free_blocks() == llm.blocks.num_blocks


def test_speculation_skips_requests_whose_choice_depends_on_the_history(model):
    """Prompt-lookup guesses are verified for a greedy request with a logit bias (the bias
    does not depend on the tokens before), never made for one with a penalty; both give the
    dense loop's greedy tokens. (Sampled requests with guesses draw other, equally
    distributed, tokens: see test_engine_speculative.)"""
    options = [SamplingParams(logit_bias={3: 2.0, 7: -1.0}, max_tokens=16), OPTIONS[0],
               OPTIONS[1], SamplingParams(logit_bias={8: 1.5}, max_tokens=16)]
    llm = LLM(model, block_size=4, num_blocks=96,
              scheduler=SchedulerConfig(max_batch=4, speculative_tokens=4))
    outputs = llm.generate(PROMPTS, options, progress=False)
    assert [o.tokens for o in outputs] == [alone(model, p, sp)
                                           for p, sp in zip(PROMPTS, options, strict=True)]
    drafted = [o.outputs[0].drafted for o in outputs]
    assert drafted[1] == drafted[2] == 0 and drafted[0] + drafted[3] > 0
    assert llm.free_blocks() == llm.blocks.num_blocks


def test_penalties_change_what_the_model_says(model):
    """The options are honoured, not ignored: a greedy model that repeats itself stops
    repeating under a presence penalty, and a +100 bias forces its token."""
    plain = alone(model, PROMPTS[2], SamplingParams(max_tokens=16))
    penalised = alone(model, PROMPTS[2], OPTIONS[0])
    assert penalised != plain
    assert len(set(penalised)) > len(set(plain))
    assert alone(model, PROMPTS[0], SamplingParams(logit_bias={11: 100}, max_tokens=5)) \
        == [11] * 5
