"""Graded tests for chapter 16 (structured output): exercise 16.2, the token index.

Oracles: the library's readable mask definition (``token_mask`` plus the stop rule) on
random vocabularies and over SmolLM2's 49,152 tokens in every state, and xgrammar, the
production library, at a token path to every state. Your index in the engine is graded in
``test_ch16_structured__your_pieces_in_the_engine.py``.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
import torch
from ch16_patterns import ALPHABET, PATTERNS, SETTINGS, VOCAB, hand_made, patterns
from hypothesis import given
from hypothesis import strategies as st

from minillm.grading import load_impl
from minillm.structured.regex_automaton import CharAutomaton, compile_regex
from minillm.structured.token_index import token_index as library_token_index
from minillm.structured.token_mask import token_mask, token_texts

impl = load_impl("ch16_structured")


# -- 16.2 the token index -----------------------------------------------------------------------

def expected_mask(dfa: CharAutomaton, state: int, texts, stops) -> torch.Tensor:
    """The readable definition: every token text walked, the stop tokens by the stop rule."""
    mask = token_mask(dfa, state, texts).clone()
    mask[list(stops)] = dfa.is_accepting(state)
    return mask


def check_mask(mask, expected, texts, context):
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool, type(mask)
    assert mask.shape == expected.shape, (mask.shape, expected.shape)
    differ = (mask != expected).nonzero().flatten().tolist()
    assert not differ, (f"{context}: {len(differ)} tokens differ, e.g. "
                        f"{[(i, texts[i], bool(expected[i])) for i in differ[:4]]} "
                        "(token, its text, the right answer)")


class ReadOnce(list):
    """A vocabulary that refuses to be read once :meth:`lock` is called."""

    locked = False

    def lock(self):
        self.locked = True

    def _check(self):
        if self.locked:
            raise AssertionError("mask_of read the token texts again: build an index once, "
                                 "in token_index, and compute masks from it")

    def __getitem__(self, i):
        self._check()
        return super().__getitem__(i)

    def __iter__(self):
        self._check()
        return super().__iter__()

    def __len__(self):
        self._check()
        return super().__len__()


@pytest.mark.exercise("16.2", points=1)
def test_token_index_on_a_hand_made_automaton():
    texts = ["a", "ab", "ab1", "b", "b12", "1", "12", "1a", "", None, "abc", "x", None]
    stops = [9, 12]  # stop tokens: no text of their own
    mask_of = impl.token_index(hand_made(), texts, stops)
    allowed = [mask_of(state).nonzero().flatten().tolist() for state in range(3)]
    assert allowed[0] == [0, 1, 2]  # "ab1" walks all three states; "a" need not accept
    assert allowed[1] == [3, 4]
    assert allowed[2] == [5, 6, 9, 12]  # accepting: the stop tokens too; "1a" dies at "a"


@pytest.mark.exercise("16.2", points=1)
def test_token_index_edge_cases():
    # the empty-string language: only the stop tokens, at once
    only_empty = compile_regex("")
    assert impl.token_index(only_empty, ["a", "", None, " "], [2])(0).tolist() == \
        [False, False, True, False]
    # a stop token that has a text follows the stop rule, not its text
    letters = compile_regex("a+")
    mask_of = impl.token_index(letters, ["a", "b", "a"], [2])
    assert mask_of(0).tolist() == [True, False, False]
    assert mask_of(letters.walk(0, "a")).tolist() == [True, False, True]
    # nothing matches: nothing is allowed, not even a stop
    assert not impl.token_index(compile_regex(r"[^\s\S]"), ["a", None], [1])(0).any()


@pytest.mark.exercise("16.2", points=1)
def test_token_index_never_reads_the_texts_again():
    dfa = compile_regex(r'"([^"\\]|\\[nt"])*"')
    texts = ReadOnce(['"', 'a"', '\\n', '\\', '"x"', None, "", "ab", '\\"', "\\q"])
    mask_of = impl.token_index(dfa, texts, [5])
    texts.lock()
    masks = [mask_of(state) for state in range(dfa.num_states)]
    texts.locked = False
    for state, mask in enumerate(masks):
        check_mask(mask, expected_mask(dfa, state, texts, [5]), texts, f"state {state}")


VOCABULARIES = st.lists(st.one_of(st.none(), st.text(alphabet=ALPHABET + "~\n", max_size=5)),
                        min_size=1, max_size=40)


@pytest.mark.exercise("16.2", points=3)
@SETTINGS
@given(patterns(), VOCABULARIES, st.data())
def test_token_index_equals_the_definition_on_random_vocabularies(pattern, texts, data):
    dfa = compile_regex(pattern)
    stops = data.draw(st.lists(st.integers(0, len(texts) - 1), max_size=2, unique=True))
    mask_of = impl.token_index(dfa, texts, stops)
    for state in random.Random(len(texts)).sample(range(dfa.num_states), dfa.num_states):
        check_mask(mask_of(state), expected_mask(dfa, state, texts, stops), texts,
                   f"{pattern!r} state {state}")


@pytest.fixture(scope="module")
def texts(tokenizer):  # tokenizer: tests/conftest.py's fixture
    return token_texts(tokenizer.hf, VOCAB)


@pytest.mark.exercise("16.2", points=2)
@pytest.mark.smollm2
@pytest.mark.parametrize("pattern", PATTERNS + [r'"([^"\\]|\\.)*"', r"[\s\S]*"])
def test_token_index_over_smollm2_equals_the_library_in_every_state(texts, tokenizer, pattern):
    dfa = compile_regex(pattern)
    stops = list(tokenizer.stop_tokens)
    mask_of, library = impl.token_index(dfa, texts, stops), library_token_index(dfa, texts, stops)
    for state in range(dfa.num_states):
        check_mask(mask_of(state), library(state), texts, f"{pattern!r} state {state}")


def token_paths(dfa: CharAutomaton, texts, stops) -> dict[int, list[int]]:
    """A shortest token sequence to every state a token boundary can reach."""
    mask_of = library_token_index(dfa, texts, stops)
    paths, todo = {dfa.initial: []}, deque([dfa.initial])
    while todo:
        state = todo.popleft()
        allowed = mask_of(state)
        allowed[stops] = False
        for token in allowed.nonzero().flatten().tolist():
            following = dfa.walk(state, texts[token])
            if following not in paths:
                paths[following] = paths[state] + [token]
                todo.append(following)
    return paths


@pytest.fixture(scope="module")
def xgrammar_compiler(tokenizer):
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer.hf, vocab_size=VOCAB,
                                                   stop_token_ids=list(tokenizer.stop_tokens))
    return xgrammar.GrammarCompiler(info, max_threads=2)


@pytest.mark.exercise("16.2", points=2)
@pytest.mark.smollm2
@pytest.mark.parametrize("pattern", PATTERNS)
def test_token_index_agrees_with_xgrammar_in_every_reachable_state(
        texts, tokenizer, xgrammar_compiler, pattern):
    """xgrammar follows a token path to each state; your mask must allow the tokens its
    bitmask allows (among the tokens that are text of their own, and the stop tokens)."""
    import xgrammar

    dfa, stops = compile_regex(pattern), list(tokenizer.stop_tokens)
    mask_of = impl.token_index(dfa, texts, stops)
    grammar = xgrammar_compiler.compile_regex(pattern)
    bitmask = xgrammar.allocate_token_bitmask(1, VOCAB)
    compared = torch.tensor([text is not None for text in texts])
    compared[stops] = True
    for state, path in token_paths(dfa, texts, stops).items():
        matcher = xgrammar.GrammarMatcher(grammar)
        assert all(matcher.accept_token(token) for token in path)
        matcher.fill_next_token_bitmask(bitmask)
        logits = torch.zeros(1, VOCAB)
        xgrammar.apply_token_bitmask_inplace(logits, bitmask)
        theirs = logits[0] == 0
        differ = ((mask_of(state) != theirs) & compared).nonzero().flatten().tolist()
        done = "".join(texts[token] for token in path)
        examples = [(i, texts[i], bool(theirs[i])) for i in differ[:4]]
        assert not differ, (f"{pattern!r} after {done!r}: {len(differ)} tokens differ from "
                            f"xgrammar's, e.g. {examples} (token, its text, xgrammar's)")
