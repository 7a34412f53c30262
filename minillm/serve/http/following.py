"""Following engine requests as they run: each sample's new text (through an incremental
detokenizer that holds back what may start a stop string), its finish, its error, its
usage; and cancelling what a client no longer wants. The only part of the server that
reads the engine's live sequences: the routes and the response builders see
:class:`Piece` s and plain values."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

from ...sampling import TokenLogprob
from ..async_engine import AsyncEngine
from ..async_engine import Request as EngineRequest
from ..detokenizer import HoldBack, IncrementalDetokenizer, NextDelta
from ..sequence import FinishReason
from .responses import usage


class Piece(NamedTuple):
    """New text of one sample, its finish reason when it ended, and the log-probabilities
    of the tokens consumed since its last piece (empty when not recorded)."""

    index: int
    text: str
    reason: str | None
    logprobs: list[TokenLogprob]


class Follower:
    """Follows the requests of one ``engine``: decodes with ``tokenizer`` by the
    detokenizer's rules ``hold_back`` and ``next_delta``, and calls
    ``record(request, outcome)`` once a followed request has ended."""

    def __init__(self, engine: AsyncEngine, tokenizer, hold_back: HoldBack,
                 next_delta: NextDelta, record: Callable[[EngineRequest, str], None]):
        self.engine, self.tokenizer, self.record = engine, tokenizer, record
        self.hold_back, self.next_delta = hold_back, next_delta

    def cancel(self, request: EngineRequest) -> None:
        """Stop each of ``request``'s samples still running (their blocks are freed before
        the engine's next step)."""
        for seq in request.samples:
            if not seq.finished:
                self.engine.cancel(seq)

    async def follow(self, requests: list[EngineRequest], stops: list[str]
                     ) -> AsyncIterator[Piece]:
        """Each sample's new text as the engine produces it (with the log-probabilities of
        the tokens consumed since the last piece, when recorded). The samples of all
        ``requests`` are numbered in order: request p's sample s is ``p * samples + s``."""
        samples = [seq for request in requests for seq in request.samples]
        owners = [request for request in requests for _ in request.samples]
        detokenizers = [IncrementalDetokenizer(self.tokenizer, stops, self.hold_back,
                                               self.next_delta) for _ in samples]
        sent = [0] * len(samples)
        reported = [0] * len(samples)  # log-probabilities handed out
        done = [False] * len(samples)
        while not all(done):
            # every followed request is woken after each step: waiting for one that has
            # samples still running is waiting for the next step
            await owners[done.index(False)].updated.wait()
            for request in requests:
                request.updated.clear()
            for index, seq in enumerate(samples):
                if done[index]:
                    continue
                finished = seq.finished  # read first: a step in flight appends, then finishes
                new = seq.output[sent[index]:]
                sent[index] += len(new)
                detokenizer = detokenizers[index]
                text = detokenizer.push(new)
                if detokenizer.stopped or finished or text:
                    logprobs = seq.logprobs[reported[index]:sent[index]]
                    reported[index] = sent[index]
                if detokenizer.stopped:  # a stop string: the reply ends before it
                    self.engine.cancel(seq)
                    done[index] = True
                    yield Piece(index, text, "stop", logprobs)
                elif finished:
                    done[index] = True
                    yield Piece(index, text + detokenizer.finish(), seq.finish_reason.value,
                                logprobs)
                elif text:
                    yield Piece(index, text, None, logprobs)
        for request in requests:
            self.record(request, "failed" if failure([request]) else "finished")


def failure(requests: list[EngineRequest]) -> str | None:
    """The engine's error if it failed one of the requests' samples."""
    return next((seq.error for request in requests for seq in request.samples
                 if seq.finish_reason is FinishReason.ERROR), None)


def sample_error(requests: list[EngineRequest], index: int) -> str | None:
    """The engine's error for sample ``index`` of ``requests`` (numbered as by
    :meth:`Follower.follow`)."""
    return [seq for request in requests for seq in request.samples][index].error


def usage_of(requests: list[EngineRequest]) -> dict:
    """The usage of every prompt's request, summed (all ``best_of`` samples count)."""
    return usage(sum(request.seq.num_prompt_tokens for request in requests),
                 [seq.output for request in requests for seq in request.samples])
