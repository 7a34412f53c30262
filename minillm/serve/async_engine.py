"""The engine behind an asyncio server: one step at a time in a worker thread.

The engine (:class:`~minillm.serve.llm.LLM`) is a plain synchronous object: ``step()``
runs one forward pass. A web server is asynchronous: many request handlers wait at once,
and none may block the event loop for the ~50 ms a step takes. :class:`AsyncEngine`
joins the two:

* one task, :meth:`run`, steps the engine while it has work, each step in a worker thread
  (``asyncio.to_thread``), so the event loop keeps accepting connections meanwhile;
* handlers never touch the engine directly. New requests and cancellations are queued and
  applied *between* steps, on the event loop, so the scheduler is never changed while a
  step runs;
* after each step, every request that is still followed gets its ``updated`` event set;
  its handler then reads the new tokens from the request's :class:`Sequence`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from ..sampling import SamplingParams
from .llm import LLM
from .sequence import Sequence


@dataclass
class Request:
    """One request as a handler follows it: its sequence and its samples (``n > 1``)."""

    seq: Sequence
    updated: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def samples(self) -> list[Sequence]:
        return [self.seq, *self.seq.samples]

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.samples)


@dataclass
class _Submission:
    prompt: list[int]
    params: SamplingParams
    accepted: asyncio.Future


class AsyncEngine:
    def __init__(self, llm: LLM):
        self.llm = llm
        self.submissions: list[_Submission] = []
        self.cancellations: list[Sequence] = []
        self.followed: list[Request] = []
        self.work = asyncio.Event()  # set when something is queued for the engine

    async def submit(self, prompt: Seq[int], params: SamplingParams) -> Request:
        """Queue a request; returns once the engine has taken it (or finished it with an
        error: see ``request.seq.error``)."""
        accepted = asyncio.get_running_loop().create_future()
        self.submissions.append(_Submission(list(prompt), params, accepted))
        self.work.set()
        return await accepted

    def cancel(self, seq: Sequence) -> None:
        """Abort ``seq`` (one sample, or a whole request when given its first sequence and
        it has no other unfinished samples) before the next step; its blocks are freed."""
        self.cancellations.append(seq)
        self.work.set()

    async def run(self) -> None:
        """Step the engine forever (until the task is cancelled)."""
        while True:
            self._apply_queued()
            if not self.llm.has_work:
                self.work.clear()
                await self.work.wait()
                continue
            await asyncio.to_thread(self.llm.step)
            self._notify()

    def _apply_queued(self) -> None:
        submissions, self.submissions = self.submissions, []
        for submission in submissions:
            request = Request(self.llm.add_request(submission.prompt, submission.params))
            self.followed.append(request)
            submission.accepted.set_result(request)
        cancellations, self.cancellations = self.cancellations, []
        for seq in cancellations:
            self.llm.abort_sample(seq)
        if submissions or cancellations:
            self._notify()

    def _notify(self) -> None:
        for request in self.followed:
            request.updated.set()
        self.followed = [r for r in self.followed if not r.finished]
