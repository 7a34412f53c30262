"""Graded tests for chapter 16 (structured output): exercise 16.1, the subset construction.

Oracles: Python's ``re`` and the library's compiler
(:func:`minillm.structured.regex_automaton.compile_regex`) on Hypothesis-generated patterns
and texts, drawn at random and from each pattern's own language. Your compiler in the
engine is graded in ``test_ch16_structured__your_pieces_in_the_engine.py``.
"""

from __future__ import annotations

import random
import re

import pytest
from ch16_patterns import SETTINGS, TEXTS, patterns
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.grading import load_impl
from minillm.structured.dfa import live_states
from minillm.structured.regex_automaton import CharAutomaton, compile_regex, thompson_nfa

impl = load_impl("ch16_structured")


def yours(pattern: str) -> CharAutomaton:
    """``pattern``'s automaton through your subset construction."""
    return impl.determinize(*thompson_nfa(pattern))


# -- 16.1 the subset construction ---------------------------------------------------------------

def check_deterministic_without_dead_states(dfa: CharAutomaton, pattern: str) -> None:
    """Labels non-empty and disjoint, targets in range; every state reachable and live (a
    pattern matching nothing: one state, no moves)."""
    assert isinstance(dfa, CharAutomaton), type(dfa)
    states = range(len(dfa.transitions))
    assert dfa.initial in states and all(s in states for s in dfa.accepting), pattern
    for state, moves in enumerate(dfa.transitions):
        ranges = sorted(r for label, _ in moves for r in label.ranges)
        assert all(label.ranges and target in states for label, target in moves), \
            (pattern, state, "an empty label, or a target that is no state")
        assert all(hi < lo for (_, hi), (lo, _) in zip(ranges, ranges[1:], strict=False)), \
            (pattern, state, "two labels of one state overlap: not deterministic")
    if not dfa.accepting:
        assert dfa.transitions == ((),), (pattern, "matches nothing: one state, no moves")
        return
    reachable, todo = {dfa.initial}, [dfa.initial]
    while todo:
        for _, target in dfa.transitions[todo.pop()]:
            if target not in reachable:
                reachable.add(target)
                todo.append(target)
    assert reachable == set(states), (pattern, "states the initial state never reaches")
    dead = set(states) - live_states(dfa.accepting, dfa.transitions)
    assert not dead, (pattern, f"dead states {sorted(dead)}", dfa.describe())


def same_language_on(mine: CharAutomaton, library: CharAutomaton, text: str, pattern: str):
    """Both accept ``text`` or neither does, and both die at the same character."""
    for end in range(len(text) + 1):
        prefix = text[:end]
        assert (mine.walk(mine.initial, prefix) is None) == \
            (library.walk(library.initial, prefix) is None), (pattern, prefix, "alive?")
    assert mine.matches(text) == library.matches(text), (pattern, text, "matches?")


@pytest.mark.exercise("16.1", points=1)
@pytest.mark.parametrize("pattern, good, bad", [
    ("ab|ac", ["ab", "ac"], ["a", "abc", "b", ""]),
    ("a*b", ["b", "ab", "aaab"], ["", "a", "ba"]),
    ("[a-c]x|[b-d]y", ["ax", "bx", "by", "cy", "dy"], ["ay", "dx", "x"]),  # labels overlap
    ("(a|ab)(c|bcd)", ["ac", "abcd", "abc", "abbcd"], ["ab", "abd", "abcc"]),
    ("[0-9]+(\\.[0-9]+)?", ["7", "3.14"], ["3.", ".5", "1..2"]),
    ("[à-ÿ]+é?", ["ü", "éé", "àé"], ["", "e", "aé"]),
    (".[^a]", ["\U0010ffffb", "ab", "éλ"], ["\na", "aa", "a"]),
])
def test_determinize_on_small_patterns(pattern, good, bad):
    dfa = yours(pattern)
    check_deterministic_without_dead_states(dfa, pattern)
    for text in good:
        assert dfa.matches(text), (pattern, text, "should match")
    for text in bad:
        assert not dfa.matches(text), (pattern, text, "should not match")


@pytest.mark.exercise("16.1", points=1)
def test_determinize_edge_cases():
    only_empty = yours("")  # the language of the empty string alone
    check_deterministic_without_dead_states(only_empty, "")
    assert only_empty.matches("") and only_empty.walk(only_empty.initial, "a") is None
    nothing = yours(r"[^\s\S]")  # matches nothing
    assert nothing.transitions == ((),) and not nothing.accepting
    half_dead = yours(r"a[^\s\S]|b|c[^\s\S]d")  # two branches can never finish
    check_deterministic_without_dead_states(half_dead, "a[^\\s\\S]|b|c[^\\s\\S]d")
    assert half_dead.walk(half_dead.initial, "a") is None
    assert half_dead.walk(half_dead.initial, "c") is None and half_dead.matches("b")
    optional = yours("(a?)*")  # the start may be accepting and loop
    assert optional.matches("") and optional.matches("aaa") and not optional.matches("b")


@pytest.mark.exercise("16.1", points=2)
@SETTINGS
@given(patterns())
def test_determinize_is_deterministic_with_no_dead_states(pattern):
    check_deterministic_without_dead_states(yours(pattern), pattern)


@pytest.mark.exercise("16.1", points=2)
@SETTINGS
@given(patterns(), st.lists(TEXTS, max_size=15))
def test_determinize_accepts_the_librarys_language_on_random_texts(pattern, texts):
    mine, library = yours(pattern), compile_regex(pattern)
    for text in texts:
        same_language_on(mine, library, text, pattern)
        assert mine.matches(text) == (re.fullmatch(pattern, text, re.ASCII) is not None)


def distances_to_accepting(dfa: CharAutomaton) -> dict[int, int]:
    """Per state, the fewest characters to an accepting state."""
    distance = {state: 0 for state in dfa.accepting}
    while len(distance) < dfa.num_states:
        before = len(distance)
        for state, moves in enumerate(dfa.transitions):
            ahead = [distance[target] for _, target in moves if target in distance]
            if state not in distance and ahead:
                distance[state] = min(ahead) + 1
        assert len(distance) > before, "the library's automaton has a dead state"
    return distance


def drawn_from(dfa: CharAutomaton, rng: random.Random, length: int = 8) -> str:
    """A text of the language: a random walk through the library's automaton that heads for
    the nearest accepting state once it is ``length`` characters long."""
    distance, state, chars = distances_to_accepting(dfa), dfa.initial, []
    while not dfa.is_accepting(state) or (len(chars) < length and rng.random() < 0.7
                                          and dfa.transitions[state]):
        moves = dfa.transitions[state]
        if len(chars) >= length:
            moves = [min(moves, key=lambda move: distance[move[1]])]
        label, state = rng.choice(moves)
        lo, hi = rng.choice(label.ranges)
        chars.append(chr(rng.choice([lo, hi, rng.randint(lo, hi)])))
    return "".join(chars)


@pytest.mark.exercise("16.1", points=2)
@settings(SETTINGS, max_examples=40)
@given(patterns(), st.randoms(use_true_random=False), st.lists(TEXTS, min_size=4, max_size=4))
def test_determinize_accepts_texts_drawn_from_the_language(pattern, rng, tails):
    mine, library = yours(pattern), compile_regex(pattern)
    if not library.accepting:
        return  # nothing to draw from
    for tail in tails:
        text = drawn_from(library, rng)
        assert re.fullmatch(pattern, text, re.ASCII), (pattern, text)  # the walk is right
        assert mine.matches(text), (pattern, text, "is in the language")
        same_language_on(mine, library, text + tail, pattern)
