"""``LLM``: the engine with vLLM's offline API and a streaming request API.

    from minillm.serve import LLM
    from minillm import SamplingParams
    llm = LLM("smollm2")
    outputs = llm.generate(["The capital of France is", "Once upon a time"],
                           SamplingParams(max_tokens=32, stop=["\\n"]))

A thin front end over two parts (:mod:`minillm.engine` has the picture):

* the engine core (:class:`~minillm.engine.core.EngineCore`): requests in, one step at a
  time, immutable token deltas out;
* the output processor (:mod:`.output_processor`): deltas in, text with stop strings,
  log-probabilities and finished outputs out, the same for every client.

``LLM(model, **options)`` takes :class:`~minillm.engine.config.EngineConfig`'s fields as
keywords (or ``config=EngineConfig(...)``): pool sizes, ``scheduler=SchedulerConfig(...)``
(batching policy, chunked prefill, ``speculative_tokens``), ``executor``,
``tensor_parallel_size``, ``draft_model``, and the seams the course's labs use to run
the learner's parts in the engine. ``on_step(report)`` watches every step without
patching anything (:class:`~minillm.engine.deltas.StepReport`).

Requests join and leave between steps: :meth:`add_request` returns a request id,
:meth:`step` advances every request by one iteration and returns each sample's
:class:`~.output_processor.Update`, :meth:`output` is a request's
:class:`~.output_processor.RequestOutput`, :meth:`abort` cancels one and frees its blocks.
A request the engine cannot serve (an empty prompt, a prompt past the context...)
finishes at once with ``finish_reason`` "error" and the reason; a step that fails, fails
its own requests only; an engine that cannot go on (a dead tensor-parallel worker) fails
every request and raises :class:`~minillm.engine.errors.EngineDeadError`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import replace

from tqdm.auto import tqdm

from ..engine.config import EngineConfig
from ..engine.core import EngineCore, RequestRejected
from ..engine.deltas import RequestDelta, StepReport
from ..engine.errors import EngineDeadError
from ..model import Transformer
from ..sampling import SamplingParams
from ..tokenizer import Tokenizer
from .output_processor import OutputProcessor, RequestOutput, Update
from .sample_stream import SampleStream, StreamFactory


class LLM:
    """An engine over a model (a loaded :class:`~minillm.model.Transformer`, or a
    checkpoint's name or directory) and its tokenizer (loaded from the checkpoint when not
    given; without one, prompts and outputs are token ids only). ``sample_stream(tokenizer,
    params)`` makes each sample's text stream (:mod:`.sample_stream`) for every client of
    this engine, its server included (chapter 15's lab passes the learner's)."""

    def __init__(self, model: str | Transformer = "smollm2", config: EngineConfig | None = None,
                 *, tokenizer=None, on_step: Callable[[StepReport], None] | None = None,
                 sample_stream: StreamFactory = SampleStream, **options):
        if config is not None and options:
            raise ValueError(f"give config= or its fields as keywords, not both "
                             f"({', '.join(options)})")
        if tokenizer is None and not isinstance(model, Transformer):
            tokenizer = Tokenizer(model)
        self.tokenizer = tokenizer
        self.core = EngineCore(model, config or EngineConfig(**options), tokenizer, on_step)
        self.processor = OutputProcessor(tokenizer, sample_stream=sample_stream)
        self.outputs: dict[int, RequestOutput] = {}  # until the client takes them
        self._ids = itertools.count()

    @property
    def model(self) -> Transformer:
        """The model the engine runs (prepared for its executors; not the caller's object)."""
        return self.core.model

    @property
    def blocks(self):
        """The paged pool's block manager (the course's chapters inspect it)."""
        return self.core.blocks

    def close(self) -> None:
        """Release the engine's processes (tensor parallelism); the engine is unusable after."""
        self.core.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -----------------------------------------------------------------------

    def add_request(self, prompt: str | Seq[int], params: SamplingParams = SamplingParams(),
                    arrival_time: float | None = None) -> int:
        """Queue one request, which arrived at ``arrival_time`` (``time.perf_counter()``;
        default: now); returns its id. A request that cannot be served is finished at once
        with an error (see :meth:`output`). A stopped engine raises
        :class:`EngineDeadError`."""
        output = self.admit(prompt, params, self.processor, arrival_time)
        self.outputs[output.request_id] = output
        return output.request_id

    def admit(self, prompt: str | Seq[int], params: SamplingParams,
              processor: OutputProcessor, arrival_time: float | None = None) -> RequestOutput:
        """Give the core one request and ``processor`` its output to follow (the server
        follows its requests with a processor of its own); returns the output, finished
        at once with the reason if the core refused the request."""
        tokens = self._tokens(prompt)
        if self.tokenizer is not None:  # the model's own end-of-reply tokens stop it too
            stops = {*params.stop_token_ids, *self.tokenizer.stop_tokens}
            params = replace(params, stop_token_ids=tuple(sorted(stops)))
        request_id, arrival = next(self._ids), arrival_time or time.perf_counter()
        try:
            self.core.add(request_id, tokens, params, arrival)
        except RequestRejected as rejection:
            return processor.reject(request_id, tokens, params, str(rejection))
        return processor.add(request_id, tokens, params, arrival)

    def _tokens(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass token ids")
            return self.tokenizer.prompt(prompt)
        return [int(t) for t in prompt]

    def abort(self, request_id: int, index: int | None = None) -> None:
        """Cancel a request (all its samples, or sample ``index``); its blocks are free after
        this call and its unfinished samples finish with "abort"."""
        self.core.abort(request_id, index)
        self.processor.abort(request_id, index)

    @property
    def has_work(self) -> bool:
        return self.core.has_work

    def free_blocks(self) -> int:
        return self.core.blocks.num_free

    def step(self) -> list[Update]:
        """One iteration of the engine: every sample's progress in it (text and tokens).
        If the engine stopped for good in this step, raises :class:`EngineDeadError`
        after recording every request's failure."""
        updates = self.process(self.core.step())
        if self.core.dead is not None:
            raise EngineDeadError(self.core.dead)
        return updates

    def process(self, deltas: list[RequestDelta], processor: OutputProcessor | None = None
                ) -> list[Update]:
        """Turn one step's deltas into updates with ``processor`` (default: this engine's;
        :meth:`step` calls it, the server with its own on its event loop, after a step run
        in its engine thread). A sample a stop string ended is aborted in the core at once,
        so its blocks are free."""
        updates = (processor or self.processor).process(deltas)
        for update in updates:
            if update.stopped:
                self.core.abort(update.request_id, update.index)
        return updates

    def output(self, request_id: int) -> RequestOutput:
        """A request's output so far (finished or not); a finished one is handed over for
        good (asking again is an error)."""
        output = self.outputs[request_id]
        if output.finished:
            del self.outputs[request_id]
        return output

    # -- offline and streaming use --------------------------------------------------------

    def generate(self, prompts: Seq[str | Seq[int]],
                 params: SamplingParams | Seq[SamplingParams] = SamplingParams(),
                 progress: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion (one SamplingParams, or one per prompt)."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        with tqdm(total=len(ids), desc="requests", disable=not progress) as bar:
            while True:
                bar.update(sum(self.outputs[i].finished for i in ids) - bar.n)
                if not self.has_work:
                    break
                self.step()
        return [self.output(i) for i in ids]

    def stream(self, prompt: str | Seq[int], params: SamplingParams = SamplingParams()
               ) -> Iterator[Update]:
        """Yield one request's progress as the engine makes it, stepping the engine (with
        every other request in it): each :class:`~.output_processor.Update` has the new
        ``text`` and ``token_ids``; the last has the ``finish_reason``. Closing the
        generator aborts the request."""
        if params.n != 1:
            raise ValueError(f"stream() follows one sample (got n={params.n}); for several, use "
                             "add_request() and read each of the request's samples, or generate()")
        request_id = self.add_request(prompt, params)
        try:
            output = self.outputs[request_id]
            if output.finished:  # rejected
                yield Update(request_id, 0, "", (), (), output.finish_reason, output.error)
            while not output.finished:
                yield from (u for u in self.step() if u.request_id == request_id)
        finally:
            self.abort(request_id)
            self.outputs.pop(request_id, None)
