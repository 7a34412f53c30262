"""The regex DFA: it matches what Python's ``re.fullmatch`` matches, it dies as soon as a text
can no longer match, it refuses what it does not support, and it finds forced text."""

from __future__ import annotations

import re
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.structured.regex_automaton import CharAutomaton, CharSet, compile_regex, forced_text

# Python warns about "--" in a class ("possible set difference") but still reads it literally.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?"
STRING = r'"([^"\\]|\\.)*"'
PERSON = r'\{"name": "[A-Za-z ]{1,20}", "age": [0-9]{1,3}\}'

EXAMPLES = [  # pattern, DFA size, matches, non-matches
    (NUMBER, 6, ["0", "-0", "7", "42", "-1.5", "3.14159", "10.0"],
     ["", "-", "01", "1.", ".5", "1e5", "--1", "1.2.3", "+1"]),
    (STRING, 4, ['""', '"abc"', '"say \\"hi\\""', '"back\\\\slash"', '"tab\\t"', '"ünï"'],
     ["", '"', '"abc', 'abc"', '"a"b"', '"\\"', '"a\\\nb"']),
    ("(yes|no|maybe)", 9, ["yes", "no", "maybe"], ["", "y", "yesno", "Yes", "mayb", "nope"]),
    ("[a-z]{2,4}", 5, ["ab", "abc", "abcd"], ["", "a", "abcde", "aB", "a1"]),
    (PERSON, 45, ['{"name": "Ada Lovelace", "age": 36}', '{"name": "B", "age": 100}'],
     ['{"name": "", "age": 1}', '{"name": "Ada", "age": 1000}', '{"name": "Ada", "age": }',
      '{"name": "Ada1", "age": 36}', '{"name":"Ada", "age": 36}']),
]


@pytest.mark.parametrize("pattern, size, good, bad", EXAMPLES)
def test_examples(pattern, size, good, bad):
    dfa = compile_regex(pattern)
    assert dfa.num_states == size  # the minimal DFA
    assert dfa.initial == 0
    assert dfa.live_states() == frozenset(range(size))
    for text in good:
        assert re.fullmatch(pattern, text)  # the lists themselves are right
        assert dfa.matches(text), text
        for end in range(len(text) + 1):  # every prefix of a match can still be completed
            assert dfa.walk(dfa.initial, text[:end]) is not None
    for text in bad:
        assert not re.fullmatch(pattern, text)
        assert not dfa.matches(text), text


@pytest.mark.parametrize("pattern, dead", [
    (STRING, ["x", '"a"b', '"a""']),
    (NUMBER, ["a", "00", "-.", "1..", "1.5."]),
    ("(yes|no|maybe)", ["ye!", "yo", "noo", "maybee"]),
    ("[a-z]{2,4}", ["abcde", "A", "a-"]),
    (PERSON, ['{"name": "Ada", "age": 1234', '{"a', '{"name": "Ada"}']),
])
def test_walk_dies_as_soon_as_nothing_can_match(pattern, dead):
    dfa = compile_regex(pattern)
    for text in dead:
        assert dfa.walk(dfa.initial, text) is None, text
        assert dfa.walk(dfa.initial, text[:-1]) is not None, text  # only the last char kills


def test_step_and_labels():
    dfa = compile_regex(STRING)
    inside = dfa.step(dfa.initial, '"')
    assert dfa.step(dfa.initial, "a") is None
    assert dfa.step(inside, "a") == dfa.step(inside, "\U0001f600") == inside
    assert dfa.is_accepting(dfa.step(inside, '"'))
    assert not dfa.is_accepting(inside)
    assert str(dfa).splitlines() == [
        '0 (start): " -> 1',
        '1: [^"\\\\] -> 1, " -> 2, \\\\ -> 3',
        "2 (accept): (no moves)",
        "3: [^\\n] -> 1",
    ]


def test_charset():
    assert CharSet(((5, 9), (0, 3), (4, 4))).ranges == ((0, 9),)  # sorted and merged
    quote = CharSet.of('"')
    assert quote.complement().ranges == ((0, 33), (35, 0x10FFFF))
    assert quote.complement().complement() == quote
    assert (CharSet.span("a", "c") | CharSet.of("z")).contains("b")
    assert not CharSet.span("a", "c").contains("d")
    assert [str(s) for s in (quote, CharSet.of("."), CharSet.span("0", "9"), CharSet.of(" "),
                             CharSet.of('"\\').complement(), CharSet.of("").complement())] == \
        ['"', "\\.", "[0-9]", "[ ]", '[^"\\\\]', "(any)"]


