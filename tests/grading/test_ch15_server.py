"""Graded tests for chapter 15's warm-ups (serving over HTTP): server-sent events and usage.

Oracles: the server's own ``sse_event`` and ``usage`` (minillm.serve), the event-stream
format (examples), and the live server: SmolLM2 behind ``serve_in_background`` (uvicorn
in a thread), queried over HTTP with httpx, whose event stream must parse into the
non-streamed reply. (The chapter's lab, the output stream, is graded in
``test_ch15_output.py``.)
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from minillm.grading import load_impl
from minillm.serve.server import serve_in_background
from minillm.serve.server import sse_event as library_sse_event
from minillm.serve.server import usage as library_usage

impl = load_impl("ch15_server")


@pytest.fixture(scope="module")
def llm():
    """SmolLM2 on the continuous-batching engine, shared by the live-server tests."""
    from minillm.serve import LLM

    return LLM("smollm2", num_blocks=256)


def serving(llm):
    """The server on ``llm``."""
    return serve_in_background(llm, "smollm2")


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
