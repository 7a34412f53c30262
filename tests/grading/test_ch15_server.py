"""Graded tests for chapter 15 (serving over HTTP).

Oracles: the server's own ``sse_event`` and ``usage`` and the detokenizer's ``held_back``
(minillm.serve), the event-stream format (examples), and the live server: SmolLM2 behind
``serve_in_background`` (uvicorn in a thread), queried over HTTP with httpx and the
official ``openai`` client.
Its event stream must parse into the non-streamed reply, and with *your* ``held_back`` as
the detokenizer's rule a stop string that spans tokens must not leak into the stream.
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
from minillm.serve.detokenizer import held_back as library_held_back
from minillm.serve.server import serve_in_background
from minillm.serve.server import sse_event as library_sse_event
from minillm.serve.server import usage as library_usage

impl = load_impl("ch15_server")


@pytest.fixture(scope="module")
def llm():
    """SmolLM2 on the continuous-batching engine, shared by the live-server tests."""
    from minillm.serve import LLM

    return LLM("smollm2", num_blocks=256)


def serving(llm, hold_back=library_held_back):
    return serve_in_background(llm, "smollm2", hold_back=hold_back)


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
    with serving(llm, hold_back=impl.held_back) as url, ThreadPoolExecutor(1) as pool:
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=120)
        whole = pool.submit(client.completions.create, **request)  # runs batched with the stream
        chunks = list(client.completions.create(stream=True, **request))
        whole = whole.result()
    streamed = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
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
