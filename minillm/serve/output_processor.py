"""From the engine core's token deltas to what a client reads: text, stops, outputs.

    client (LLM.generate / LLM.stream / generate() / the HTTP server)
      └─ OutputProcessor: deltas -> text, stop strings, logprobs, finished outputs
           └─ engine core: add / abort / step() -> RequestDelta (:mod:`minillm.engine`)

The core hands out one :class:`~minillm.engine.deltas.RequestDelta` per sample that changed
in a step: token ids, their log-probabilities, a finish reason. Every client turns those
into the same things, so one object does it for all of them:

* **incremental detokenisation** and **stop strings**, by each sample's stream
  (:mod:`.sample_stream`): the text grows by the safe part of the decoded output (an
  incomplete UTF-8 character is held back: :mod:`.detokenizer`); stop strings
  (``SamplingParams.stop``) are found across tokens, the text ends before the first one
  (after it with ``include_stop_str_in_output``) and the tokens at the token that
  completed it; the processor then asks the client to abort the sample in the core
  (:attr:`Update.stopped`), so its blocks are freed at once;
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
from .sample_stream import Piece, SampleStream, Stream, StreamFactory


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
    """What the processor keeps for one sample while it runs: its output and its stream
    (None without a tokenizer: tokens only)."""

    def __init__(self, output: CompletionOutput, stream: Stream | None):
        self.output, self.stream = output, stream

    def push(self, delta: RequestDelta) -> Piece:
        if self.stream is None:
            return Piece("", delta.token_ids, delta.logprobs, delta.finish_reason)
        return self.stream.push(delta.token_ids, delta.logprobs, delta.finish_reason)


class OutputProcessor:
    def __init__(self, tokenizer=None, *, sample_stream: StreamFactory = SampleStream):
        """``tokenizer``: turns tokens into text (None: outputs carry tokens only, and stop
        strings cannot be used). ``sample_stream(tokenizer, params)``: makes each sample's
        stream (:mod:`.sample_stream`; chapter 15's lab passes the learner's)."""
        self.tokenizer, self.sample_stream = tokenizer, sample_stream
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
        samples = [_Sample(output, self._stream(params)) for output in outputs]
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

    def _stream(self, params: SamplingParams) -> Stream | None:
        return None if self.tokenizer is None else self.sample_stream(self.tokenizer, params)

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
        output = samples[delta.index].output
        piece = samples[delta.index].push(delta)
        output.tokens += piece.token_ids
        output.logprobs += piece.logprobs
        output.token_times += [delta.time] * len(piece.token_ids)
        output.drafted += delta.drafted
        output.accepted += delta.accepted
        output.forced += delta.forced
        if delta.error is not None:
            request.error = delta.error
        if output.text is not None:
            output.text += piece.text
        output.stop_reason = piece.stop_reason
        output.finish_reason = piece.finish_reason or delta.finish_reason
        stopped = output.finished and not delta.finished  # by the stream: still in the core
        return Update(delta.request_id, delta.index, piece.text, tuple(piece.token_ids),
                      tuple(piece.logprobs), output.finish_reason, delta.error, stopped)

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
