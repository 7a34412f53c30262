"""Graded tests for chapter 15 (serving over HTTP).

Oracles: the server's own ``sse_event`` and ``usage`` and the detokenizer's ``held_back``
and ``next_delta`` (minillm.serve), the event-stream format (examples), and the live
server: SmolLM2 behind ``serve_in_background`` (uvicorn in a thread), queried over HTTP
with httpx and the official ``openai`` client.
Its event stream must parse into the non-streamed reply, and with *your* ``held_back`` as
the detokenizer's rule, or *your* ``next_delta`` as its step, a stop string that spans
tokens must not leak into the stream.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from minillm.grading import load_impl
from minillm.sampling import SamplingParams
from minillm.serve.detokenizer import IncrementalDetokenizer
from minillm.serve.detokenizer import held_back as library_held_back
from minillm.serve.detokenizer import next_delta as library_next_delta
from minillm.serve.server import serve_in_background
from minillm.serve.server import sse_event as library_sse_event
from minillm.serve.server import usage as library_usage

impl = load_impl("ch15_server")


@pytest.fixture(scope="module")
def llm():
    """SmolLM2 on the continuous-batching engine, shared by the live-server tests."""
    from minillm.serve import LLM

    return LLM("smollm2", num_blocks=256)


def serving(llm, **detokenizer_options):
    """The server on ``llm``; ``hold_back=`` / ``next_delta=`` plug yours into it."""
    return serve_in_background(llm, "smollm2", **detokenizer_options)


# -- 15.1 server-sent events ----------------------------------------------------------------

@pytest.mark.exercise("15.1", points=1)
@pytest.mark.parametrize("payload, expected", [
    ({"a": 1}, 'data: {"a": 1}\n\n'),
    ({}, "data: {}\n\n"),
    ({"text": "two\nlines", "reason": None, "ok": True},
     'data: {"text": "two\\nlines", "reason": null, "ok": true}\n\n'),
    ({"text": "café 🍕"}, 'data: {"text": "caf\\u00e9 \\ud83c\\udf55"}\n\n'),
    ({"choices": [{"index": 0, "text": " Paris", "finish_reason": None}]},
     'data: {"choices": [{"index": 0, "text": " Paris", "finish_reason": null}]}\n\n'),
])
def test_sse_event_examples(payload, expected):
    assert impl.sse_event(payload) == expected


TRICKY = [{"text": "\n\n"}, {"text": "data: [DONE]\n\n"}, {"text": "🍕\r\n\r"},
          {"text": "a\u2028b\x85c"}, {"text": 'quote " and \\ backslash'},
          {"nested": {"list": [1, 2.5, None, True, "x"]}, "usage": None}, {}]


@pytest.mark.exercise("15.1", points=1)
def test_sse_event_is_one_data_line_and_a_blank_line():
    for payload in TRICKY:
        event = impl.sse_event(payload)
        assert event == library_sse_event(payload), payload
        assert event.startswith("data: ") and event.endswith("\n\n") and event.count("\n") == 2
        assert json.loads(event[len("data: "):]) == payload


@pytest.mark.exercise("15.1", points=2)
@pytest.mark.parametrize("stream_text, expected", [
    ('data: {"a": 1}\n\ndata: [DONE]\n\n', [{"a": 1}, "[DONE]"]),
    ('data:{"a": 1}\n\n', [{"a": 1}]),  # no space after the colon
    ('data: {"a": 1}\r\n\r\ndata: {"b": 2}\r\rdata: [DONE]\n\n',  # \r\n, \r and \n
     [{"a": 1}, {"b": 2}, "[DONE]"]),
    (': ping\n\ndata: {"a": 1}\n\n\n\n: ping\n\n', [{"a": 1}]),  # keep-alives
    ('event: message\nid: 7\ndata: {"a": 1}\nretry: 100\n\n', [{"a": 1}]),  # other fields
    ('data: {"a":\ndata: [1, 2]}\n\n', [{"a": [1, 2]}]),  # one event, two data lines
    ("", []),
    ("\n\n\n", []),
    ('data: {"a": 1}\n\ndata: {"b": 2}', [{"a": 1}]),  # cut off mid-event
    ('data: {"a": 1}\n\ndata: {"b": 2}\n', [{"a": 1}]),  # no blank line yet
    ("data: [DONE]\n\n", ["[DONE]"]),
    ('data: {"text": "data: [DONE]\\n\\n"}\n\n', [{"text": "data: [DONE]\n\n"}]),
])
def test_parse_sse_examples(stream_text, expected):
    assert impl.parse_sse(stream_text) == expected


@pytest.mark.exercise("15.1", points=1)
def test_parse_sse_breaks_lines_only_at_line_endings():
    """A server that writes UTF-8 JSON (ensure_ascii=False) may put U+2028, U+2029 or U+0085
    raw inside a string: they are characters of the text, not line endings."""
    payload = {"text": "one\u2028two\u2029three\x85four"}
    body = f"data: {json.dumps(payload, ensure_ascii=False)}\n\ndata: [DONE]\n\n"
    assert impl.parse_sse(body) == [payload, "[DONE]"]


@pytest.mark.exercise("15.1", points=1)
def test_parse_sse_reads_back_sse_event():
    for encode in (library_sse_event, impl.sse_event):
        body = "".join(encode(payload) for payload in TRICKY) + "data: [DONE]\n\n"
        assert impl.parse_sse(body) == [*TRICKY, "[DONE]"]


@pytest.mark.exercise("15.1", points=2)
@pytest.mark.smollm2
def test_a_streamed_reply_from_the_server(llm):
    """A real event stream (a completion with stream=true and the usage chunk): its chunks
    add up to the non-streamed reply, and sse_event re-encodes them into the very bytes the
    server sent."""
    impl.parse_sse("data: [DONE]\n\n"), impl.sse_event({})  # fail here, before the server
    request = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8,
               "temperature": 0}
    bodies = [{**request, "stream": True, "stream_options": {"include_usage": True}}, request]
    with serving(llm) as url, ThreadPoolExecutor(2) as pool:  # the two run batched
        streamed, whole = pool.map(
            lambda body: httpx.post(url + "/v1/completions", json=body, timeout=120), bodies)
    assert streamed.status_code == whole.status_code == 200
    body, whole = streamed.text, whole.json()
    events = impl.parse_sse(body)
    assert events and events[-1] == "[DONE]", events[-1:]
    chunks = events[:-1]
    assert chunks and all(isinstance(chunk, dict) for chunk in chunks)
    text = "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"])
    assert text == whole["choices"][0]["text"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert "".join(impl.sse_event(chunk) for chunk in chunks) + "data: [DONE]\n\n" == body


# -- 15.2 the hold-back rule -----------------------------------------------------------------

@pytest.mark.exercise("15.2", points=2)
@pytest.mark.parametrize("text, stops, expected", [
    ("hello", [], 0),
    ("", ["stop"], 0),
    ("abc", [""], 0),
    ("nothing here", ["stop", "\n\n"], 0),
    ("the end of the", ["the end.", "zzz"], 3),
    ("Hello\n", ["\n\n"], 1),
    ("xab", ["abc"], 2),
    ("abc", ["abc"], 0),  # a whole stop string is not a proper prefix ("bc", "c" are not)
    ("aaaa", ["aaa"], 2),  # at most len(stop) - 1
    ("aaaa", ["aaaaa"], 4),  # the whole text
    ("xaa", ["aab"], 2),  # "a" and "aa" both fit: the longest
    ("xabab", ["abab"], 2),
    ("xaba", ["abab"], 3),
    ("it is the en", ["end", "the end"], 6),  # several stops: the longest over all
    ("it is the en", ["the end", "end"], 6),
    ("a cup of ☕", ["zz", "☕ time"], 1),
])
def test_held_back_examples(text, stops, expected):
    assert impl.held_back(text, stops) == expected


@pytest.mark.exercise("15.2", points=2)
def test_held_back_matches_the_library_on_random_strings():
    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choices("ab\n", k=rng.randint(0, 8)))
        stops = ["".join(rng.choices("ab\n", k=rng.randint(0, 5)))
                 for _ in range(rng.randint(0, 3))]
        assert impl.held_back(text, stops) == library_held_back(text, stops), (text, stops)


def stream_and_whole(llm, request: dict, **app_options):
    """Send ``request`` to a server running the learner's code twice at once, streamed and
    whole: the streamed text, its chunks and the whole reply."""
    with serving(llm, **app_options) as url, ThreadPoolExecutor(1) as pool:
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=120)
        whole = pool.submit(client.completions.create, **request)  # runs batched with the stream
        chunks = list(client.completions.create(stream=True, **request))
        whole = whole.result()
    return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices), chunks, whole


@pytest.mark.exercise("15.2", points=2)
@pytest.mark.smollm2
def test_your_held_back_in_the_server(llm):
    """The server's detokenizers use your held_back. A stop string that spans tokens (two
    characters before a token boundary and two after) must end the reply before it: no
    piece of it is streamed, and the streamed text is the non-streamed text."""
    impl.held_back("a sto", ["stop"])  # fail here, before the server starts
    prompt = "List three fruits: apples, bananas"
    tokens = llm.generate([prompt], SamplingParams(max_tokens=8), progress=False)[0].tokens
    text = llm.tokenizer.decode(tokens)
    boundary = len(llm.tokenizer.decode(tokens[:6]))
    stop = text[boundary - 2:boundary + 2]
    expected = text[:text.find(stop)]
    request = dict(model="smollm2", prompt=prompt, max_tokens=16, temperature=0,
                   stop=["zzqzz", stop])
    streamed, chunks, whole = stream_and_whole(llm, request, hold_back=impl.held_back)
    assert streamed == expected, f"stop string {stop!r}: streamed {streamed!r}, " \
                                 f"expected {expected!r}"
    assert whole.choices[0].text == expected
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "stop"


# -- 15.3 usage ------------------------------------------------------------------------------

def counts(prompt, completion):
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


@pytest.mark.exercise("15.3", points=2)
@pytest.mark.parametrize("prompt_tokens, completions, expected", [
    (5, [[1, 2, 3]], counts(5, 3)),
    (7, [[1, 2], [3], [4, 5, 6]], counts(7, 6)),  # n = 3: the prompt counted once
    (4, [[]], counts(4, 0)),
    (4, [[], [9], []], counts(4, 1)),
    (0, [[2]], counts(0, 1)),
    (12, [[0, 0, 0, 0], [0, 0]], counts(12, 6)),
])
def test_usage_examples(prompt_tokens, completions, expected):
    assert impl.usage(prompt_tokens, completions) == expected


@pytest.mark.exercise("15.3", points=1)
def test_usage_matches_the_library():
    rng = random.Random(0)
    for _ in range(300):
        prompt = rng.randint(0, 2000)
        completions = [[rng.randrange(49152) for _ in range(rng.randint(0, 30))]
                       for _ in range(rng.randint(1, 4))]
        got = impl.usage(prompt, completions)
        assert got == library_usage(prompt, completions), (prompt, completions)
        assert all(type(value) is int for value in got.values())


# -- 15.4 the streaming step -----------------------------------------------------------------

def no_hold_back(text, stops):
    """A rule that holds nothing back: stop strings may start in text already sent."""
    return 0


@pytest.mark.exercise("15.4", points=2)
@pytest.mark.parametrize("text, sent, stops, expected", [
    ("Hello", 0, [], ("Hello", 5, False)),  # no stops
    ("Hello world", 5, [], (" world", 11, False)),
    ("Hi.\n", 0, ["\n\n"], ("Hi.", 3, False)),  # "\n" may start the stop string: held
    ("Hi.\n\nBye", 3, ["\n\n"], ("", 3, True)),  # ... and it did, on the next push
    ("Hello\n\n", 0, ["\n\n"], ("Hello", 5, True)),  # found, not held back
    ("Hello world. Bye", 6, [". "], ("world", 11, True)),
    ("stop at once", 0, ["stop"], ("", 0, True)),  # a stop string at position 0
    ("a X b Y c", 0, ["Y", "X"], ("a ", 2, True)),  # the earliest wins, not the first listed
    ("it is the en", 0, ["end", "the end"], ("it is ", 6, False)),
    ("it is the en", 6, ["end", "the end"], ("", 6, False)),
    ("I like \ufffd", 6, [], ("", 6, False)),  # an incomplete character waits
    ("I like 🍕", 6, [], (" 🍕", 8, False)),  # ... until its last token
    ("I like 🍕 a \ufffd", 8, ["zz"], ("", 8, False)),
    ("ab\ufffd", 0, ["b"], ("a", 1, True)),  # a stop string before it still ends the reply
    ("xab", 2, ["ab"], ("", 2, True)),  # "a" went out already: the reply stops all the same
    ("abc", 3, ["cd"], ("", 3, False)),  # never back: "c" went out, it is not held again
])
def test_next_delta_examples(text, sent, stops, expected):
    assert tuple(impl.next_delta(text, sent, stops, library_held_back)) == expected


@pytest.mark.exercise("15.4", points=1)
def test_next_delta_uses_the_rule_it_is_given():
    """The server passes its hold-back rule (yours, in chapter 15's server)."""
    assert tuple(impl.next_delta("Hello", 0, [], lambda text, stops: 2)) == ("Hel", 3, False)
    assert tuple(impl.next_delta("Hello\n", 0, ["\n\n"], no_hold_back)) == \
        ("Hello\n", 6, False)


EMOJI = "🦙"  # three tokens: after the first two the decoded text ends in "\ufffd"


def random_stream(rng):
    """A random output as the detokenizer sees it, and random stop strings: the decoded
    text after each push (an emoji cut mid-way decodes to "\ufffd")."""
    units = rng.choices(["a", "b", "\n", "ab", EMOJI], k=rng.randint(0, 12))
    tokens = [(unit, part) for unit in units for part in range(3 if unit == EMOJI else 1)]
    texts, position = [], 0
    while position < len(tokens):
        position = min(len(tokens), position + rng.randint(1, 3))
        whole = [unit for unit, part in tokens[:position] if unit != EMOJI or part == 2]
        cut = tokens[position - 1][0] == EMOJI and tokens[position - 1][1] < 2
        texts.append("".join(whole) + "\ufffd" * cut)
    stops = ["".join(rng.choices(["a", "b", "\n", EMOJI], k=rng.randint(1, 4)))
             for _ in range(rng.randint(0, 3))]
    return "".join(units), texts, stops


def stream(delta_step, texts, stops, hold_back):
    """The deltas of one reply, as the detokenizer hands them out (the last one flushes
    what is left if no stop string ended it), and whether a stop string ended it."""
    deltas, sent = [], 0
    for text in texts:
        before = sent
        delta, sent, stopped = delta_step(text, sent, stops, hold_back)
        assert sent == before + len(delta) >= before, (text, before, delta, sent)
        deltas.append(delta)
        if stopped:
            again = tuple(delta_step(text, sent, stops, hold_back))
            assert again == ("", sent, True), f"asked again after the stop: {again}"
            return deltas, True
    return deltas + [texts[-1][sent:] if texts else ""], False


def before_the_stop(text, texts, stops):
    """What the client must get: the text before the first stop string to appear (the
    earliest in the first pushed text that holds one), or all of it."""
    for pushed in texts:
        found = [i for i in (pushed.find(stop) for stop in stops) if i >= 0]
        if found:
            return pushed[:min(found)]
    return text


@pytest.mark.exercise("15.4", points=2)
def test_next_delta_streams_like_the_library():
    """Random outputs pushed a few tokens at a time: every step is the library's, and the
    deltas add up to the text before the first stop string, without "\ufffd". With a rule
    that holds nothing back, a stop string's start may go out, but it still ends the
    reply."""
    rng = random.Random(0)
    for _ in range(3000):
        text, texts, stops = random_stream(rng)
        for hold_back in (library_held_back, no_hold_back):
            got = stream(impl.next_delta, texts, stops, hold_back)
            expected = stream(library_next_delta, texts, stops, hold_back)
            assert got == expected, (texts, stops, hold_back.__name__)
        deltas, stopped = stream(impl.next_delta, texts, stops, library_held_back)
        expected = before_the_stop(text, texts, stops)
        assert "".join(deltas) == expected, (texts, stops)
        assert stopped == any(stop in text for stop in stops)
        assert "\ufffd" not in "".join(deltas)


@pytest.mark.exercise("15.4", points=1)
@pytest.mark.smollm2
def test_your_next_delta_on_smollm2_tokens(tokenizer):
    """SmolLM2's tokens one at a time through the server's detokenizer with your step: two
    llamas of three tokens each, then a stop string of two tokens."""
    impl.next_delta("", 0, [], library_held_back)
    tokens = tokenizer.encode("Llamas 🦙🦙!\n\nNext")
    stops = ["\n\n", "zz"]
    mine = IncrementalDetokenizer(tokenizer, stops, next_delta=impl.next_delta)
    library = IncrementalDetokenizer(tokenizer, stops)
    pieces = [mine.push([token]) for token in tokens]
    assert pieces == [library.push([token]) for token in tokens]
    assert "".join(pieces) == "Llamas 🦙🦙!" and mine.stopped and mine.finish() == ""


@pytest.mark.exercise("15.4", points=2)
@pytest.mark.smollm2
def test_your_next_delta_in_the_server(llm):
    """The server's detokenizers take their steps with your next_delta. Of two stop
    strings the one that comes first in the text ends the reply though it is listed last,
    and spans tokens (two characters before a token boundary and two after): the streamed
    text is the text before it, and so is the non-streamed text."""
    impl.next_delta("a sto", 0, ["stop"], library_held_back)  # fail here, before the server
    prompt = "List three fruits: apples, bananas"
    tokens = llm.generate([prompt], SamplingParams(max_tokens=10), progress=False)[0].tokens
    text = llm.tokenizer.decode(tokens)
    boundary = len(llm.tokenizer.decode(tokens[:5]))
    stop = text[boundary - 2:boundary + 2]
    later = llm.tokenizer.decode(tokens[8:])
    expected = text[:min(text.find(stop), text.find(later))]
    request = dict(model="smollm2", prompt=prompt, max_tokens=16, temperature=0,
                   stop=[later, stop])
    streamed, chunks, whole = stream_and_whole(llm, request, next_delta=impl.next_delta)
    assert streamed == expected, f"stop strings {request['stop']!r}: streamed {streamed!r}, " \
                                 f"expected {expected!r}"
    assert whole.choices[0].text == expected
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "stop"
