"""Graded tests for chapter 16 (structured output).

Oracles: hand-worked examples on small automata and tiny vocabularies; the library's
``token_mask`` and ``forced_text`` (minillm.structured), over SmolLM2's 49,152 token texts
and on random regexes; xgrammar, the production library, whose token bitmask must allow
the same tokens as your mask at every step of a walk through a valid output; and the
engine: SmolLM2 decoding greedily under a regex with *your* mask as the course's backend
must write the very tokens the default (xgrammar) engine writes.
"""

from __future__ import annotations

import functools
import random
import re

import pytest
import torch

from minillm.grading import load_impl
from minillm.structured.regex_automaton import CharAutomaton, CharSet, compile_regex
from minillm.structured.regex_automaton import forced_text as library_forced_text
from minillm.structured.token_mask import token_mask as library_token_mask
from minillm.structured.token_mask import token_texts

impl = load_impl("ch16_structured")

VOCAB = 49152  # SmolLM2's
NUMBER = r"-?(0|[1-9][0-9]*)"
WORD = r'"[a-z]{1,8}"'
YES_NO = r"(yes|no)"
DECIMAL = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?"
PERSON = r'\{"name": "[A-Za-z ]{1,20}", "age": [0-9]{1,3}\}'
STRING = r'"([^"\\]|\\.)*"'


@pytest.fixture(scope="module")
def texts(tokenizer):  # tokenizer, smollm2: tests/conftest.py's fixtures
    return token_texts(tokenizer.hf, VOCAB)


def allowed(mask) -> list[int]:
    return torch.as_tensor(mask).nonzero().flatten().tolist()


def hand_made() -> CharAutomaton:
    """``ab[0-9]*`` by hand: 0 -a-> 1 -b-> 2 (accepting) -[0-9]-> 2."""
    return CharAutomaton(initial=0, accepting=frozenset({2}), transitions=(
        ((CharSet.of("a"), 1),),
        ((CharSet.of("b"), 2),),
        ((CharSet.span("0", "9"), 2),)))


# -- 16.1 token masks -------------------------------------------------------------------------

@pytest.mark.exercise("16.1", points=1)
def test_token_mask_on_a_hand_made_automaton():
    dfa = hand_made()
    texts = ["a", "ab", "ab1", "b", "b12", "1", "12", "1a", "", None, "abc", "x"]
    mask = impl.token_mask(dfa, 0, texts)
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool
    assert mask.shape == (len(texts),)
    assert allowed(mask) == [0, 1, 2]  # a, ab, ab1: "ab1" walks all three states
    assert allowed(impl.token_mask(dfa, 1, texts)) == [3, 4]  # b, b12
    assert allowed(impl.token_mask(dfa, 2, texts)) == [5, 6]  # 1, 12 ("1a" dies at "a")


@pytest.mark.exercise("16.1", points=2)
@pytest.mark.parametrize("pattern, prefix, texts, expected", [
    # a number: "-" alone is no number but may start one; "00" and "0-" die
    (NUMBER, "", ["-", "-4", "0", "00", "42", "4a", " 4", "-0-", None, ""],
     [True, True, True, False, True, False, False, False, False, False]),
    (NUMBER, "-", ["-", "0", "12", "012", "1-"], [False, True, True, False, False]),
    (NUMBER, "7", ["0", "99", "-", ".", ""], [True, True, False, False, False]),
    # a quoted word of 1 to 8 letters: tokens may carry the closing quote along
    (WORD, "", ['"', '"a', '"abc"', 'a', '""', '" a'], [True, True, True, False, False, False]),
    (WORD, '"abcdef', ["gh", 'gh"', "ghi", 'g"', '"', '"x'],
     [True, True, False, True, True, False]),
    (WORD, '"abc"', ['"', "a", " "], [False, False, False]),  # the end: nothing may follow
    # choices: a token that is a prefix of one option, or crosses into it
    (YES_NO, "", ["y", "yes", "ye", "no", "n", "yesno", "nope", "es"],
     [True, True, True, True, True, False, False, False]),
    (YES_NO, "y", ["es", "e", "s", "no"], [True, True, False, False]),
])
def test_token_mask_examples(pattern, prefix, texts, expected):
    dfa = compile_regex(pattern)
    state = dfa.walk(dfa.initial, prefix)
    assert impl.token_mask(dfa, state, texts).tolist() == expected


@pytest.mark.exercise("16.1", points=1)
def test_token_mask_never_allows_none_or_empty_texts():
    dfa = compile_regex(r"[a-z]*")  # accepting everywhere: "" would walk nowhere and live
    texts = [None, "", "a", None, "", "zz", "A"]
    assert impl.token_mask(dfa, dfa.initial, texts).tolist() == \
        [False, False, True, False, False, True, False]


@pytest.mark.exercise("16.1", points=2)
@pytest.mark.smollm2
@pytest.mark.parametrize("pattern, prefixes", [
    (NUMBER, ["", "-", "1", "0"]),
    (WORD, ["", '"a', '"abcdefgh', '"ab"']),
    (YES_NO, ["", "y", "ye", "n"]),
    (STRING, ["", '"ab', '"a\\'])])
