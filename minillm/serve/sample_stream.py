"""One sample's stream: the engine core's tokens in, the text a client may read out.

The engine core hands out, per step, the tokens that joined a sample's output (several
at once with speculation), their log-probabilities, and how the sample finished if it
did (:class:`~minillm.engine.deltas.RequestDelta`). A :class:`SampleStream` turns each of
those into a :class:`Piece`: the text that is now safe to send (:mod:`.detokenizer`
decodes it incrementally and holds back half characters and possible starts of stop
strings), the tokens that count and their log-probabilities (none after the token that
completed a stop string), and the finish reason ("stop" when a stop string ended it).

The output processor (:mod:`.output_processor`) makes one stream per sample, through a
factory ``(tokenizer, params) -> stream``: this class by default, chapter 15's lab (the
learner's own) through ``LLM(model, sample_stream=...)``. Whatever the factory, the
stream's contract is the one :meth:`SampleStream.push` states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from ..sampling import SamplingParams, TokenLogprob
from .detokenizer import IncrementalDetokenizer


class Piece(NamedTuple):
    """What one push gives a client: the new ``text``, the tokens that count and their
    log-probabilities, the ``finish_reason`` (None while the sample runs) and
    ``stop_reason``, the stop string that ended the sample (None if none did)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]
    finish_reason: str | None
    stop_reason: str | None = None


class Stream(Protocol):
    def push(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] = (),
             finish_reason: str | None = None) -> Piece: ...


StreamFactory = Callable[[object, SamplingParams], Stream]  # (tokenizer, params) -> stream


class SampleStream:
    """The library's stream: :class:`~.detokenizer.IncrementalDetokenizer` for the text,
    fed one token at a time while stop strings are set, so that it knows the token that
    completed one."""

    def __init__(self, tokenizer, params: SamplingParams):
        self.detokenizer = IncrementalDetokenizer(tokenizer, params.stop)
        self.include_stop = params.include_stop_str_in_output

    def push(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] = (),
             finish_reason: str | None = None) -> Piece:
        """Add one step's tokens (``logprobs``: one per token, or none) and the core's
        ``finish_reason`` ("stop" for a stop token, "length", "abort", "error"; None while
        it runs). The pieces' texts add up to the sample's text: the decoded tokens,
        ending before the first stop string (after it with ``include_stop_str_in_output``)
        as if the tokens came one at a time; each piece sends all that is safe. Not called
        again once a piece has a finish reason."""
        text, kept = self._text(token_ids)
        stop = self._stop_string() if self.detokenizer.stopped else None
        if stop is not None:
            text += stop if self.include_stop else ""
            finish_reason = "stop"
        elif finish_reason is not None:
            text += self.detokenizer.finish()
        return Piece(text, tuple(token_ids[:kept]), tuple(logprobs[:kept]), finish_reason,
                     stop)

    def _text(self, token_ids: Sequence[int]) -> tuple[str, int]:
        """The text these tokens make safe to send, and how many of them count (all but
        those after a stop string's last token)."""
        if not self.detokenizer.stops:
            return self.detokenizer.push(token_ids), len(token_ids)
        text = ""
        for count, token in enumerate(token_ids, start=1):  # one at a time: find the token
            text += self.detokenizer.push([token])  # that completes a stop string
            if self.detokenizer.stopped:
                return text, count
        return text, len(token_ids)

    def _stop_string(self) -> str:
        """The stop string that ended the text: the earliest (of two that start at the same
        place, the shorter, which was complete first)."""
        full = self.detokenizer.text()
        return min((full.find(stop), stop) for stop in self.detokenizer.stops
                   if stop in full)[1]