def test_syntax_and_escapes():
    cases = {
        r"\d+\.\d": (["12.5"], ["a.5", "1x5"]),
        r"\w\s\w": (["a b", "_\t9", "Z\nz"], ["a  b", "a-b"]),
        r"\D\W\S": (["a-b", "x !"], ["1-b", "a_b", "a- "]),
        ".": (["a", "\t", "é"], ["\n", ""]),
        r"[\d\-x]": (["5", "-", "x"], ["\\", "d"]),
        "[]a]": (["]", "a"], ["[]"]),
        "[a-]": (["a", "-"], ["b"]),
        r"[^\n]": (["a"], ["\n"]),
        r"a\{2\}\\": (["a{2}\\"], ["aa"]),
        "(?:ab|c){2}": (["abc", "cc", "abab"], ["ab", "ccc"]),
        "a{,2}b{1,}": (["b", "aabbb"], ["aaab", "a"]),
        "(a|)b?": (["", "a", "ab", "b"], ["aa"]),
    }
    for pattern, (good, bad) in cases.items():
        dfa = compile_regex(pattern)
        for text in good:
            assert dfa.matches(text) and re.fullmatch(pattern, text, re.ASCII), (pattern, text)
        for text in bad:
            assert not dfa.matches(text) and not re.fullmatch(pattern, text, re.ASCII)


def test_empty_language():
    dfa = compile_regex(r"[^\s\S]")
    assert dfa.num_states == 1 and dfa.live_states() == frozenset()
    assert dfa.walk(0, "") == 0 and dfa.step(0, "a") is None and not dfa.matches("")


@pytest.mark.parametrize("pattern, what, position", [
    ("^abc", "anchor", 0),
    ("abc$", "anchor", 3),
    (r"a\bc", "word-boundary anchor", 1),
    (r"(a)\1", "backreference", 3),
    ("(?=a)b", "unsupported group '(?='", 0),
    ("x(?<!a)b", "unsupported group '(?<'", 1),
    ("(?P<n>a)", "unsupported group '(?P'", 0),
    ("(?i)a", "unsupported group '(?i'", 0),
    ("a*?", "lazy quantifier", 2),
    ("a{1,2}?", "lazy quantifier", 6),
    ("a++", "possessive quantifier", 2),
    ("a**", "multiple repeat", 2),
    ("*a", "nothing to repeat", 0),
    ("a|+", "nothing to repeat", 2),
    ("a{3,2}", "min repeat greater than max repeat", 1),
    ("a{x}", "'{' that is not a quantifier", 1),
    ("[z-a]", "bad character range", 1),
    (r"[\d-z]", "bad character range", 1),
    ("[abc", "unterminated character class", 0),
    ("(ab", "missing ')'", 0),
    ("ab)", "unbalanced parenthesis", 2),
    ("ab\\", "backslash at the end", 2),
    (r"\x41", "unsupported escape '\\x'", 0),
])
def test_unsupported_syntax_is_refused(pattern, what, position):
    with pytest.raises(ValueError, match=re.escape(what) + f".* at position {position} "):
        compile_regex(pattern)


def test_forced_text():
    person = compile_regex(PERSON)
    assert forced_text(person, 0) == '{"name": "'
    after_name = person.walk(0, '{"name": "Ada')
    assert forced_text(person, after_name) == ""  # another letter or the closing quote
    after_age = person.walk(0, '{"name": "Ada", "age": 123')
    assert forced_text(person, after_age) == "}"
    choice = compile_regex("(yes|no|maybe)")
    assert forced_text(choice, 0) == ""
    assert forced_text(choice, choice.walk(0, "m")) == "aybe"
    optional = compile_regex("ab(cd)?")
    assert forced_text(optional, 0) == "ab"  # then stopping is allowed: not forced
    assert forced_text(compile_regex(STRING), 0) == '"'
    assert forced_text(compile_regex("a[bc]"), 0) == "a"


# ----------------------------------------------------------------------------- properties
# Random patterns over a few characters, against Python's re as the oracle.

ALPHABET = 'ab-0"'
TEXTS = st.text(alphabet=ALPHABET + "~\n", max_size=6)  # "~": outside; "\n": not matched by "."
CLASS_ITEMS = ["a", "b", "0", '"', "\\-", '\\"', "\\d", "\\w", "a-b", '"-0', "0-a", "\\n"]
BOUNDED = ["", "", "", "?", "{2}", "{0,2}", "{1,3}", "{,2}"]
QUANTIFIERS = [*BOUNDED, "*", "+", "{1,}"]


