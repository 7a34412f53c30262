"""From the engine core's token deltas to what a client reads: text, stops, outputs.

    client (LLM.generate / LLM.stream / generate() / the HTTP server)
      └─ OutputProcessor: deltas -> text, stop strings, logprobs, finished outputs
           └─ engine core: add / abort / step() -> RequestDelta (:mod:`minillm.engine`)

The core hands out one :class:`~minillm.engine.deltas.RequestDelta` per sample that changed
in a step: token ids, their log-probabilities, a finish reason. Every client turns those
into the same things, so one object does it for all of them:

* **incremental detokenisation**: each sample's text grows by the safe part of its decoded
  output (an incomplete UTF-8 character is held back: :mod:`.detokenizer`);
* **stop strings** (``SamplingParams.stop``), found across tokens: the text ends before the
  first one, or after it with ``include_stop_str_in_output``; the sample's tokens end at
  the token that completed it; and the processor asks the client to abort the sample in
  the core (:attr:`Update.stopped`), so its blocks are freed at once;
* **log-probabilities** and usage counts, **latencies** (arrival and token times, for
  :mod:`.metrics`) and speculation statistics;
* the finished :class:`RequestOutput` (vLLM's shape: ``outputs`` holds the ``n``
  samples).

Per step it returns an :class:`Update` per sample that advanced: the new text and tokens
(a stream sends these), and how it finished. ``LLM.generate``'s text, ``LLM.stream``'s
pieces and the server's replies are therefore the same text for the same request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

from ..engine.deltas import RequestDelta
from ..sampling import SamplingParams, TokenLogprob
from .detokenizer import HoldBack, IncrementalDetokenizer, NextDelta, held_back, next_delta


@dataclass
class CompletionOutput:
    """One sample of a request (vLLM's name): its tokens (a stop token included), its text,
    how it finished (``stop_reason``: the stop string that ended it, if one did), and what
    was recorded on the way."""

    index: int
    tokens: list[int] = field(default_factory=list)
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    arrival_time: float = 0.0
    token_times: list[float] = field(default_factory=list)  # when each token arrived
    drafted: int = 0  # speculative guesses checked ...
    accepted: int = 0  # ... and kept by the target
    forced: int = 0  # tokens a grammar forced, with no forward pass of their own

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def cumulative_logprob(self) -> float:
        return sum(entry.logprob for entry in self.logprobs)


@dataclass
class RequestOutput:
    """A request's samples. ``tokens``, ``text`` and ``finish_reason`` are its first
    sample's; ``error`` says why it failed, if it did."""

    request_id: int
    prompt_tokens: list[int]
    outputs: list[CompletionOutput]
    error: str | None = None

    @property
    def tokens(self) -> list[int]:
        return self.outputs[0].tokens

    @property
    def text(self) -> str | None:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def finished(self) -> bool:
        return all(output.finished for output in self.outputs)


class Update(NamedTuple):
    """One sample's progress in one step: the text and tokens it gained, their
    log-probabilities, and how it finished. ``stopped``: a stop string ended it, so the
    client must abort it in the engine core (it is still running there)."""

    request_id: int
    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]
    finish_reason: str | None
    error: str | None = None
    stopped: bool = False


class _Sample:
    """What the processor keeps for one sample while it runs."""

    def __init__(self, output: CompletionOutput, detokenizer: IncrementalDetokenizer | None,
                 params: SamplingParams):
        self.output, self.detokenizer, self.params = output, detokenizer, params

    def push(self, tokens: tuple[int, ...]) -> tuple[str, int]:
        """The text these tokens make safe to send, and how many of them count (all but
        those after a stop string's last token)."""
        if self.detokenizer is None:
            return "", len(tokens)
        if not self.params.stop:
            return self.detokenizer.push(tokens), len(tokens)
        text = ""
        for count, token in enumerate(tokens, start=1):  # one at a time: find the token
            text += self.detokenizer.push([token])  # that completes a stop string
            if self.detokenizer.stopped:
                return text + self._stop_string(), count
        return text, len(tokens)

    def _stop_string(self) -> str:
        """The stop string that ended the text, recorded; returned for the text when the
        request keeps it (``include_stop_str_in_output``)."""
        full = self.detokenizer.text()
        _, found = min((full.find(stop), stop) for stop in self.detokenizer.stops
                       if stop in full)  # the earliest: the one the stream stopped at
        self.output.stop_reason = found
        return found if self.params.include_stop_str_in_output else ""

    def finish(self) -> str:
        return self.detokenizer.finish() if self.detokenizer is not None else ""