def test_token_mask_equals_the_library_over_smollm2s_vocabulary(texts, pattern, prefixes):
    dfa = compile_regex(pattern)
    for prefix in prefixes:
        state = dfa.walk(dfa.initial, prefix)
        mask = impl.token_mask(dfa, state, texts)
        expected = library_token_mask(dfa, state, texts)
        assert mask.dtype == torch.bool and mask.shape == (VOCAB,)
        differ = (mask != expected).nonzero().flatten().tolist()
        assert not differ, (f"after {prefix!r}: {len(differ)} tokens differ, e.g. "
                            f"{[(i, texts[i], bool(expected[i])) for i in differ[:4]]} "
                            "(token, its text, the library's answer)")


@pytest.fixture(scope="module")
def xgrammar_compiler(tokenizer):
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer.hf, vocab_size=VOCAB,
                                                   stop_token_ids=list(tokenizer.stop_tokens))
    return xgrammar.GrammarCompiler(info, max_threads=2)


@pytest.mark.exercise("16.1", points=2)
@pytest.mark.smollm2
@pytest.mark.parametrize("pattern, output", [
    (NUMBER, "-1234"),
    (WORD, '"hello"'),
    (YES_NO, "yes"),
    (DECIMAL, "-12.50"),
    (PERSON, '{"name": "Ada Lovelace", "age": 36}'),
])
def test_token_mask_agrees_with_xgrammar(tokenizer, texts, xgrammar_compiler, pattern, output):
    """At each step of a walk through ``output``'s tokens, the tokens your mask allows are
    the ones xgrammar's bitmask allows (among tokens that are text on their own; stop
    tokens are allowed exactly when the automaton accepts, as the course's engine does)."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(xgrammar_compiler.compile_regex(pattern))
    bitmask = xgrammar.allocate_token_bitmask(1, VOCAB)
    stops = list(tokenizer.stop_tokens)
    compared = torch.tensor([text is not None for text in texts])
    compared[stops] = True
    dfa = compile_regex(pattern)
    state = dfa.initial
    tokens = tokenizer.encode(output)
    for step in range(len(tokens) + 1):
        matcher.fill_next_token_bitmask(bitmask)
        logits = torch.zeros(1, VOCAB)
        xgrammar.apply_token_bitmask_inplace(logits, bitmask)
        theirs = logits[0] == 0
        ours = impl.token_mask(dfa, state, texts).clone()
        ours[stops] = dfa.is_accepting(state)
        differ = ((ours != theirs) & compared).nonzero().flatten().tolist()
        done = tokenizer.decode(tokens[:step])
        assert not differ, (f"after {done!r}: {len(differ)} tokens differ from xgrammar's, "
                            f"e.g. {[(i, texts[i], bool(theirs[i])) for i in differ[:4]]} "
                            "(token, its text, xgrammar's answer)")
        if step < len(tokens):
            assert matcher.accept_token(tokens[step])
            state = dfa.walk(state, texts[tokens[step]])


@pytest.mark.exercise("16.1", points=3)
@pytest.mark.smollm2
def test_your_mask_in_the_engine(smollm2, tokenizer):
    """SmolLM2, greedy, under a regex: with your mask as the course's backend the engine
    writes the default (xgrammar) engine's tokens, and they match the regex."""
    from minillm.sampling import SamplingParams
    from minillm.serve import LLM
    from minillm.structured import Regex
    from minillm.structured.backend import AutomatonBackend

    dfa = compile_regex(NUMBER)
    impl.token_mask(dfa, dfa.initial, ["1"])  # fail here, before the engine
    cases = [(r'\{"city": "[A-Z][a-z]+", "country": "[A-Z][a-z]+"\}',
              "Give the capital of Italy as JSON with keys city and country."),
             (r"\(?[0-9]{3}\)? [0-9]{3}-[0-9]{4}", "Write a US phone number for a pizza shop.")]
    prompts = [tokenizer.chat_prompt(question) for _, question in cases]
    params = [SamplingParams(max_tokens=24, temperature=0, structured=Regex(pattern))
              for pattern, _ in cases]
    yours = LLM(smollm2, tokenizer=tokenizer, num_blocks=64,
                structured_backend=functools.partial(AutomatonBackend,
                                                     mask_fn=impl.token_mask))
    default = LLM(smollm2, tokenizer=tokenizer, num_blocks=64)
    outputs = yours.generate(prompts, params, progress=False)
    expected = default.generate(prompts, params, progress=False)
    for (pattern, _), output, reference in zip(cases, outputs, expected, strict=True):
        assert output.error is None, output.error
        assert output.tokens == reference.tokens, (output.text, reference.text)
        assert output.finish_reason == "stop"
        text = tokenizer.decode([t for t in output.tokens if t not in tokenizer.stop_tokens])
        assert re.fullmatch(pattern, text), text


# -- 16.2 forced text --------------------------------------------------------------------------

@pytest.mark.exercise("16.2", points=1)
def test_forced_text_on_a_hand_made_automaton():
    dfa = hand_made()
    assert impl.forced_text(dfa, 0) == "ab"
    assert impl.forced_text(dfa, 1) == "b"
    assert impl.forced_text(dfa, 2) == ""  # accepting, and [0-9] is a choice anyway


@pytest.mark.exercise("16.2", points=2)
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


@pytest.mark.exercise("16.2", points=2)
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
