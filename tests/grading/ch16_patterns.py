"""What chapter 16's graded tests share (``test_ch16_structured__*.py``): patterns, their
Hypothesis settings, random patterns and texts over a few characters, and a hand-made
automaton. Not a test file: the graded files import it."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from minillm.structured.regex_automaton import CharAutomaton, CharSet

VOCAB = 49152  # SmolLM2's
NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?"
PERSON = r'\{"name": "[A-Za-z ]{1,8}", "age": [0-9]{1,3}\}'
YES_NO = r"(yes|no)"
# digits, JSON-ish, a choice, optional groups, Unicode classes, a first mask of one token
# ("&" starts one SmolLM2 token), and the language of the empty string alone
PATTERNS = [r"[0-9]{1,4}", NUMBER, PERSON, r"(yes|no|maybe)", r"(Mr|Ms)\.? [A-Z][a-z]+( Jr\.)?",
            r"[à-ÿ]+( [α-ω]+)?", r"(café|thé|naïve)", r"&[a-z]{1,3};", r""]
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


# -- random patterns ---------------------------------------------------------------------------
# Over a few characters (Unicode ones too), with classes that overlap, negated classes and
# the empty class [^\s\S], which makes a piece of the pattern match nothing.

ALPHABET = 'ab-0"éλ'
TEXTS = st.text(alphabet=ALPHABET + "~\n", max_size=6)  # "~": outside; "\n": not in "."
CLASS_ITEMS = ["a", "b", "0", '"', "\\-", "\\d", "\\w", "a-b", '"-0', "0-a", "é", "à-ÿ",
               "α-ω", "\\n"]
BOUNDED = ["", "", "", "?", "{2}", "{0,2}", "{1,3}"]
QUANTIFIERS = [*BOUNDED, "*", "+", "{1,}"]


def char_classes():
    items = st.lists(st.sampled_from(CLASS_ITEMS), min_size=1, max_size=3).map("".join)
    return st.tuples(st.sampled_from(["", "^"]), items).map(lambda t: f"[{t[0]}{t[1]}]")


def leaves():
    singles = [re.escape(c) for c in ALPHABET] + [r"\d", r"\w", r"\n", ".", r"\D", r"\S",
                                                  r"[^\s\S]"]
    return st.one_of(st.sampled_from(singles), char_classes())


def alternation(atoms, quantifiers):
    piece = st.tuples(atoms, st.sampled_from(quantifiers)).map("".join)
    sequence = st.lists(piece, max_size=3).map("".join)
    return st.lists(sequence, min_size=1, max_size=3).map("|".join)


def patterns(quantifiers=QUANTIFIERS):
    atoms = st.recursive(leaves(), lambda inner: alternation(inner, quantifiers).map(
        lambda body: f"({body})"), max_leaves=5)
    return alternation(atoms, quantifiers)


def hand_made() -> CharAutomaton:
    """``ab[0-9]*`` by hand: 0 -a-> 1 -b-> 2 (accepting) -[0-9]-> 2."""
    return CharAutomaton(initial=0, accepting=frozenset({2}), transitions=(
        ((CharSet.of("a"), 1),),
        ((CharSet.of("b"), 2),),
        ((CharSet.span("0", "9"), 2),)))
