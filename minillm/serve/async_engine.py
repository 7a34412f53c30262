"""The engine behind an asyncio server: one step at a time in a worker thread.

The engine (:class:`~minillm.serve.llm.LLM`) is a plain synchronous object: ``step()``
runs one forward pass. A web server is asynchronous: many request handlers wait at once,
and none may block the event loop for the ~50 ms a step takes. :class:`AsyncEngine`
joins the two:

* one task, :meth:`run`, steps the engine while it has work, each step in the engine's own
  thread (:class:`StepThread`), so the event loop keeps accepting connections meanwhile;
* handlers never touch the engine directly. New requests and cancellations are queued and
  applied *between* steps, on the event loop, so the scheduler is never changed while a
  step runs;
* after each step, every request that is still followed gets its ``updated`` event set;
  its handler then reads the new tokens from the request's :class:`Sequence`.

Failures never vanish into the task. A step that raises has already failed its own
requests inside the engine (``finish_reason`` "error"), and the loop goes on. If the
engine cannot go on (:class:`~.errors.EngineDeadError`, or any error outside a step's
computation), :attr:`dead` says why, every followed request is woken to find its error,
and :meth:`submit` refuses new ones at once. The step thread is a daemon: a step stuck in
native code cannot keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from ..sampling import SamplingParams
from .errors import EngineDeadError
from .llm import LLM
from .sequence import Sequence

logger = logging.getLogger(__name__)


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


class StepThread:
    """One daemon thread that runs the engine's steps, so the event loop stays free and a
    stuck step does not hold the process at exit (``asyncio.to_thread``'s pool would)."""

    def __init__(self):
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="minillm-engine", daemon=True).start()

    async def run(self, function: Callable[[], object]):
        """``function()`` in the thread; its result or its exception, here."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.calls.put((function, loop, done))
        return await done

    def _serve(self) -> None:
        while True:
            function, loop, done = self.calls.get()
            try:
                result, error = function(), None
            except BaseException as raised:  # noqa: BLE001 - handed to the awaiting task
                result, error = None, raised
            loop.call_soon_threadsafe(_settle, done, result, error)


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    """Give ``future`` its result or exception, unless its waiter has gone."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class AsyncEngine:
    def __init__(self, llm: LLM):
        self.llm = llm
        self.submissions: list[_Submission] = []
        self.cancellations: list[Sequence] = []
        self.followed: list[Request] = []
        self.work = asyncio.Event()  # set when something is queued for the engine
        self.dead: str | None = None  # why the engine stopped, once it has
        self.steps = StepThread()

    async def submit(self, prompt: Seq[int], params: SamplingParams) -> Request:
        """Queue a request; returns once the engine has taken it (or finished it with an
        error: see ``request.seq.error``). Raises :class:`EngineDeadError` once the engine
        has stopped."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
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
        """Step the engine until the task is cancelled or the engine stops."""
        try:
            while True:
                self._apply_queued()
                if not self.llm.has_work:
                    self.work.clear()
                    await self.work.wait()
                    continue
                await self.steps.run(self.llm.step)
                self._notify()
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - the engine cannot go on
            self._stop(error)

    def _stop(self, error: BaseException) -> None:
        """The engine cannot go on: fail everything it holds and everything queued."""
        if not isinstance(error, EngineDeadError):
            logger.error("the engine stopped", exc_info=error)
        self.dead = str(error) if isinstance(error, EngineDeadError) else (
            f"the engine stopped ({type(error).__name__}: {error}); restart the server")
        if self.llm.dead is None:
            self.llm.stop(self.dead)
        for submission in self.submissions:
            _settle(submission.accepted, None, EngineDeadError(self.dead))
        self.submissions = []
        self._notify()

    def _apply_queued(self) -> None:
        submissions, self.submissions = self.submissions, []
        for submission in submissions:
            try:
                request = Request(self.llm.add_request(submission.prompt, submission.params))
            except Exception as error:  # noqa: BLE001 - that submitter gets the error
                _settle(submission.accepted, None, error)
                continue
            if submission.accepted.cancelled():  # its client went away while it queued
                self.llm.abort(request.seq)
                continue
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
