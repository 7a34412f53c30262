"""Graded tests for chapter 15's lab: the output stream (``sample_stream``).

Oracle: the library's own stream (:class:`minillm.serve.sample_stream.SampleStream`), the
one every client of the engine runs, and the contract's bounds computed from
``tokenizer.decode`` of the tokens pushed so far. Token streams are SmolLM2's: its real
tokenizer, with text pieces (spaces, newlines, emoji, CJK), tokens that are a lone byte of
a multi-byte character or bytes that are never valid UTF-8 (anywhere in the stream, not
only at its end), and any token of the vocabulary; stop strings cut from the stream's own
text (at its start, across tokens, inside a character's tokens, repeated, one a prefix of
another) or absent from it. Then your stream runs inside the engine: ``LLM.generate``,
``LLM.stream`` and the HTTP server give the library's text (on a tiny random model with
SmolLM2's tokenizer, whose replies are random text; the notebook runs SmolLM2 itself).
"""

from __future__ import annotations

import functools
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.config import ModelConfig
from minillm.grading import load_impl
from minillm.sampling import SamplingParams, TokenLogprob
from minillm.serve import LLM
from minillm.serve.detokenizer import held_back
from minillm.serve.sample_stream import SampleStream
from minillm.serve.server import serve_in_background
from minillm.testing import TINY, varied_random_model

impl = load_impl("ch15_output")

PIECES = ["Hello", " world", ",", " the", " end", ".", "\n", "\n\n", " ", "  ", "🦙", " 🍕",
          "日本語", " é", "ü", "∑", "STOP", " stop", "aa", "ab", "ba", "\t", "'s", "—"]
EOS = 2  # SmolLM2's <|im_end|>: a stop token, which decodes to nothing


@functools.cache
def byte_tokens(tokenizer) -> tuple[int, ...]:
    """Tokens whose text is not whole characters: lone bytes of multi-byte characters (a
    lead byte, a continuation byte) and bytes that are never valid UTF-8."""
    return tuple(i for i in range(2000) if "\ufffd" in tokenizer.decode([i]))


def run(factory, tokenizer, pushes, params):
    """The pieces a stream returns, push by push, until one finishes it."""
    stream, pieces = factory(tokenizer, params), []
    for token_ids, logprobs, finish_reason in pushes:
        pieces.append(stream.push(token_ids, logprobs, finish_reason))
        if pieces[-1].finish_reason is not None:
            break
    return pieces


def check(tokenizer, pushes, params):
    """Your stream against the library's, push by push; returns your pieces."""
    mine = run(impl.sample_stream, tokenizer, pushes, params)
    library = run(SampleStream, tokenizer, pushes, params)
    pushed, sent = [], ""
    tokens = [[tokenizer.decode([token]) for token in push[0]] for push in pushes]
    for k, (got, want) in enumerate(zip(mine, library, strict=False)):
        where = f"push {k} of the tokens {tokens} (stops {params.stop!r}, include " \
                f"{params.include_stop_str_in_output})"
        assert tuple(got.token_ids) == want.token_ids, f"tokens that count, {where}"
        assert tuple(got.logprobs) == want.logprobs, f"logprobs of this push's tokens, {where}"
        assert (got.finish_reason, got.stop_reason) == (want.finish_reason, want.stop_reason), \
            f"finish and stop reason, {where}"
        pushed += want.token_ids
        sent += got.text
        if want.finish_reason is None:
            check_bounds(tokenizer.decode(pushed), sent, params.stop, where)
    assert len(mine) == len(library), "a piece must finish the stream exactly when it ends"
    final = "".join(piece.text for piece in library)
    assert sent == final, f"the text: got {sent!r}, expected {final!r} (the tokens " \
                          f"{tokens}, stops {params.stop!r})"
    return mine


def check_bounds(text: str, sent: str, stops, where: str) -> None:
    """What may have gone out after a push: not a final "\ufffd" (its character may be
    incomplete) nor an end a later token could turn into a stop string; and, once the
    text ends in a whole character, all the rest."""
    safe = text[:-1] if text.endswith("\ufffd") else text
    may_send = len(safe) - held_back(safe, stops)
    assert text.startswith(sent) and len(sent) <= may_send, \
        f"sent {sent!r} of {text!r}: only {safe[:may_send]!r} is safe ({where})"
    if not text.endswith("\ufffd"):
        assert len(sent) == may_send, \
            f"sent {sent!r} of {text!r}: {safe[:may_send]!r} was safe to send ({where})"


def logprobs_of(tokens) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(token, -0.5 * i, ((token, -0.5 * i),)) for i, token in
                 enumerate(tokens))


def pushes_of(tokens, sizes, finish="length", with_logprobs=True):
    """``tokens`` in pushes of the given sizes (cycled), the last one with ``finish``."""
    logprobs = logprobs_of(tokens) if with_logprobs else ()
    pushes, start, k = [], 0, 0
    while start < len(tokens):
        end = min(len(tokens), start + sizes[k % len(sizes)])
        pushes.append((tuple(tokens[start:end]), tuple(logprobs[start:end]), None))
        start, k = end, k + 1
    if finish == "abort" or not pushes:  # the core finishes it in a push with no token
        return pushes + [((), (), finish)]
    token_ids, lps, _ = pushes[-1]
    return pushes[:-1] + [(token_ids, lps, finish)]


