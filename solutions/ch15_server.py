"""Chapter 15: serving over HTTP, the warm-ups — server-sent events out and back in, and
OpenAI's usage block. (The chapter's lab, the output stream, is in ``ch15_output``.)"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

LINE_END = re.compile(r"\r\n|\r|\n")  # the only line endings of an event stream


def sse_event(payload: dict) -> str:
    """Exercise 15.1: Warm-up: one server-sent event carrying ``payload``: ``data: {...}\\n\\n``.

    A streamed reply (``"stream": true``) is an event stream (``text/event-stream``): the
    server keeps the response open and writes one event per piece of text. An event is a
    ``data: `` line and a blank line; the blank line is what tells the client that the
    event is complete, so each event must end in ``"\\n\\n"``.

    The JSON is ``json.dumps(payload)`` with its defaults, the bytes OpenAI's clients get
    from the server: ``", "`` and ``": "`` separators and ASCII only (a newline inside a
    string becomes the two characters ``\\n``, a non-ASCII character a ``\\uXXXX`` escape).
    So the whole event is one line of data, whatever text it carries.
    """
    ### BEGIN SOLUTION
    return f"data: {json.dumps(payload)}\n\n"
    ### END SOLUTION


def parse_sse(stream_text: str) -> list[dict | str]:
    """Exercise 15.1: Warm-up: a whole event stream's payloads, in order (dicts, then "[DONE]").

    The client's half of :func:`sse_event`, for a body read in full. The rules (the
    event-stream format of the HTML standard, as OpenAI's clients read it):

    * Lines end in ``"\\n"``, ``"\\r\\n"`` or ``"\\r"`` and in nothing else (other
      characters that Python's ``str.splitlines`` treats as line breaks, such as U+2028, may
      sit raw inside a JSON string).
    * A blank line ends an event. Blank lines with no data before them (keep-alives, the
      end of the stream) give no event.
    * A line ``data:<value>`` adds ``<value>`` to the event's data, without the one space
      that may follow the colon (``data:{...}`` and ``data: {...}`` are the same). An event
      of several ``data`` lines has their values joined with ``"\\n"``.
    * A line starting with ``:`` is a comment (servers send ``: ping`` to keep a connection
      alive), and other fields (``event:``, ``id:``, ``retry:``) carry no data: both are
      ignored.
    * An event that the stream ends before its blank line is incomplete: it is dropped.

    An event's data is JSON (a dict), except the marker ``[DONE]`` that ends an OpenAI
    stream, which is returned as the string ``"[DONE]"``.
    """
    ### BEGIN SOLUTION
    events: list[dict | str] = []
    data: list[str] = []
    lines = LINE_END.split(stream_text)
    for line in lines[:-1]:  # the last piece has no line ending (it is usually "")
        if not line:
            if data:
                text = "\n".join(data)
                events.append(text if text == "[DONE]" else json.loads(text))
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value.removeprefix(" "))
    return events
    ### END SOLUTION


def usage(prompt_tokens: int, completions: Sequence[Sequence[int]]) -> dict:
    """Exercise 15.3: Warm-up: OpenAI's usage block: prompt, completion and total tokens.

    ``completions`` holds the generated token ids of each of the request's ``n`` samples.
    Returns ``{"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}`` where
    ``c`` counts every sample's tokens (a final stop token included: the model generated
    it) and the prompt is counted once, however many samples: its KV blocks are computed
    once and shared by the samples. Tokens, not characters: that is what is billed and
    what the engine spends.
    """
    ### BEGIN SOLUTION
    completion = sum(len(tokens) for tokens in completions)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}
    ### END SOLUTION
