"""Graded tests for chapter 16 (structured output).

The lab: your subset construction (16.1) and your token index (16.2). Oracles: Python's
``re`` and the library's compiler (:func:`minillm.structured.regex_automaton.compile_regex`)
on Hypothesis-generated patterns and texts, drawn at random and from each pattern's own
language; the library's readable mask definition (``token_mask`` plus the stop rule) on
random vocabularies and over SmolLM2's 49,152 tokens in every state; xgrammar, the
production library, at a token path to every state; and the engine, which must write with
your pieces exactly the tokens it writes with the library's. Exercise 16.3, forced text,
is a warm-up checked against the library's ``forced_text``.
"""

from __future__ import annotations

import functools
import random
import re
from collections import deque

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.sampling import SamplingParams
from minillm.serve import LLM
from minillm.structured import Choice, Regex
from minillm.structured.backend import AutomatonBackend
from minillm.structured.dfa import live_states
from minillm.structured.regex_automaton import CharAutomaton, CharSet, compile_regex, thompson_nfa
from minillm.structured.regex_automaton import forced_text as library_forced_text
from minillm.structured.token_index import token_index as library_token_index
from minillm.structured.token_mask import token_mask, token_texts
from minillm.testing import TINY, varied_random_model

impl = load_impl("ch16_structured")

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


def yours(pattern: str) -> CharAutomaton:
    """``pattern``'s automaton through your subset construction."""
    return impl.determinize(*thompson_nfa(pattern))


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
    yours("a")  # fail here, before the engine
    backend = functools.partial(AutomatonBackend, compile_fn=impl.your_regex_compiler)
    assert engine_tokens(tokenizer, backend) == library_engine_tokens


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


def hand_made() -> CharAutomaton:
    """``ab[0-9]*`` by hand: 0 -a-> 1 -b-> 2 (accepting) -[0-9]-> 2."""
    return CharAutomaton(initial=0, accepting=frozenset({2}), transitions=(
        ((CharSet.of("a"), 1),),
        ((CharSet.of("b"), 2),),
        ((CharSet.span("0", "9"), 2),)))


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