# -- edge cases ---------------------------------------------------------------------------

def encode(tokenizer, *texts):
    return [token for text in texts for token in tokenizer.encode(text)]


CASES = {  # name: (texts, push sizes, stops, include, the text the client must get)
    "no stop": (["I like 🍕 a lot"], [1], [], False, "I like 🍕 a lot"),
    "stop at the very start": (["Hello world"], [1], ["He"], False, ""),
    "stop inside a token": (["Hello world"], [1], ["ll"], True, "Hell"),
    "stop across tokens": (["The end.\n\nNext"], [1], ["\n\n"], False, "The end."),
    "stop across an emoji's tokens": (["so 🦙 said"], [1], ["🦙 s"], False, "so "),
    "kept stop string": (["The end.\n\nNext"], [1], ["\n\n"], True, "The end.\n\n"),
    "the earliest stop wins": (["a X b Y c"], [1], ["Y", "X"], False, "a "),
    "a stop that starts another": (["one two three"], [3], [" two", " tw"], True, "one tw"),
    "a stop that never completes": (["It was the en"], [1], ["the end"], False,
                                    "It was the en"),
    "several tokens a push": (["Hello, world. Bye"], [4], [". "], False, "Hello, world"),
}


@pytest.mark.exercise("15.2", points=3)
@pytest.mark.smollm2
@pytest.mark.parametrize("name", list(CASES))
def test_edge_cases(tokenizer, name):
    texts, sizes, stops, include, expected = CASES[name]
    params = SamplingParams(stop=stops, include_stop_str_in_output=include)
    pieces = check(tokenizer, pushes_of(encode(tokenizer, *texts), sizes), params)
    assert "".join(piece.text for piece in pieces) == expected


@pytest.mark.exercise("15.2", points=2)
@pytest.mark.smollm2
def test_invalid_bytes_do_not_freeze_the_stream(tokenizer):
    """A byte that never becomes a character decodes to "\ufffd" for good: the text after
    it must flow as soon as it is whole, not wait for the end of the reply."""
    invalid = [token for token in byte_tokens(tokenizer) if tokenizer.decode([token] * 2)
               == "\ufffd" * 2][:3]
    tokens = encode(tokenizer, "Hi") + invalid[:1] + encode(tokenizer, " there, 🦙 friend") \
        + invalid[1:] + encode(tokenizer, " again")
    for stops in ([], ["zz"], ["\n\n"]):
        pieces = check(tokenizer, pushes_of(tokens, [1, 2]), SamplingParams(stop=stops))
        before_the_end = "".join(piece.text for piece in pieces[:-1])
        assert "\ufffd there, 🦙" in before_the_end, (stops, before_the_end)


@pytest.mark.exercise("15.2", points=2)
@pytest.mark.smollm2
def test_finish_reasons_tokens_and_logprobs(tokenizer):
    """A stop token finishes with "stop" and is kept; a stop string completed by the second
    token of a push keeps that push's first two tokens and their log-probabilities; a
    reply cut by length sends what it held back."""
    tokens = encode(tokenizer, "Say hi.")
    [piece] = check(tokenizer, [(tuple(tokens + [EOS]), logprobs_of(tokens + [EOS]), "stop")],
                    SamplingParams())
    assert piece.token_ids == (*tokens, EOS) and piece.finish_reason == "stop"
    tokens = encode(tokenizer, "one", " two", " three", " four")
    pieces = check(tokenizer, [(tuple(tokens), logprobs_of(tokens), None)],
                   SamplingParams(stop=["e t"]))
    assert pieces[0].token_ids == tuple(tokens[:2]) and len(pieces[0].logprobs) == 2
    pieces = check(tokenizer, pushes_of(encode(tokenizer, "It was the en"), [1]),
                   SamplingParams(stop=["the end"]))
    assert pieces[-1].finish_reason == "length" and pieces[-1].text == "the en"


# -- random token streams -----------------------------------------------------------------

@st.composite
def token_streams(draw, tokenizer):
    """Tokens (text pieces, lone and invalid bytes, any vocabulary token), the sizes of the
    pushes they arrive in, how the core finishes them, and stop strings."""
    tokens = []
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.integers(0, 5))
        if kind <= 2:
            tokens += tokenizer.encode(draw(st.sampled_from(PIECES)))
        elif kind <= 4:
            tokens += draw(st.lists(st.sampled_from(byte_tokens(tokenizer)), min_size=1,
                                    max_size=3))
        else:
            tokens.append(draw(st.integers(0, tokenizer.vocab_size - 1)))
    finish = draw(st.sampled_from(["length", "stop", "abort"]))
    tokens += [EOS] if finish == "stop" else []
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    return tokens, sizes, finish, draw(stop_strings(tokenizer.decode(tokens)))