class OutputProcessor:
    def __init__(self, tokenizer=None, *, hold_back: HoldBack = held_back,
                 next_delta: NextDelta = next_delta):
        """``tokenizer``: turns tokens into text (None: outputs carry tokens only, and stop
        strings cannot be used). ``hold_back`` and ``next_delta``: the detokenizer's rule
        for text that may start a stop string and its step (chapter 15 passes the
        learner's)."""
        self.tokenizer, self.hold_back, self.next_delta = tokenizer, hold_back, next_delta
        self.requests: dict[int, tuple[RequestOutput, list[_Sample]]] = {}

    def add(self, request_id: int, prompt: list[int], params: SamplingParams,
            arrival_time: float | None = None) -> RequestOutput:
        """Follow a request the core has taken; returns its (growing) output."""
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer to read the text: give the "
                             "engine one, or stop on token ids (stop_token_ids)")
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        outputs = [CompletionOutput(i, text="" if self.tokenizer else None,
                                    arrival_time=arrival) for i in range(params.n)]
        samples = [_Sample(output, self._detokenizer(params), params) for output in outputs]
        self.requests[request_id] = (RequestOutput(request_id, list(prompt), outputs), samples)
        return self.requests[request_id][0]

    def reject(self, request_id: int, prompt: list[int], params: SamplingParams,
               reason: str) -> RequestOutput:
        """A request the core refused: its output, finished at once with the reason (not
        followed: nothing more will come)."""
        now = time.perf_counter()
        outputs = [CompletionOutput(i, text="" if self.tokenizer else None,
                                    finish_reason="error", arrival_time=now)
                   for i in range(params.n)]
        return RequestOutput(request_id, list(prompt), outputs, reason)

    def _detokenizer(self, params: SamplingParams) -> IncrementalDetokenizer | None:
        if self.tokenizer is None:
            return None
        return IncrementalDetokenizer(self.tokenizer, params.stop, self.hold_back,
                                      self.next_delta)

    def process(self, deltas: list[RequestDelta]) -> list[Update]:
        """Apply one step's deltas; returns an update per sample that changed (requests
        nobody follows any more are skipped). Finished requests stop being followed once
        all their samples are done (:meth:`output` keeps answering until then)."""
        updates = [self._apply(delta) for delta in deltas if self._followed(delta)]
        for update in updates:
            request = self.requests.get(update.request_id)
            if request is not None and request[0].finished:
                del self.requests[update.request_id]
        return updates

    def _followed(self, delta: RequestDelta) -> bool:
        """Is the delta's sample followed and still running here? (One a stop string
        ended is aborted in the core before its next step.)"""
        request = self.requests.get(delta.request_id)
        return request is not None and not request[0].outputs[delta.index].finished

    def _apply(self, delta: RequestDelta) -> Update:
        request, samples = self.requests[delta.request_id]
        sample = samples[delta.index]
        output = sample.output
        text, kept = sample.push(delta.token_ids)
        tokens, logprobs = delta.token_ids[:kept], delta.logprobs[:kept]
        output.tokens += tokens
        output.logprobs += logprobs
        output.token_times += [delta.time] * len(tokens)
        output.drafted += delta.drafted
        output.accepted += delta.accepted
        output.forced += delta.forced
        stopped = output.stop_reason is not None
        reason = "stop" if stopped else delta.finish_reason
        if reason is not None and not stopped:
            text += sample.finish()
        if delta.error is not None:
            request.error = delta.error
        if output.text is not None:
            output.text += text
        output.finish_reason = reason
        return Update(delta.request_id, delta.index, text, tokens, logprobs, reason,
                      delta.error, stopped and not delta.finished)

    def abort(self, request_id: int, index: int | None = None) -> None:
        """A client cancelled a request (or its sample ``index``): its unfinished samples
        finish with "abort", and a request with none left running is no longer followed."""
        request = self.requests.get(request_id)
        if request is None:
            return
        for sample in request[0].outputs:
            if sample.finish_reason is None and index in (None, sample.index):
                sample.finish_reason = "abort"
        if request[0].finished:
            del self.requests[request_id]
