"""The engine core: requests in, immutable deltas out, one step at a time.

    core = EngineCore(model, EngineConfig(num_blocks=256))
    core.add(0, prompt_ids, SamplingParams(max_tokens=32))
    while core.has_work:
        for delta in core.step(): ...          # RequestDelta: new tokens, finish reason

Every :meth:`step` is one iteration: the scheduler picks the work (:mod:`.scheduler`), the
block manager gives it cache blocks (:mod:`.block_manager`), a proposer may add guesses
(:mod:`.proposers`), the runner computes and samples (:mod:`.runner`), and the scheduler
applies the result, in one place. The core's sequences never leave it: what a client sees
is a :class:`~.deltas.RequestDelta` per sample that changed, and turning those into text,
stop strings and streams is the output processor's job
(:mod:`minillm.serve.output_processor`).

Bad requests do not take the batch down: :meth:`add` refuses one that cannot be served (an
empty prompt, a prompt past the context, more KV blocks than the pool holds...) with
:class:`RequestRejected`, saying why, before anything is queued. A step that raises fails
the requests it was computing, with the error's text, and frees their blocks; the next
step runs. Only an engine that cannot compute any more (a dead tensor-parallel worker:
:class:`~.errors.EngineDeadError`) stops: every request fails with the reason,
:attr:`dead` says it, and every later :meth:`step` raises it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from ..checkpoint import load_model, resolve_checkpoint
from ..config import ModelConfig
from ..draft_head.head import DraftHead
from ..draft_head.storage import load_head
from ..model import Transformer
from ..sampling import SamplingParams, sample_seed
from .config import EngineConfig
from .deltas import Preemption, RequestDelta, StepReport, Work
from .errors import EngineDeadError
from .head_proposer import DraftHeadProposer
from .parallel_runner import TensorParallelRunner
from .proposers import DraftModelProposer, PromptLookupProposer
from .runner import ModelRunner
from .sampler import Sampler
from .scheduler import Scheduler
from .sequence import FinishReason, Sequence
from .step import NO_DRAFT, Draft, Step
from .structured import StructuredOutputs

logger = logging.getLogger(__name__)


class RequestRejected(ValueError):
    """A request the engine cannot serve; the message says why and what to do."""


class EngineCore:
    def __init__(self, model: str | Transformer, config: EngineConfig | None = None,
                 tokenizer=None, on_step: Callable[[StepReport], None] | None = None):
        """``model``: a loaded model, or a checkpoint's name or directory (tensor
        parallelism needs the latter: every rank loads its own shard). ``tokenizer``: needed
        for structured output. ``on_step(report)`` sees every step's
        :class:`~.deltas.StepReport`."""
        self.config = config = config or EngineConfig()
        self.blocks = config.make_block_manager()
        self.runner = self._runner(model, tokenizer)
        self.model = self.runner.model
        self.proposer = self._proposer()
        self.scheduler = Scheduler(config.scheduler, self.blocks, self.proposer,
                                   window=self.model.config.release_window())
        self.requests: dict[int, Sequence] = {}  # request id -> its first sample
        self.on_step = on_step
        self.dead: str | None = None  # why the engine stopped, once it has

    def _runner(self, model: str | Transformer, tokenizer) -> ModelRunner:
        config, blocks = self.config, self.blocks
        if config.tensor_parallel_size > 1 and isinstance(model, Transformer):
            raise ValueError("with tensor_parallel_size > 1 every process loads its own "
                             "shard: pass the checkpoint's name or path, not a loaded model")
        vocab = (model.config if isinstance(model, Transformer) else
                 ModelConfig.from_json(resolve_checkpoint(model) / "config.json")).vocab_size
        sampler = Sampler(config.verifier, StructuredOutputs(
            tokenizer, vocab, config.structured_backend, config.jump_forward))
        if config.tensor_parallel_size > 1:
            return TensorParallelRunner(
                model, config.tensor_parallel_size, blocks.num_blocks, blocks.block_size,
                config.slot_mapping, shard_attention=config.shard_attention,
                shard=config.shard_weight, layers=config.parallel_layers,
                worker_timeout=config.worker_timeout,
                executor=config.executor, sampler=sampler,
                kv_cache_dtype=config.kv_cache_dtype)
        model = model if isinstance(model, Transformer) else load_model(model)
        return ModelRunner(model, blocks.num_blocks, blocks.block_size, config.slot_mapping,
                           config.executor, sampler, config.decode_attention,
                           config.kv_cache_dtype,
                           keep_hidden=config.draft_head is not None)

    def _proposer(self) -> DraftModelProposer | DraftHeadProposer | PromptLookupProposer | None:
        """Who guesses for speculation: the draft model (its own paged pool, this engine's
        block tables), a draft head (over the target's hidden states), or prompt lookup;
        None without speculation."""
        config = self.config
        if config.draft_head is not None:
            head = config.draft_head if isinstance(config.draft_head, DraftHead) else \
                load_head(config.draft_head)
            return DraftHeadProposer(head, self.model)
        if config.draft_model is None:
            return PromptLookupProposer(config.scheduler.drafter) \
                if config.scheduler.speculative_tokens else None
        draft = config.draft_model if isinstance(config.draft_model, Transformer) else \
            load_model(config.draft_model)
        if draft.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({draft.config.vocab_size} tokens) "
                             f"is not the target's ({self.model.config.vocab_size}); a draft "
                             "must share the target's tokenizer")
        return DraftModelProposer(draft, self.blocks.num_blocks, self.blocks.block_size,
                                  config.slot_mapping, config.executor)

    def close(self) -> None:
        """Release the engine's processes (tensor parallelism); the core is unusable after."""
        self.runner.close()

    # -- requests -----------------------------------------------------------------------

    def add(self, request_id: int, prompt: list[int], params: SamplingParams,
            arrival_time: float | None = None) -> None:
        """Queue a request for ``params.n`` samples of ``prompt``, which arrived at
        ``arrival_time`` (``time.perf_counter()``; default: now; dynamic batching counts its
        wait from it). Raises :class:`RequestRejected` (nothing queued) if it cannot be
        served, and :class:`~.errors.EngineDeadError` once the engine has stopped."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        if request_id in self.requests:
            raise RequestRejected(f"request id {request_id} is already in use")
        seq, *samples = [
            Sequence(prompt=list(prompt), params=replace(
                params, n=1, seed=None if params.seed is None else sample_seed(params.seed, i)),
                max_tokens=params.max_tokens, stop_tokens=frozenset(params.stop_token_ids),
                request_id=request_id, index=i,
                arrival_time=time.perf_counter() if arrival_time is None else arrival_time)
            for i in range(params.n)]  # sample i draws with seed + i: a lone request's tokens
        seq.samples = samples
        if (reason := self._rejection(seq)) is not None:
            raise RequestRejected(reason)
        self.requests[request_id] = seq
        self.scheduler.add(seq)

    def _rejection(self, seq: Sequence) -> str | None:
        """Why ``seq`` cannot be served, or None."""
        context, vocab = self.model.config.max_position_embeddings, self.model.config.vocab_size
        needed = self._blocks_held_at_most(seq)
        max_batch = self.scheduler.config.max_batch
        if seq.num_seats > max_batch:
            return (f"n={seq.num_seats} samples do not fit in a batch of {max_batch} "
                    "sequences; lower n or raise SchedulerConfig(max_batch=...)")
        if not seq.prompt:
            return "the prompt is empty; give at least one token"
        if any(not 0 <= t < vocab for t in seq.prompt):
            return f"the prompt has token ids outside the vocabulary (0..{vocab - 1})"
        if seq.num_prompt_tokens + seq.max_tokens > context:
            return (f"the prompt ({seq.num_prompt_tokens} tokens) plus max_tokens "
                    f"({seq.max_tokens}) exceeds the model's context of {context} tokens")
        if any(not 0 <= t < vocab for t, _ in seq.params.logit_bias):
            return f"logit_bias names token ids outside the vocabulary (0..{vocab - 1})"
        if seq.params.structured is not None and \
                (error := self.runner.sampler.structured.check(seq.params.structured)):
            return error
        if needed > self.blocks.num_blocks:
            return (f"the request needs {needed} KV blocks but the pool has "
                    f"{self.blocks.num_blocks}; lower max_tokens or give the engine more blocks")
        return None

    def _blocks_held_at_most(self, seq: Sequence) -> int:
        """The most blocks ``seq`` holds at once: those of all its tokens, or, when every
        layer has a sliding window, those of the window and one step's new tokens (and the
        partly visible block)."""
        every_token = self.blocks.blocks_for(seq.num_prompt_tokens + seq.max_tokens)
        window, config = self.scheduler.window, self.scheduler.config
        if window is None:
            return every_token
        step = config.max_tokens_per_step
        if not config.chunked_prefill:  # a prompt is computed in one step
            step = max(step, seq.num_prompt_tokens)
        return min(every_token, self.blocks.blocks_for(window + step) + 1)

    def abort(self, request_id: int, index: int | None = None) -> None:
        """Cancel a request's samples (all of them, or sample ``index``); their blocks are
        free after this call. Unknown or finished requests are ignored."""
        seq = self.requests.get(request_id)
        if seq is None:
            return
        chosen = [s for s in _samples(seq) if index is None or s.index == index]
        for sample in chosen:
            if not sample.finished:
                self.scheduler.abort(sample)
        self._retire(chosen)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def kv_bytes_per_block(self) -> int:
        """Bytes one block of the paged pool holds (keys and values of every layer; rank
        0's heads under tensor parallelism)."""
        return self.runner.cache.bytes_per_block()

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # -- steps --------------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        """One iteration; returns a delta per sample that changed in it (none when nothing
        could run yet, e.g. dynamic batching waiting to fill a batch). If computing the
        step raises, the step's requests fail (their deltas say why) and the engine goes
        on; if the engine cannot go on, every request fails and :attr:`dead` says why."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        step = self.scheduler.schedule()
        preempted = tuple(Preemption(s.request_id, s.index, computed, s.num_tokens, cost)
                          for s, computed, cost in step.preempted)
        if not step.work:
            self._report(StepReport(preempted=preempted))
            return []
        started = time.perf_counter()
        starts = [seq.num_computed for seq, _ in step.work] if self.on_step else []
        drafts: dict[int, Draft] = {}
        try:
            if step.guesses:
                drafts = self.proposer.propose(step)
            result = self.runner.run(step, drafts)
            if result.hidden:
                self.proposer.observe(result.hidden)
        except EngineDeadError as error:
            return self.stop(str(error))
        except Exception as error:  # noqa: BLE001 - the step's requests carry the error
            return self._fail_step(step, error)
        seconds = time.perf_counter() - started
        deltas = self.scheduler.apply(step, drafts, result.sampled)
        if self.on_step is not None:  # built only for an observer: host time per step counts
            self.on_step(StepReport(
                tuple(Work(s.request_id, s.index, n + len(drafts.get(s.id, NO_DRAFT).tokens), start)
                      for (s, n), start in zip(step.work, starts, strict=True)),
                preempted, result.executor, result.forward_seconds, seconds))
        self._retire([_samples(self.requests[d.request_id])[d.index]
                      for d in deltas if d.finished])
        return deltas

    def _report(self, report: StepReport) -> None:
        if self.on_step is not None:
            self.on_step(report)

    def _retire(self, seqs: list[Sequence]) -> None:
        """Drop what the runner (and a proposer) kept for these finished sequences, and
        the requests whose samples have all finished."""
        for seq in seqs:
            self.runner.forget(seq)
            if self.proposer is not None:
                self.proposer.forget(seq)
        for request_id in {seq.request_id for seq in seqs}:
            first = self.requests.get(request_id)
            if first is not None and all(s.finished for s in _samples(first)):
                del self.requests[request_id]

    def _fail_step(self, step: Step, error: Exception) -> list[RequestDelta]:
        """Finish the requests of a step that raised, with the error; free their blocks."""
        logger.error("an engine step failed; its %d requests fail, the others go on",
                     len(step.work), exc_info=error)
        message = (f"the engine failed while computing this request ({type(error).__name__}: "
                   f"{error}); other requests were not affected, and retrying may work")
        return self._fail([s for seq, _ in step.work for s in (seq, *seq.unforked_samples)],
                          message)

    def stop(self, reason: str) -> list[RequestDelta]:
        """Stop the engine for good: every unfinished request fails with ``reason`` (the
        returned deltas say so), its blocks are freed, and every later step raises
        :class:`~.errors.EngineDeadError`."""
        self.dead = reason
        return self._fail([s for seq in self.requests.values() for s in _samples(seq)
                           if not s.finished], reason)

    def _fail(self, seqs: list[Sequence], message: str) -> list[RequestDelta]:
        """Finish ``seqs`` with an error; their deltas say why."""
        for seq in seqs:
            self.scheduler.abort(seq, FinishReason.ERROR, message)
        self._retire(seqs)
        now = time.perf_counter()
        return [RequestDelta(seq.request_id, seq.index, finish_reason=FinishReason.ERROR.value,
                             error=message, time=now) for seq in seqs]


def _samples(seq: Sequence) -> list[Sequence]:
    """A request's samples, by index."""
    return [seq, *seq.samples]
