"""Chapter 15's lab: the output stream — one sample's tokens in, the text every client reads
out: incremental detokenisation, stop strings held back across tokens, finish reasons and
log-probabilities. ``LLM(model, sample_stream=sample_stream)`` runs yours in the engine,
for ``generate``, ``stream`` and the HTTP server alike."""

from __future__ import annotations

from collections.abc import Sequence

from minillm.sampling import SamplingParams, TokenLogprob
from minillm.serve.sample_stream import Piece


class SampleStream:
    """Exercise 15.2: Lab: one sample's output stream, the engine's tokens in, text out.

    The engine core produces token ids; every client reads text. The output processor
    makes one ``SampleStream(tokenizer, params)`` per sample (through :func:`sample_stream`)
    and, after each engine step in which the sample changed, calls
    ``push(token_ids, logprobs, finish_reason)``, until a returned piece has a finish reason
    (push is not called after that). What you return is what ``LLM.generate``'s text,
    ``LLM.stream``'s pieces and the HTTP server's event stream carry.

    **Inputs.**

    * ``tokenizer.decode(ids) -> str``. SmolLM2's tokens are bytes: a token may hold part
      of a UTF-8 character (an emoji is often three tokens), and bytes that do not (yet)
      make a character decode to "\\ufffd". Some bytes never will (invalid UTF-8): their
      "\\ufffd" stays in the text for good, and the text goes on after it. A token's text
      can depend on its neighbours: decoding tokens one by one and joining the pieces is
      not decoding the list.
    * ``params.stop``: stop strings (non-empty; none holds "\\ufffd");
      ``params.include_stop_str_in_output``.
    * ``push``'s ``token_ids``: the tokens that joined the output in this step (several
      with speculation; none in a push that only finishes the sample); ``logprobs``: one
      :class:`~minillm.sampling.TokenLogprob` per token, or empty (not asked for);
      ``finish_reason``: the core's — None while the sample runs, "stop" (its last token is
      a stop token, kept), "length", "abort" or "error".

    **Output**: a :class:`~minillm.serve.sample_stream.Piece` ``(text, token_ids, logprobs,
    finish_reason, stop_reason)``.

    **Contract** (the graded tests check every push against the library's stream on random
    token streams of SmolLM2's tokenizer; ``T`` is the decoding of all tokens pushed so far):

    1. *The text.* The pieces' texts add up to the sample's text: ``T`` at the end; or, if
       a stop string appears, ``T`` at the first token after which it holds one, cut before
       the earliest stop string in it (of two that start at the same place, the shorter),
       or just after it with ``include_stop_str_in_output``. A push of several tokens gives
       what pushing them one at a time would.
    2. *Nothing taken back.* What was sent stays a prefix of the sample's text whatever
       tokens come next: never a "\\ufffd" that ends ``T`` (its character may be
       incomplete) and never an end of ``T`` that later tokens could turn into a stop
       string.
    3. *Nothing held longer.* After a push that leaves ``T`` ending in a whole character
       (and no stop string), everything else has been sent: all of ``T`` but its longest
       end that is a proper prefix of a stop string. While ``T`` ends in "\\ufffd" you may
       wait.
    4. *Tokens and log-probabilities.* ``token_ids``: the pushed tokens that count — all,
       except that after a stop string only those up to the one that completed it;
       ``logprobs``: those of the tokens in ``token_ids`` (empty if none were given).
    5. *Finish.* ``finish_reason`` is "stop" when a stop string ended the sample
       (``stop_reason``: that string), else the core's (``stop_reason`` None). A sample
       that finishes without a stop string sends everything still held back.

    **Hints.** vLLM's ``v1/engine/detokenizer.py`` (incremental detokenisation with a
    window of tokens, decoded with and without the new ones) and its stop-string check;
    the notebook's section 2 replays the library's stream token by token. Decoding the
    whole output at every token is correct but costs O(n²) over a long reply. The private
    methods below are one way to split the work: keep, change or replace them.
    """

    def __init__(self, tokenizer, params: SamplingParams):
        ### BEGIN SOLUTION
        self.tokenizer = tokenizer
        self.stops = list(params.stop)
        self.include_stop = params.include_stop_str_in_output
        self.tokens: list[int] = []
        self.text = ""  # the text of tokens[:read], which ends in a whole character
        self.pending = ""  # the text after it, while it ends in "\ufffd"
        self.prefix = self.read = 0  # the decoding window starts at tokens[prefix]
        self.sent = 0  # characters of the text already handed out
        ### END SOLUTION

    def push(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] = (),
             finish_reason: str | None = None) -> Piece:
        """Add one step's tokens; returns the piece to send (the contract above)."""
        ### BEGIN SOLUTION
        kept, stop = len(token_ids), None
        for count, token in enumerate(token_ids, start=1):
            self._add(token)
            if stop := self._stop_string():
                kept = count
                break
        whole = self.text + self.pending
        if stop:
            finish_reason = "stop"
            end = whole.find(stop, self.sent) + (len(stop) if self.include_stop else 0)
        elif finish_reason is not None:
            end = len(whole)
        elif self.pending:
            end = self.sent
        else:
            end = len(whole) - self._held_back(whole)
        piece, self.sent = whole[self.sent:end], max(self.sent, end)
        return Piece(piece, tuple(token_ids[:kept]), tuple(logprobs[:kept]), finish_reason,
                     stop)
        ### END SOLUTION

    def _add(self, token: int) -> None:
        """Extend the text by one token, decoded in its window's context."""
        ### BEGIN SOLUTION
        self.tokens.append(token)
        known = self.tokenizer.decode(self.tokens[self.prefix:self.read])
        new = self.tokenizer.decode(self.tokens[self.prefix:])[len(known):]
        if new.endswith("\ufffd"):  # perhaps half a character: wait for its other bytes
            self.pending = new
            return
        self.text, self.pending = self.text + new, ""
        self.prefix, self.read = self.read, len(self.tokens)
        ### END SOLUTION

    def _stop_string(self) -> str | None:
        """The stop string that ends the text now, if one does."""
        ### BEGIN SOLUTION
        whole = self.text + self.pending
        found = [(at, stop) for stop in self.stops if (at := whole.find(stop, self.sent)) >= 0]
        return min(found)[1] if found else None  # the earliest; at a tie, the shorter
        ### END SOLUTION

    def _held_back(self, text: str) -> int:
        """How much of the end of ``text`` might start a stop string."""
        ### BEGIN SOLUTION
        return max((size for stop in self.stops for size in range(1, len(stop))
                    if text.endswith(stop[:size])), default=0)
        ### END SOLUTION


def sample_stream(tokenizer, params: SamplingParams) -> SampleStream:
    """Exercise 15.2: The engine's factory: one stream per sample (nothing to write here).

    ``LLM(model, sample_stream=sample_stream)`` runs your :class:`SampleStream` for every
    client of that engine (``generate``, ``stream`` and its HTTP server); the graded tests
    make yours through this function.
    """
    return SampleStream(tokenizer, params)
