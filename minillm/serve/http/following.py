"""Following engine requests as they run: each sample's new text, its finish, its error,
its usage; and cancelling what a client no longer wants.

The engine's output processor has already made the text (incremental detokenisation, stop
strings held back across tokens: :mod:`minillm.serve.output_processor`); what arrives here
is each sample's :class:`~minillm.serve.output_processor.Update`, through the queue the
handler gave the engine. This module turns them into :class:`Piece` s of the response,
numbered as OpenAI numbers choices, and never reads the engine's own state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from ...sampling import TokenLogprob
from ..async_engine import AsyncEngine
from ..async_engine import Request as EngineRequest
from ..output_processor import Update
from .responses import Piece, usage


class Follower:
    """Follows the requests of one ``engine``, and calls ``record(request, outcome)`` once a
    followed request has ended."""

    def __init__(self, engine: AsyncEngine, record: Callable[[EngineRequest, str], None]):
        self.engine, self.record = engine, record

    def cancel(self, request: EngineRequest) -> None:
        """Stop each of ``request``'s samples still running (their blocks are freed before
        the engine's next step)."""
        if not request.finished:
            self.engine.cancel(request)

    async def follow(self, requests: list[EngineRequest], updates: asyncio.Queue[Update]
                     ) -> AsyncIterator[Piece]:
        """Each sample's new text as the engine produces it, from ``updates`` (the queue
        every one of ``requests`` reports to), with the log-probabilities of the tokens
        consumed since the sample's last piece, when recorded. The samples of all
        ``requests`` are numbered in order: request p's sample s is ``p * samples + s``."""
        first = {request.request_id: p * len(request.output.outputs)
                 for p, request in enumerate(requests)}
        pending: dict[int, list[TokenLogprob]] = {}
        while not all(request.finished for request in requests) or not updates.empty():
            update = await updates.get()
            index = first[update.request_id] + update.index
            pending.setdefault(index, []).extend(update.logprobs)
            if update.text or update.finish_reason is not None:
                yield Piece(index, update.text, update.finish_reason, pending.pop(index))
        for request in requests:
            self.record(request, "failed" if failure([request]) else "finished")


def failure(requests: list[EngineRequest]) -> str | None:
    """The engine's error if it failed one of the requests' samples."""
    return next((request.output.error for request in requests
                 if any(o.finish_reason == "error" for o in request.output.outputs)), None)


def usage_of(requests: list[EngineRequest]) -> dict:
    """The usage of every prompt's request, summed (all ``best_of`` samples count)."""
    return usage(sum(len(request.output.prompt_tokens) for request in requests),
                 [output.tokens for request in requests for output in request.output.outputs])
