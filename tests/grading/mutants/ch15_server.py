"""Plausible wrong answers to chapter 15 (serving over HTTP); the graded tests must catch each
one. Each mutant replaces the solution function named before its ``__``."""

import json
import re

from minillm.serve.detokenizer import held_back


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


# -- 15.2 held_back ---------------------------------------------------------------------------

def held_back__whole_stop(text, stops):
    """Counts the whole stop string as a prefix of itself (sizes up to len(stop), not
    len(stop) − 1)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop), len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def held_back__first_stop_only(text, stops):
    """Looks at the first stop string only."""
    if not stops:
        return 0
    stop = stops[0]
    for size in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:size]):
            return size
    return 0


def held_back__first_stop_that_matches(text, stops):
    """Returns the match of the first stop string that has one, not the longest over all."""
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                return size
    return 0


def held_back__one_character(text, stops):
    """Holds back one character when the text ends in a stop string's first character:
    not enough when the text ends in a longer start of one ("\\n\\nTh" after "...\\n\\n")."""
    return int(any(len(stop) > 1 and text.endswith(stop[0]) for stop in stops))


def held_back__shortest(text, stops):
    """Tries prefix sizes from 1 upwards and keeps the first that matches: the shortest
    suffix, not the longest ("xaa" with stop "aab" holds back 1, not 2)."""
    longest = 0
    for stop in stops:
        for size in range(1, min(len(stop) - 1, len(text)) + 1):
            if text.endswith(stop[:size]):
                longest = max(longest, size)
                break
    return longest


def held_back__off_by_one(text, stops):
    """Tries sizes up to len(stop) − 2 (range's end excluded twice): misses the longest
    proper prefix."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 2, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def held_back__anywhere(text, stops):
    """Looks for the stop string's prefixes anywhere in the text, not only at its end."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop[:size] in text:
                longest = size
                break
    return longest


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


# -- 15.4 next_delta --------------------------------------------------------------------------

def next_delta__searches_unsent_text_only(text, sent, stops, hold_back=held_back):
    """Looks for stop strings from ``sent`` on: one whose first characters already went out
    is never found, and its rest is streamed."""
    found = [i for i in (text.find(stop, sent) for stop in stops) if i >= 0]
    if found:
        return text[sent:min(found)], max(sent, min(found)), True
    if text.endswith("\ufffd"):
        return "", sent, False
    end = len(text) - hold_back(text, stops)
    return text[sent:end], max(sent, end), False


def next_delta__sends_incomplete_characters(text, sent, stops, hold_back=held_back):
    """Does not wait for the rest of a character: a half emoji goes out as "\ufffd"."""
    found = [i for i in (text.find(stop, max(0, sent - len(stop) + 1)) for stop in stops)
             if i >= 0]
    end = min(found) if found else len(text) - hold_back(text, stops)
    return text[sent:end], max(sent, end), bool(found)


def next_delta__no_hold_back(text, sent, stops, hold_back=held_back):
    """Sends all the new text when no stop string is found, the start of one included."""
    found = [i for i in (text.find(stop, max(0, sent - len(stop) + 1)) for stop in stops)
             if i >= 0]
    if found:
        return text[sent:min(found)], max(sent, min(found)), True
    if text.endswith("\ufffd"):
        return "", sent, False
    return text[sent:], max(sent, len(text)), False


def next_delta__holds_back_before_searching(text, sent, stops, hold_back=held_back):
    """Cuts off the held-back end first and looks for stop strings in the rest only: a stop
    string that ends the text is held back, not found, and its first characters go out."""
    if text.endswith("\ufffd"):
        return "", sent, False
    safe = text[:len(text) - hold_back(text, stops)]
    found = [i for i in (safe.find(stop, max(0, sent - len(stop) + 1)) for stop in stops)
             if i >= 0]
    end = min(found) if found else len(safe)
    return text[sent:end], max(sent, end), bool(found)


def next_delta__first_stop_in_list(text, sent, stops, hold_back=held_back):
    """Ends the reply at the first stop string of the list that is found, not at the one
    that comes first in the text."""
    for stop in stops:
        i = text.find(stop, max(0, sent - len(stop) + 1))
        if i >= 0:
            return text[sent:i], max(sent, i), True
    if text.endswith("\ufffd"):
        return "", sent, False
    end = len(text) - hold_back(text, stops)
    return text[sent:end], max(sent, end), False


def next_delta__position_zero_is_false(text, sent, stops, hold_back=held_back):
    """Takes "found" as a position above 0 (not >= 0, -1 being no match): a stop string at
    the very start of the text is missed."""
    found = [i for i in (text.find(stop, max(0, sent - len(stop) + 1)) for stop in stops) if i > 0]
    if found:
        return text[sent:min(found)], max(sent, min(found)), True
    if text.endswith("\ufffd"):
        return "", sent, False
    end = len(text) - hold_back(text, stops)
    return text[sent:end], max(sent, end), False


def next_delta__count_goes_back(text, sent, stops, hold_back=held_back):
    """Returns where the safe text ends as the count sent, even when that is before
    ``sent``: characters that went out are counted as unsent and sent again."""
    found = [i for i in (text.find(stop, max(0, sent - len(stop) + 1)) for stop in stops)
             if i >= 0]
    if found:
        return text[sent:min(found)], min(found), True
    if text.endswith("\ufffd"):
        return "", sent, False
    end = len(text) - hold_back(text, stops)
    return text[sent:end], end, False