@st.composite
def stop_strings(draw, text):
    """Stop strings of 1-4 characters from ``text`` (anywhere, its start too), a stop
    that starts another, a repeated one, or one the text does not hold."""
    stops = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 5))
        if kind <= 2 and text:
            start = draw(st.sampled_from([0, draw(st.integers(0, len(text) - 1))]))
            stops.append(text[start:start + draw(st.integers(1, 4))])
        elif kind == 3 and stops:
            stops.append(stops[-1][:-1] or stops[-1])  # a prefix of another, or itself again
        else:
            stops.append(draw(st.sampled_from(["zq", "\n\n", " the", "🦙"])))
    return [stop for stop in stops if stop and "\ufffd" not in stop]


@pytest.mark.exercise("15.2", points=4)
@pytest.mark.smollm2
@settings(max_examples=250, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_streams_match_the_library(tokenizer, data):
    tokens, sizes, finish, stops = data.draw(token_streams(tokenizer))
    include, with_logprobs = data.draw(st.booleans()), data.draw(st.booleans())
    params = SamplingParams(stop=stops, include_stop_str_in_output=include)
    check(tokenizer, pushes_of(tokens, sizes, finish, with_logprobs), params)


# -- in the engine ------------------------------------------------------------------------

PROMPTS = [[5, 17, 99, 3, 42, 7, 8], [1000, 2000, 3000], [41, 42, 43, 44, 45, 46]]
MAX_TOKENS = 24


def tiny_llm(tokenizer, **options) -> LLM:
    """A tiny random model with SmolLM2's vocabulary and tokenizer: its greedy replies are
    random text (lone bytes, multi-byte characters, odd spacing), generated in milliseconds."""
    config = ModelConfig(**{**TINY, "vocab_size": 49152, "max_position_embeddings": 256})
    return LLM(varied_random_model(config), tokenizer=tokenizer, block_size=4, num_blocks=128,
               **options)


def stop_cases(replies):
    """Stop strings cut from each reply: three characters from its middle, one character
    kept in the text (include_stop_str_in_output), and one that never appears."""
    cases = []
    for prompt, reply in zip(PROMPTS, replies, strict=True):
        text = reply.text.replace("\ufffd", "")
        middle = len(text) // 2
        cases.append((prompt, SamplingParams(max_tokens=MAX_TOKENS,
                                             stop=[text[middle:middle + 3]])))
        cases.append((prompt, SamplingParams(max_tokens=MAX_TOKENS, stop=[
            text[middle + 1:middle + 2], "never in it"], include_stop_str_in_output=True)))
    return cases + [(PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS, stop=["never in it"]))]


@pytest.fixture(scope="module")
def library(tokenizer):
    """The requests to compare, and their outputs on an engine with the library's streams."""
    llm = tiny_llm(tokenizer)
    cases = stop_cases(llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS),
                                    progress=False))
    return cases, llm.generate([c[0] for c in cases], [c[1] for c in cases], progress=False)


@pytest.mark.exercise("15.2", points=2)
@pytest.mark.smollm2
def test_your_stream_in_llm_generate_and_stream(tokenizer, library):
    """``LLM(sample_stream=yours)``: generate and stream give the library's text, tokens
    and finish reasons, with stop strings cut from the replies, and free every block."""
    impl.sample_stream(tokenizer, SamplingParams())  # fail here, before the engine starts
    cases, expected = library
    yours = tiny_llm(tokenizer, sample_stream=impl.sample_stream)
    outputs = yours.generate([c[0] for c in cases], [c[1] for c in cases], progress=False)
    for (prompt, params), got, want in zip(cases, outputs, expected, strict=True):
        assert (got.text, got.tokens, got.finish_reason, got.outputs[0].stop_reason) == \
            (want.text, want.tokens, want.finish_reason, want.outputs[0].stop_reason), \
            params.stop
        streamed = "".join(update.text for update in yours.stream(prompt, params))
        assert streamed == want.text, params.stop
    assert yours.free_blocks() == 128


@pytest.mark.exercise("15.2", points=2)
@pytest.mark.smollm2
def test_your_stream_in_the_server(tokenizer, library):
    """The HTTP server of ``LLM(sample_stream=yours)``: streamed and whole replies both
    carry the library's text."""
    impl.sample_stream(tokenizer, SamplingParams())  # fail here, before the server starts
    cases, expected = library
    with serve_in_background(tiny_llm(tokenizer, sample_stream=impl.sample_stream),
                             "tiny") as url:
        for (prompt, params), want in zip(cases, expected, strict=True):
            body = {"model": "tiny", "prompt": prompt, "temperature": 0,
                    "max_tokens": MAX_TOKENS, "stop": list(params.stop),
                    "include_stop_str_in_output": params.include_stop_str_in_output}
            whole = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
            assert whole["choices"][0]["text"] == want.text, params.stop
            with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                              timeout=60) as response:
                streamed = "".join(json.loads(line[6:])["choices"][0]["text"]
                                   for line in response.iter_lines()
                                   if line.startswith("data: {"))
            assert streamed == want.text, params.stop
