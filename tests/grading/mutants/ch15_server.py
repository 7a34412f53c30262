"""Plausible wrong answers to chapter 15 (serving over HTTP); the graded tests must catch each
one. Each mutant replaces the solution function named before its ``__``."""

import json
import re


def _payload(data: str):
    return data if data == "[DONE]" else json.loads(data)


# -- 15.1 sse_event / parse_sse -------------------------------------------------------------

def sse_event__one_newline(payload):
    """Ends the event with a single newline: no blank line, so the client never sees the
    event end (the next one is read as more of the same event)."""
    return f"data: {json.dumps(payload)}\n"


def sse_event__no_data_field(payload):
    """Writes the bare JSON and a blank line without the ``data: `` field name."""
    return f"{json.dumps(payload)}\n\n"


def sse_event__python_repr(payload):
    """Formats the dict with str() (Python's repr: single quotes, None, True), not JSON."""
    return f"data: {payload}\n\n"


def sse_event__pretty_json(payload):
    """Pretty-prints the JSON (indent=2): its newlines split the event into lines that are
    not ``data:`` lines."""
    return f"data: {json.dumps(payload, indent=2)}\n\n"


def parse_sse__splitlines(stream_text):
    """Splits lines with str.splitlines(), which also breaks at U+2028, U+0085 and other
    Unicode line separators that JSON strings may hold raw."""
    events, data = [], []
    lines = stream_text.splitlines()
    if not stream_text.endswith(("\n", "\r")):
        lines = lines[:-1]  # an unterminated last line
    for line in lines:
        if not line:
            if data:
                events.append(_payload("\n".join(data)))
                data = []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value.removeprefix(" "))
    return events


def parse_sse__newline_only(stream_text):
    """Splits lines on "\\n" only: with "\\r\\n" line endings (allowed by the format) no line
    is ever blank, so no event ends."""
    events, data = [], []
    for line in stream_text.split("\n")[:-1]:
        if not line:
            if data:
                events.append(_payload("\n".join(data)))
                data = []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value.removeprefix(" "))
    return events


def parse_sse__fixed_prefix(stream_text):
    """Splits on blank lines and cuts the first 6 characters (``"data: "``) off each event:
    wrong for ``data:{...}`` without the space, comments, and several data lines."""
    return [_payload(event[6:]) for event in stream_text.split("\n\n")[:-1] if event.strip()]


def parse_sse__done_as_json(stream_text):
    """Parses every event's data as JSON, the ``[DONE]`` marker too (a JSONDecodeError)."""
    events, data = [], []
    for line in re.split(r"\r\n|\r|\n", stream_text)[:-1]:
        if not line:
            if data:
                events.append(json.loads("\n".join(data)))
                data = []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value.removeprefix(" "))
    return events


def parse_sse__every_line_is_data(stream_text):
    """Takes every non-blank line as data after removing a ``data:`` prefix: a ``: ping``
    comment or an ``event:`` line becomes JSON to parse."""
    events, data = [], []
    for line in re.split(r"\r\n|\r|\n", stream_text)[:-1]:
        if not line:
            if data:
                events.append(_payload("\n".join(data)))
                data = []
        else:
            data.append(line.removeprefix("data:").removeprefix(" "))
    return events


def parse_sse__one_event_per_data_line(stream_text):
    """Treats each data line as an event of its own: an event split over two data lines
    becomes two halves of JSON."""
    events = []
    for line in re.split(r"\r\n|\r|\n", stream_text)[:-1]:
        if line.startswith("data:"):
            events.append(_payload(line[5:].removeprefix(" ")))
    return events


def parse_sse__keeps_unfinished_event(stream_text):
    """Also returns the last event when the stream ends before its blank line (a reply cut
    off mid-event)."""
    events, data = [], []
    for line in re.split(r"\r\n|\r|\n", stream_text) + [""]:
        if not line:
            if data:
                events.append(_payload("\n".join(data)))
                data = []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value.removeprefix(" "))
    return events


# -- 15.3 usage -------------------------------------------------------------------------------

def usage__prompt_per_sample(prompt_tokens, completions):
    """Counts the prompt once per sample, as if each of the n samples had its own copy."""
    completion = sum(len(tokens) for tokens in completions)
    prompt = prompt_tokens * max(1, len(completions))
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def usage__total_is_completion(prompt_tokens, completions):
    """Leaves the prompt out of the total."""
    completion = sum(len(tokens) for tokens in completions)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": completion}


def usage__counts_samples(prompt_tokens, completions):
    """Counts the samples (len(completions)), not their tokens."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": len(completions),
            "total_tokens": prompt_tokens + len(completions)}


def usage__first_sample_only(prompt_tokens, completions):
    """Counts the tokens of the first sample only."""
    completion = len(completions[0]) if completions else 0
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def usage__without_stop_token(prompt_tokens, completions):
    """Leaves out each sample's last token, as if the stop token were not generated."""
    completion = sum(max(len(tokens) - 1, 0) for tokens in completions)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}
