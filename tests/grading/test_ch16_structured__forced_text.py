"""Graded tests for chapter 16 (structured output): exercise 16.3, forced text, a warm-up
checked against the library's ``forced_text``.
"""

from __future__ import annotations

import random
import re

import pytest
from ch16_patterns import PERSON, YES_NO, hand_made

from minillm.grading import load_impl
from minillm.structured.regex_automaton import compile_regex
from minillm.structured.regex_automaton import forced_text as library_forced_text

impl = load_impl("ch16_structured")


# -- 16.3 forced text (a warm-up) ---------------------------------------------------------------

@pytest.mark.exercise("16.3", points=1)
def test_forced_text_on_a_hand_made_automaton():
    dfa = hand_made()
    assert impl.forced_text(dfa, 0) == "ab"
    assert impl.forced_text(dfa, 1) == "b"
    assert impl.forced_text(dfa, 2) == ""  # accepting, and [0-9] is a choice anyway


@pytest.mark.exercise("16.3", points=2)
@pytest.mark.parametrize("pattern, prefix, expected", [
    (PERSON, "", '{"name": "'),
    (PERSON, '{"name": "Ada', ""),  # another letter, or the closing quote
    (PERSON, '{"name": "Ada"', ', "age": '),
    (PERSON, '{"na', 'me": "'),
    (PERSON, '{"name": "Ada", "age": 36', ""),  # a digit or "}"
    (PERSON, '{"name": "Ada", "age": 36}', ""),  # the end
    (YES_NO, "", ""),  # y or n
    (YES_NO, "y", "es"),
    (YES_NO, "n", "o"),
    ("abc(de)?", "", "abc"),  # stops at an accepting state: ending there is a choice
    ("abc(de)?", "abc", ""),
    ("abc(de)?", "abcd", "e"),
    ("x[0-9]y", "", "x"),  # [0-9] is one move but ten characters
    ("x[0-9]y", "x5", "y"),
    ("(ab|ac)d", "", "a"),
    ("(ab|ac)d", "ab", "d"),
    ("a+b", "", "a"),
    ("a+b", "a", ""),  # another a, or b
    ("Yes\\.", "", "Yes."),
])
def test_forced_text_examples(pattern, prefix, expected):
    dfa = compile_regex(pattern)
    assert impl.forced_text(dfa, dfa.walk(dfa.initial, prefix)) == expected


def random_regex(rng: random.Random, depth: int = 0) -> str:
    """A small random pattern with runs of literals (where text gets forced), classes,
    choices, optional parts and repeats."""
    parts = []
    for _ in range(rng.randint(1, 4 - 2 * depth)):
        kind = rng.random()
        if kind < 0.45:
            atom = "".join(rng.choice('ab{}":, x') for _ in range(rng.randint(1, 4)))
            atom = re.escape(atom).replace("\\ ", " ")
        elif kind < 0.65:
            atom = rng.choice(["[0-9]", "[a-c]", "[xy]", ".", "\\d", '[^"]'])
        elif kind < 0.85 and depth == 0:
            options = [random_regex(rng, depth + 1) for _ in range(rng.randint(1, 3))]
            atom = "(" + "|".join(options) + ")"
        else:
            atom = rng.choice("abxy")
        if len(atom) > 1 and not atom.startswith(("(", "[", "\\")):
            atom = f"({atom})"
        parts.append(atom + rng.choice(["", "", "", "?", "*", "+", "{2}", "{1,3}"]))
    return "".join(parts)


@pytest.mark.exercise("16.3", points=2)
def test_forced_text_equals_the_library_on_random_regexes():
    rng = random.Random(16)
    checked = forced = 0
    for _ in range(300):
        pattern = random_regex(rng)
        dfa = compile_regex(pattern)
        for state in range(dfa.num_states):
            expected = library_forced_text(dfa, state)
            assert impl.forced_text(dfa, state) == expected, (pattern, state, dfa.describe())
            checked += 1
            forced += expected != ""
    assert checked > 1000 and forced > 200  # the random patterns do force text
