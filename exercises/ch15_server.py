# Generated from solutions/ch15_server.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 15: serving over HTTP — server-sent events out and back in, the rule that keeps a
stop string from leaking into a stream, the streaming detokenizer's step that applies it,
and OpenAI's usage block."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

LINE_END = re.compile(r"\r\n|\r|\n")  # the only line endings of an event stream


def sse_event(payload: dict) -> str:
    """Exercise 15.1: One server-sent event carrying ``payload`` as JSON: ``data: {...}\\n\\n``.

    A streamed reply (``"stream": true``) is an event stream (``text/event-stream``): the
    server keeps the response open and writes one event per piece of text. An event is a
    ``data: `` line and a blank line; the blank line is what tells the client that the
    event is complete, so each event must end in ``"\\n\\n"``.

    The JSON is ``json.dumps(payload)`` with its defaults, the bytes OpenAI's clients get
    from the server: ``", "`` and ``": "`` separators and ASCII only (a newline inside a
    string becomes the two characters ``\\n``, a non-ASCII character a ``\\uXXXX`` escape).
    So the whole event is one line of data, whatever text it carries.
    """
    raise NotImplementedError("Exercise 15.1: One server-sent event carrying ``payload`` as JSON: ``data: {...}\\n\\n``")


def parse_sse(stream_text: str) -> list[dict | str]:
    """Exercise 15.1: A whole event stream's payloads, in order: dicts, and "[DONE]" at the end.

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
    raise NotImplementedError("Exercise 15.1: A whole event stream's payloads, in order: dicts, and '[DONE]' at the end")


def held_back(text: str, stops: Sequence[str]) -> int:
    """Exercise 15.2: How many characters at the end of ``text`` might start a stop string.

    With ``stop=["\\n\\n"]`` the reply must end *before* the stop string, and the string
    can span tokens: after a token that ends in "\\n" the server cannot know yet whether
    the next one starts with "\\n". If it streamed the "\\n" now, it could not take it
    back. So the detokenizer holds back the end of the text that could still turn into a
    stop string, and sends it later (when the next tokens show it is not one, or when the
    reply ends).

    That end is the longest suffix of ``text`` that is a *proper* prefix of one of the
    ``stops`` (at most ``len(stop) - 1`` characters: a whole stop string is found, and cut
    off, before this rule is asked). Several stops: the longest such suffix over all of
    them. No stops, an empty stop string or empty text: 0. Examples: ``held_back("the end
    of the", ["the end."])`` is 3 ("the"); ``held_back("xaa", ["aab"])`` is 2 ("aa").
    """
    raise NotImplementedError("Exercise 15.2: How many characters at the end of ``text`` might start a stop string")


def usage(prompt_tokens: int, completions: Sequence[Sequence[int]]) -> dict:
    """Exercise 15.3: OpenAI's usage block of a request: prompt, completion and total tokens.

    ``completions`` holds the generated token ids of each of the request's ``n`` samples.
    Returns ``{"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}`` where
    ``c`` counts every sample's tokens (a final stop token included: the model generated
    it) and the prompt is counted once, however many samples: its KV blocks are computed
    once and shared by the samples. Tokens, not characters: that is what is billed and
    what the engine spends.
    """
    raise NotImplementedError("Exercise 15.3: OpenAI's usage block of a request: prompt, completion and total tokens")


def next_delta(text: str, sent: int, stops: Sequence[str],
               hold_back: Callable[[str, Sequence[str]], int] = held_back
               ) -> tuple[str, int, bool]:
    """Exercise 15.4: The streaming step: the new text safe to send, the count sent, stopped?

    The server's detokenizer calls this after each engine step with ``text``, the sample's
    whole output decoded so far, and ``sent``, how many of its characters already went to
    the client. It returns ``(delta, sent, stopped)``: the text to send now, the count of
    characters sent once it is (``sent + len(delta)``), and whether a stop string ended the
    reply (the server then cancels the request and sends nothing more). In order:

    1. **A stop string ends the reply before it.** Look for each of the ``stops`` (non-empty
       strings) where it could newly appear: an occurrence that ends after the ``sent``
       characters, so it starts at ``sent - len(stop) + 1`` or later (never before 0;
       ``str.find`` takes a start): searching only the unsent text would miss one whose
       first characters went out already (a hold-back rule let them go), and the reply
       must stop all the same. With several, the one that starts earliest in the text
       wins, whatever its place in the list. The delta is the text from ``sent`` up to
       that start, and ``stopped`` is True.
    2. **An incomplete character waits.** A token can end in the middle of a UTF-8
       character (an emoji is often two or three tokens), and the decoded text then ends
       in the replacement character "\\ufffd": send nothing yet.
    3. **Otherwise send all but what may start a stop string:** everything from ``sent``
       except the last ``hold_back(text, stops)`` characters (exercise 15.2's rule; the
       server passes the rule it runs with).

    Text already sent cannot be taken back: the returned count never goes below ``sent``
    (an end that falls before it sends ""). Example, ``stops=["\\n\\n"]``: ``"Hi.\\n"``
    from 0 gives ``("Hi.", 3, False)``; then ``"Hi.\\n\\nBye"`` from 3 gives ``("", 3,
    True)``.
    """
    raise NotImplementedError("Exercise 15.4: The streaming step: the new text safe to send, the count sent, stopped?")
