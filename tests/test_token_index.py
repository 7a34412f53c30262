"""The token index gives, in every state, the mask of the readable definition
(:func:`token_mask`, plus the stop tokens exactly where the automaton accepts): on random
patterns over small random vocabularies, and on SmolLM2's whole vocabulary."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_regex_automaton import ALPHABET, patterns

from minillm.structured.regex_automaton import compile_regex
from minillm.structured.token_index import token_index
from minillm.structured.token_mask import token_mask, token_texts

STOPS = [0, 2]


def expected_mask(dfa, state, texts, stops):
    mask = token_mask(dfa, state, texts).clone()
    mask[stops] = dfa.is_accepting(state)
    return mask


VOCABULARIES = st.lists(st.one_of(st.none(), st.text(alphabet=ALPHABET + "~\né", max_size=5)),
                        min_size=3, max_size=40)


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(patterns(), VOCABULARIES)
def test_the_index_gives_the_definitions_masks(pattern, texts):
    dfa = compile_regex(pattern)
    mask_of = token_index(dfa, texts, STOPS)
    for state in range(dfa.num_states):
        assert torch.equal(mask_of(state), expected_mask(dfa, state, texts, STOPS)), state


def test_edge_cases():
    empty = compile_regex(r"[^\s\S]")  # matches nothing: one state, nothing allowed
    assert not token_index(empty, ["a", None, ""], [1])(0).any()
    nothing_but_empty = compile_regex("")  # matches "" only: a stop, and no text
    assert token_index(nothing_but_empty, ["a", None, ""], [1])(0).tolist() == \
        [False, True, False]
    assert token_index(compile_regex("a*"), [], [])(0).shape == (0,)
    # a stop token's text (if it has one) does not matter: the stop rule decides
    letters = compile_regex("a+")
    assert token_index(letters, ["a", "b"], [0])(0).tolist() == [False, False]


@pytest.mark.smollm2
@pytest.mark.parametrize("pattern", [r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", r'"([^"\\]|\\.)*"',
                                     r'\{"name": "[A-Za-zé ]{1,6}", "age": [0-9]{1,3}\}',
                                     r"(yes|no|maybe)", r"[\s\S]*", r"&[a-z]+"])
def test_on_smollm2s_vocabulary(tokenizer, pattern):
    texts = token_texts(tokenizer.hf, 49152)
    dfa = compile_regex(pattern)
    mask_of = token_index(dfa, texts, tokenizer.stop_tokens)
    for state in range(dfa.num_states):
        expected = expected_mask(dfa, state, texts, tokenizer.stop_tokens)
        assert torch.equal(mask_of(state), expected), (pattern, state)