def char_classes(negatable: bool):
    items = st.lists(st.sampled_from(CLASS_ITEMS), min_size=1, max_size=3).map("".join)
    dash = st.sampled_from(["", "-"])  # a literal "-" first or last
    negation = st.sampled_from(["", "^"] if negatable else [""])
    return st.tuples(negation, dash, items, dash).map(lambda t: "[" + "".join(t) + "]")


def leaves(anything: bool):
    """Single-character pieces. Unless ``anything``, none of them can match "~"."""
    singles = [re.escape(c) for c in ALPHABET] + ['\\"', r"\d", r"\w", r"\n"]
    plain = st.one_of(st.sampled_from(singles), char_classes(negatable=False))
    if not anything:
        return plain
    return st.one_of(plain, st.sampled_from([".", r"\s", r"\D", r"\W", r"\S"]),
                     char_classes(negatable=True))


def alternation(atoms, quantifiers):
    """``seq|seq``: one or two sequences of 0-3 possibly quantified atoms."""
    piece = st.tuples(atoms, st.sampled_from(quantifiers)).map("".join)
    sequence = st.lists(piece, max_size=3).map("".join)
    return st.lists(sequence, min_size=1, max_size=2).map("|".join)


def patterns(anything: bool = True, quantifiers=QUANTIFIERS):
    group = st.sampled_from(["(", "(?:"])
    atoms = st.recursive(leaves(anything), lambda inner: st.tuples(
        group, alternation(inner, quantifiers)).map(lambda t: t[0] + t[1] + ")"), max_leaves=4)
    return alternation(atoms, quantifiers)


def completion(dfa: CharAutomaton, state: int) -> str:
    """A shortest text leading from ``state`` to an accepting state, by breadth-first search
    (one character per label, from the alphabet if it has one)."""
    paths, todo = {state: ""}, deque([state])
    while todo:
        here = todo.popleft()
        if dfa.is_accepting(here):
            return paths[here]
        for label, target in dfa.transitions[here]:
            if target not in paths:
                char = next((c for c in ALPHABET if label.contains(c)), chr(label.ranges[0][0]))
                paths[target] = paths[here] + char
                todo.append(target)
    raise AssertionError(f"no accepting state reachable from the live state {state}")


def labels_are_disjoint(dfa: CharAutomaton) -> bool:
    for moves in dfa.transitions:
        ranges = sorted(r for label, _ in moves for r in label.ranges)
        if any(hi >= lo for (_, hi), (lo, _) in zip(ranges, ranges[1:], strict=False)):
            return False
    return True


SETTINGS = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(patterns(), st.lists(TEXTS, max_size=12))
def test_matches_like_python_re(pattern, texts):
    dfa = compile_regex(pattern)
    assert labels_are_disjoint(dfa)
    for text in texts:
        assert dfa.matches(text) == (re.fullmatch(pattern, text, re.ASCII) is not None), text


@SETTINGS
@given(patterns(quantifiers=BOUNDED), st.data())  # no stars: they make re backtrack for ages
def test_prefixes_of_matches_stay_alive(pattern, data):
    dfa = compile_regex(pattern)
    for _ in range(3):
        text = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True))
        assert dfa.matches(text)
        for end in range(len(text)):
            assert dfa.walk(dfa.initial, text[:end]) is not None, text[:end]


@SETTINGS
@given(patterns(), st.lists(TEXTS, max_size=12))
def test_alive_means_some_completion_matches(pattern, texts):
    dfa = compile_regex(pattern)
    for text in texts:
        state = dfa.walk(dfa.initial, text)
        if state is not None:
            rest = completion(dfa, state)
            assert re.fullmatch(pattern, text + rest, re.ASCII)
            assert rest.startswith(forced_text(dfa, state))  # every way forward starts so


@SETTINGS
@given(patterns(anything=False), TEXTS, TEXTS)
def test_walk_dies_at_a_character_that_can_never_occur(pattern, before, after):
    dfa = compile_regex(pattern)
    assert dfa.walk(dfa.initial, before + "~") is None
    assert dfa.walk(dfa.initial, before + "~" + after) is None


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=12))
def test_an_escaped_string_is_all_forced(text):
    dfa = compile_regex(re.escape(text))
    assert dfa.matches(text)
    assert forced_text(dfa, dfa.initial) == text
    assert dfa.num_states == len(text) + 1
