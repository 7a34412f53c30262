"""Streaming text out of streaming tokens: the incremental detokenizer.

A server streams text, but the engine produces token ids, and two things make "decode
each new token and send it" wrong:

* **Incomplete characters.** A byte-level BPE token can end in the middle of a UTF-8
  character (an emoji is often two or three tokens); decoding it alone gives the
  replacement character "\ufffd". Text that ends in one is held back until the next token
  completes it.
* **Stop strings.** ``stop=["\\n\\n"]`` must end the reply *before* the stop string, and
  the string may span tokens ("\\n" then "\\n"). Whatever could still be the start of a
  stop string is held back; when a stop string appears, the text before it is the last
  piece and the request ends.

:class:`IncrementalDetokenizer` keeps the output's text and hands out only the new, safe
part, which :func:`next_delta` works out from that text and how much of it was already
sent. The text grows without decoding the whole output again at every token (a reply of
n tokens would cost O(n²)): a token's text can depend on its neighbours, so each step
decodes a short window of tokens twice, from the last point where the text was complete,
with and without the new ones, and keeps the difference (vLLM's incremental
detokenization). The result is the text a decode of the whole output gives.
"""

from __future__ import annotations

from collections.abc import Sequence


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` might start a stop string (the longest
    suffix of ``text`` that is a proper prefix of one of ``stops``)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def next_delta(text: str, sent: int, stops: Sequence[str]) -> tuple[str, int, bool]:
    """One step of the stream: the new text that is safe to send, the count of characters
    sent after it, and whether a stop string ended the reply. ``text`` is the whole output
    decoded so far, of which ``sent`` characters already went out; ``stops`` are
    non-empty.

    A stop string that ends after the sent characters ends the reply (it may start up to
    ``len(stop) - 1`` characters before them, had they been let go): the text
    before the earliest one is the last piece. Otherwise text ending in "\ufffd" (an
    incomplete UTF-8 character) waits, and the rest goes out but for the characters that
    may start a stop string (:func:`held_back`). The count never goes back: text already
    sent is never sent again."""
    found = [i for i in (text.find(stop, max(0, sent - len(stop) + 1)) for stop in stops)
             if i >= 0]
    if found:
        end = min(found)
    elif text.endswith("\ufffd"):
        return "", sent, False
    else:
        end = len(text) - held_back(text, stops)
    return text[sent:end], max(sent, end), bool(found)


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas, honouring ``stops``
    (:func:`next_delta` decides what each push sends)."""

    def __init__(self, tokenizer, stops: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stops = [stop for stop in stops if stop]
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already handed out
        self.stopped = False  # a stop string was found: nothing more will be sent
        self.complete = ""  # the text of tokens[:read], which ends on a whole character
        self.prefix, self.read = 0, 0  # the window starts at prefix; its text is known to read
        self.pending = ""  # text after `complete`, still ending in an incomplete character

    def text(self) -> str:
        """The whole output's text (an incomplete character at its end shows as "\ufffd")."""
        return self.complete + self.pending

    def _decode_new(self) -> None:
        """Extend the text by the tokens after ``read``: decode the window from ``prefix``
        with and without them and keep the difference, so a token is read in context."""
        known = self.tokenizer.decode(self.tokens[self.prefix:self.read])
        window = self.tokenizer.decode(self.tokens[self.prefix:])
        new = window[len(known):]
        if new.endswith("\ufffd"):  # wait for the character's other bytes
            self.pending = new
            return
        self.complete += new
        self.pending = ""
        self.prefix, self.read = self.read, len(self.tokens)

    def push(self, tokens: Sequence[int]) -> str:
        """Add new output tokens; returns the text that is now safe to send."""
        if self.stopped:
            return ""
        self.tokens.extend(tokens)
        self._decode_new()
        delta, self.sent, self.stopped = next_delta(self.text(), self.sent, self.stops)
        return delta

    def finish(self) -> str:
        """The output ended (stop token or length): whatever was held back, now safe."""
        if self.stopped:
            return ""
        delta = self.text()[self.sent:]
        self.sent += len(delta)
        return delta
