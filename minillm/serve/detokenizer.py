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

:class:`IncrementalDetokenizer` decodes the whole output each time (simple and exact: a
token's text can depend on its neighbours) and hands out only the new, safe part.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


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


HoldBack = Callable[[str, Sequence[str]], int]


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas, honouring ``stops``.
    ``hold_back(text, stops)`` says how much of the text's end to keep back (chapter 15
    passes the learner's :func:`held_back`)."""

    def __init__(self, tokenizer, stops: Sequence[str] = (), hold_back: HoldBack = held_back):
        self.tokenizer = tokenizer
        self.hold_back = hold_back
        self.stops = [stop for stop in stops if stop]
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already handed out
        self.stopped = False  # a stop string was found: nothing more will be sent

    def text(self) -> str:
        return self.tokenizer.decode(self.tokens)

    def push(self, tokens: Sequence[int]) -> str:
        """Add new output tokens; returns the text that is now safe to send."""
        if self.stopped:
            return ""
        self.tokens.extend(tokens)
        text = self.text()
        found = [i for i in (text.find(stop, max(0, self.sent - len(stop) + 1))
                             for stop in self.stops) if i >= 0]
        if found:
            self.stopped = True
            return self._send(text[:min(found)])
        if text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its rest
            return ""
        return self._send(text[:len(text) - self.hold_back(text, self.stops)])

    def finish(self) -> str:
        """The output ended (stop token or length): whatever was held back, now safe."""
        return "" if self.stopped else self._send(self.text())

    def _send(self, text: str) -> str:
        delta = text[self.sent:]
        self.sent = max(self.sent, len(text))
        return delta
