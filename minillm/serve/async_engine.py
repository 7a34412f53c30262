"""The engine behind an asyncio server: one step at a time in a worker thread.

The engine core (:class:`~minillm.engine.core.EngineCore`) is a plain synchronous object:
``step()`` runs one forward pass. A web server is asynchronous: many request handlers wait
at once, and none may block the event loop for the ~50 ms a step takes.
:class:`AsyncEngine` joins the two:

* one task, :meth:`run`, steps the engine while it has work, each step in the engine's own
  thread (:class:`StepThread`), so the event loop keeps accepting connections meanwhile;
* a step returns immutable deltas; back on the event loop the output processor turns
  them into each sample's :class:`~.output_processor.Update` (text, stop strings), and
  each goes into the queue its handler reads. Nothing outside the engine thread ever
  reads the engine's sequences;
* handlers never touch the engine directly. New requests and cancellations are queued and
  applied *between* steps, on the event loop, so the scheduler is never changed while a
  step runs.

Failures never vanish into the task. A step that raises has already failed its own
requests inside the engine (their updates say "error"), and the loop goes on. If the
engine cannot go on (:class:`~minillm.engine.errors.EngineDeadError`, or any error outside
a step's computation), :attr:`dead` says why, every followed request gets its error, and
:meth:`submit` refuses new ones at once. The step thread is a daemon: a step stuck in
native code cannot keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from ..engine.errors import EngineDeadError
from ..sampling import SamplingParams
from .llm import LLM
from .output_processor import OutputProcessor, RequestOutput, Update

logger = logging.getLogger(__name__)


@dataclass
class Request:
    """One request as a handler follows it: its output (growing as updates come), the
    queue its samples' updates go to (a handler may share one queue between the requests
    it follows), and why the engine refused it at submission, if it did."""

    output: RequestOutput
    updates: asyncio.Queue[Update]
    rejected: str | None = None

    @property
    def request_id(self) -> int:
        return self.output.request_id

    @property
    def finished(self) -> bool:
        return self.output.finished


@dataclass
class _Submission:
    prompt: list[int]
    params: SamplingParams
    updates: asyncio.Queue[Update]
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
    def __init__(self, llm: LLM, processor: OutputProcessor | None = None):
        """``processor``: how the followed requests' text is made (default: the engine's
        own; a server passes one of its own, with the engine's sample streams)."""
        self.llm = llm
        self.processor = processor or llm.processor
        self.submissions: list[_Submission] = []
        self.cancellations: list[tuple[int, int | None]] = []
        self.followed: dict[int, Request] = {}
        self.work = asyncio.Event()  # set when something is queued for the engine
        self.dead: str | None = None  # why the engine stopped, once it has
        self.steps = StepThread()

    async def submit(self, prompt: Seq[int], params: SamplingParams,
                     updates: asyncio.Queue[Update] | None = None) -> Request:
        """Queue a request whose updates go to ``updates`` (default: a queue of its own);
        returns once the engine has taken it (or refused it: ``request.rejected`` says
        why). Raises :class:`EngineDeadError` once the engine has stopped."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        accepted = asyncio.get_running_loop().create_future()
        self.submissions.append(_Submission(list(prompt), params, updates or asyncio.Queue(),
                                            accepted))
        self.work.set()
        return await accepted

    def cancel(self, request: Request, index: int | None = None) -> None:
        """Abort a request (or its sample ``index``) before the next step; its blocks are
        freed."""
        self.cancellations.append((request.request_id, index))
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
                deltas = await self.steps.run(self.llm.core.step)
                self._dispatch(self.llm.process(deltas, self.processor))
                if self.llm.core.dead is not None:
                    raise EngineDeadError(self.llm.core.dead)
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
        if self.llm.core.dead is None:
            self._dispatch(self.llm.process(self.llm.core.stop(self.dead), self.processor))
        for submission in self.submissions:
            _settle(submission.accepted, None, EngineDeadError(self.dead))
        self.submissions = []

    def _apply_queued(self) -> None:
        submissions, self.submissions = self.submissions, []
        for submission in submissions:
            try:
                output = self.llm.admit(submission.prompt, submission.params, self.processor)
            except Exception as error:  # noqa: BLE001 - that submitter gets the error
                _settle(submission.accepted, None, error)
                continue
            request = Request(output, submission.updates,
                              output.error if output.finished else None)
            if submission.accepted.cancelled():  # its client went away while it queued
                self._abort(request.request_id)
            elif not request.finished:
                self.followed[request.request_id] = request
            if not submission.accepted.cancelled():
                submission.accepted.set_result(request)
        cancellations, self.cancellations = self.cancellations, []
        for request_id, index in cancellations:
            self._abort(request_id, index)

    def _abort(self, request_id: int, index: int | None = None) -> None:
        """Cancel in the core, and stop following what no longer runs."""
        self.llm.core.abort(request_id, index)
        self.processor.abort(request_id, index)
        request = self.followed.get(request_id)
        if request is not None and request.finished:
            del self.followed[request_id]

    def _dispatch(self, updates: list[Update]) -> None:
        """Hand each update to its request's handler."""
        for update in updates:
            if (request := self.followed.get(update.request_id)) is not None:
                request.updates.put_nowait(update)
        self.followed = {request_id: request for request_id, request in self.followed.items()
                         if not request.finished}
