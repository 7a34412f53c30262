"""``LLM``: the serving engine, with vLLM's offline API and a streaming request API.

    from minillm.serve import LLM
    from minillm import SamplingParams
    llm = LLM("smollm2")
    outputs = llm.generate(["The capital of France is", "Once upon a time"],
                           SamplingParams(max_tokens=32))

Underneath, every :meth:`step` is one iteration: the scheduler picks the work
(:mod:`.scheduler`), the block manager gives it cache blocks (:mod:`.block_manager`), the
runner computes and samples (:mod:`.runner`). Requests join and leave between steps, so
``add_request`` / :meth:`stream` / :meth:`abort` work while others are running (what the
HTTP server sits on). ``SamplingParams(n=...)`` asks for several samples of one prompt:
they fork from the computed prompt and share its blocks (``RequestOutput.outputs``).

Bad requests do not take the batch down: an empty prompt, a prompt longer than the
context, or a request that needs more KV blocks than the whole pool finishes at once with
``finish_reason`` "error" and a message; the other requests go on. A step that raises
fails the requests it was computing, the same way, and frees their blocks
(:mod:`.errors`); only an engine that cannot compute any more (a dead tensor-parallel
worker) stops, failing every request and raising :class:`~.errors.EngineDeadError`.

``SchedulerConfig(speculative_tokens=γ)`` turns on speculative decoding: prompt lookup
guesses by default, or, with ``draft_model=``, a smaller model with its own paged pool
(:mod:`.proposers`); ``verifier=`` replaces the rejection-sampling rule (chapter 11).

``tensor_parallel_size=t`` runs the model's forward passes on ``t`` processes, each holding
a shard of every weight (:mod:`minillm.parallel.engine`); ``close()`` (or ``with LLM(...)``)
stops them. A worker that dies, or a step longer than ``worker_timeout`` seconds, stops
the engine with :class:`~.errors.EngineDeadError`.

Its parts can be swapped for your own (the course's "your code in the engine"):
``block_manager=`` a :class:`~.block_manager.BlockManager` (or subclass) instance,
``slot_mapping=`` the function that places new keys and values in the pool
(:class:`~.runner.ModelRunner`), ``decode_attention=`` the function that reads a decode's
keys and values through its block table (:class:`~.paged_cache.PagedKVCache`),
``SchedulerConfig(plan=...)`` the function that splits a step's token budget
(:func:`~.scheduler.plan_chunked_step`), ``SchedulerConfig(preempt=...)`` the one that
picks the requests to preempt when the KV blocks run out
(:func:`~.scheduler.preemption_victims`), and ``shard_weight=`` the function that cuts each
weight for tensor parallelism (:func:`~minillm.parallel.tensor.shard_weight`).

``SamplingParams(structured=...)`` constrains a request's output to a regex, a JSON
schema, a choice or a grammar (chapter 16, :mod:`.structured`): ``structured_backend=``
builds the constraint backend (default xgrammar; chapter 16 passes
``partial(AutomatonBackend, mask_fn=your_token_mask)``), and ``jump_forward=True``
appends the tokens a grammar forces without a forward pass each.

``on_step=`` watches the engine without patching it: it is called with every
:class:`~.scheduler.Step` once the step is done (its work, the requests it preempted, the
seconds the model took).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace

from tqdm.auto import tqdm

from ..attention.paged import slot_mapping as default_slot_mapping
from ..checkpoint import load_model, resolve_checkpoint
from ..config import ModelConfig
from ..model import Transformer
from ..parallel.tensor import ShardWeight
from ..sampling import SamplingParams
from ..structured.backend import XGrammarBackend
from ..tokenizer import Tokenizer
from .block_manager import BlockManager
from .errors import EngineDeadError
from .paged_cache import DecodeAttention
from .proposers import DraftModelProposer
from .runner import ModelRunner, SlotMapping
from .sampler import Sampler
from .scheduler import Scheduler, SchedulerConfig, Step
from .sequence import FinishReason, Sequence
from .structured import BackendFactory, StructuredOutputs

logger = logging.getLogger(__name__)


@dataclass
class CompletionOutput:
    """One sample of a request (vLLM's name)."""

    index: int
    tokens: list[int]  # generated tokens (a stop token included)
    text: str | None
    finish_reason: str | None


@dataclass
class RequestOutput:
    """A finished request. ``tokens``, ``text`` and ``finish_reason`` are its first sample's;
    ``outputs`` holds all ``n`` samples."""

    request_id: int
    prompt_tokens: list[int]
    tokens: list[int]  # generated tokens (a stop token included)
    text: str | None
    finish_reason: str | None
    error: str | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)


class LLM:
    """A continuous-batching engine over a paged KV cache of ``num_blocks`` blocks of
    ``block_size`` token slots. Given a ``block_manager``, the engine uses it (and its pool
    and block sizes) instead of building one from those three arguments. ``on_step(step)``
    is called after every step (:meth:`step`)."""

    def __init__(self, model: str | Transformer = "smollm2", *, block_size: int = 16,
                 num_blocks: int = 1024, prefix_caching: bool = True,
                 scheduler: SchedulerConfig | None = None, tokenizer=None,
                 block_manager: BlockManager | None = None,
                 slot_mapping: SlotMapping = default_slot_mapping,
                 tensor_parallel_size: int = 1, shard_attention: bool = True,
                 shard_weight: ShardWeight | None = None, worker_timeout: float = 60.0,
                 executor: str = "auto", draft_model: str | Transformer | None = None,
                 verifier=None, decode_attention: DecodeAttention | None = None,
                 on_step: Callable[[Step], None] | None = None,
                 structured_backend: BackendFactory = XGrammarBackend,
                 jump_forward: bool = False):
        self.blocks = block_manager or BlockManager(num_blocks, block_size, prefix_caching)
        config = scheduler or SchedulerConfig()
        if tokenizer is None and not isinstance(model, Transformer):
            tokenizer = Tokenizer(model)
        self.tokenizer = tokenizer
        self.structured = StructuredOutputs(tokenizer, _vocab_size(model), structured_backend,
                                            jump_forward)
        sampler = Sampler(verifier, self.structured)
        if tensor_parallel_size > 1:
            if decode_attention is not None:
                raise ValueError("decode_attention= runs in one process: leave "
                                 "tensor_parallel_size at 1")
            self.runner = self._parallel_runner(model, tensor_parallel_size, slot_mapping,
                                                shard_attention, shard_weight, worker_timeout,
                                                executor, sampler)
            self.model = self.runner.model
        else:
            self.model = model if isinstance(model, Transformer) else load_model(model)
            self.runner = ModelRunner(self.model, self.blocks.num_blocks,
                                      self.blocks.block_size, slot_mapping, executor, sampler,
                                      decode_attention)
        self.proposer = self._draft_proposer(draft_model, config, slot_mapping, executor)
        self.scheduler = Scheduler(config, self.blocks,
                                   self.proposer.guesses if self.proposer else None)
        self.requests: dict[int, Sequence] = {}
        self.last_step_tokens = 0
        self.on_step = on_step
        self.dead: str | None = None  # why the engine stopped, once it has

    def _draft_proposer(self, draft_model: str | Transformer | None, config: SchedulerConfig,
                        slot_mapping: SlotMapping, executor: str) -> DraftModelProposer | None:
        """The draft model's proposer (its own paged pool, this engine's block tables)."""
        if draft_model is None:
            return None
        if config.speculative_tokens < 1:
            raise ValueError("a draft model guesses for speculative decoding: give "
                             "SchedulerConfig(speculative_tokens=γ) with γ >= 1")
        draft = draft_model if isinstance(draft_model, Transformer) else load_model(draft_model)
        if draft.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({draft.config.vocab_size} tokens) "
                             f"is not the target's ({self.model.config.vocab_size}); a draft "
                             "must share the target's tokenizer")
        return DraftModelProposer(draft, self.blocks.num_blocks, self.blocks.block_size,
                                  slot_mapping, executor)

    def _parallel_runner(self, model, world: int, slot_mapping: SlotMapping,
                         shard_attention: bool, shard_weight: ShardWeight | None,
                         worker_timeout: float, executor: str, sampler: Sampler
                         ) -> ModelRunner:
        """Rank 0's runner of ``world`` tensor-parallel processes (chapter 14)."""
        from ..parallel.engine import TensorParallelRunner

        if isinstance(model, Transformer):
            raise ValueError("with tensor_parallel_size > 1 every process loads its own shard: "
                             "pass the checkpoint's name or path, not a loaded model")
        return TensorParallelRunner(model, world, self.blocks.num_blocks,
                                    self.blocks.block_size, slot_mapping,
                                    shard_attention=shard_attention, shard=shard_weight,
                                    worker_timeout=worker_timeout, executor=executor,
                                    sampler=sampler)

    def close(self) -> None:
        """Release the engine's processes (tensor parallelism); the engine is unusable after."""
        self.runner.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -----------------------------------------------------------------------

    def _tokens(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass token ids")
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def _rejection(self, seq: Sequence) -> str | None:
        """Why ``seq`` cannot be served, or None."""
        context, vocab = self.model.config.max_position_embeddings, self.model.config.vocab_size
        needed = self.blocks.blocks_for(seq.num_prompt_tokens + seq.max_tokens)
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
                (error := self.structured.check(seq.params.structured)) is not None:
            return error
        if needed > self.blocks.num_blocks:
            return (f"the request needs {needed} KV blocks but the pool has "
                    f"{self.blocks.num_blocks}; lower max_tokens or give the engine more blocks")
        return None

    def add_request(self, prompt: str | Seq[int], params: SamplingParams = SamplingParams()
                    ) -> Sequence:
        """Queue one request; a request that cannot be served is finished with an error.
        A stopped engine raises :class:`EngineDeadError`."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        stop = set(params.stop_token_ids)
        if self.tokenizer is not None:
            stop |= set(self.tokenizer.stop_tokens)
        prompt = self._tokens(prompt)
        seq, *samples = [Sequence(prompt=list(prompt), params=sample_params,
                                  max_tokens=params.max_tokens, stop_tokens=frozenset(stop))
                         for sample_params in _per_sample(params)]
        seq.samples = samples
        self.requests[seq.id] = seq
        if (reason := self._rejection(seq)) is not None:
            for s in (seq, *samples):
                s.finish(FinishReason.ERROR, reason)
        else:
            self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        """Cancel a request (all its samples); its blocks are free after this call."""
        for s in (*seq.samples, seq):
            self.abort_sample(s)

    def abort_sample(self, seq: Sequence) -> None:
        """Cancel one sequence (a request's other samples go on); its blocks are free after
        this call."""
        if not seq.finished:
            self.scheduler.abort(seq)
        self._forget(seq)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[Sequence]:
        """One iteration of the engine; returns the sequences that finished in it.
        ``last_step_tokens`` says how many tokens it computed (0: nothing could run yet,
        e.g. dynamic batching waiting to fill a batch).

        If computing the step raises, the step's requests finish with an error and the
        engine goes on; if the engine cannot go on (:class:`EngineDeadError`), every
        request fails and the error is raised, now and at every later call.

        Then ``on_step`` (if given) sees the :class:`~.scheduler.Step`: its ``work``,
        (sequence, tokens computed) pairs whose sequences the step has advanced, and the
        requests it ``preempted``; a step with nothing to run is shown too."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        step = self.scheduler.schedule()
        self.last_step_tokens = step.num_tokens
        finished = self._compute(step) if step.work else []
        if self.on_step is not None:
            self.on_step(step)
        return finished

    def _compute(self, step: Step) -> list[Sequence]:
        """Run one scheduled step on the model and record what it sampled; returns the
        sequences that finished (or failed) in it."""
        start = time.perf_counter()
        try:
            if self.proposer is not None:
                self.proposer.propose(step)
            sampled = self.runner.run(step)
        except EngineDeadError as error:
            self.stop(str(error))
            raise
        except Exception as error:  # noqa: BLE001 - the step's requests carry the error
            return self._fail_step(step, error)
        step.seconds = time.perf_counter() - start
        finished = self.scheduler.finish_step(step, sampled)
        for seq in finished:
            self._forget(seq)
        return finished

    def _forget(self, seq: Sequence) -> None:
        """Drop what the runner (and a draft model) kept for a finished sequence."""
        self.runner.forget(seq)
        if self.proposer is not None:
            self.proposer.forget(seq)

    def _fail_step(self, step, error: Exception) -> list[Sequence]:
        """Finish the requests of a step that raised, with the error; free their blocks."""
        logger.error("an engine step failed; its %d requests fail, the others go on",
                     len(step.work), exc_info=error)
        message = (f"the engine failed while computing this request ({type(error).__name__}: "
                   f"{error}); other requests were not affected, and retrying may work")
        failed = [s for seq, _ in step.work for s in (seq, *seq.unforked_samples)]
        for seq in failed:
            self.scheduler.abort(seq, FinishReason.ERROR, message)
            self._forget(seq)
        return failed

    def stop(self, reason: str) -> None:
        """Stop the engine for good: every unfinished request fails with ``reason``, its
        blocks are freed, and every later step raises :class:`EngineDeadError`."""
        self.dead = reason
        for seq in [*self.scheduler.waiting, *self.scheduler.running]:
            for s in (seq, *seq.unforked_samples):
                if not s.finished:
                    self.scheduler.abort(s, FinishReason.ERROR, reason)
                self._forget(s)

    # -- offline and streaming use --------------------------------------------------------

    def output(self, seq: Sequence) -> RequestOutput:
        outputs = [self._completion(i, s) for i, s in enumerate((seq, *seq.samples))]
        first = outputs[0]
        return RequestOutput(seq.id, seq.prompt, first.tokens, first.text, first.finish_reason,
                             seq.error, outputs)

    def _completion(self, index: int, seq: Sequence) -> CompletionOutput:
        text = self.tokenizer.decode(seq.output) if self.tokenizer is not None else None
        reason = seq.finish_reason.value if seq.finish_reason else None
        return CompletionOutput(index, list(seq.output), text, reason)

    def generate(self, prompts: Seq[str | Seq[int]],
                 params: SamplingParams | Seq[SamplingParams] = SamplingParams(),
                 progress: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion (one SamplingParams, or one per prompt)."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        with tqdm(total=len(seqs), desc="requests", disable=not progress) as bar:
            while True:
                bar.update(sum(map(_all_finished, seqs)) - bar.n)
                if not self.has_work:
                    break
                self.step()
        return [self.output(seq) for seq in seqs]

    def stream(self, prompt: str | Seq[int], params: SamplingParams = SamplingParams()
               ) -> Iterator[int]:
        """Yield one request's tokens as they are sampled, stepping the engine (with every
        other request in it). Closing the generator aborts the request."""
        if params.n != 1:
            raise ValueError(f"stream() follows one sample (got n={params.n}); for several, use "
                             "add_request() and read each of the request's samples, or generate()")
        seq = self.add_request(prompt, params)
        sent = 0
        try:
            while not seq.finished:
                self.step()
                yield from seq.output[sent:]
                sent = len(seq.output)
            yield from seq.output[sent:]
        finally:
            self.abort(seq)

    def free_blocks(self) -> int:
        return self.blocks.num_free


def _per_sample(params: SamplingParams) -> list[SamplingParams]:
    """The parameters of each of ``params.n`` samples: sample i draws with seed + i, so it
    gives the tokens a single request with that seed gets."""
    return [replace(params, n=1, seed=None if params.seed is None else params.seed + i)
            for i in range(params.n)]


def _vocab_size(model: str | Transformer) -> int:
    """The model's vocabulary size (its logits' width), read before it is loaded."""
    if isinstance(model, Transformer):
        return model.config.vocab_size
    return ModelConfig.from_json(resolve_checkpoint(model) / "config.json").vocab_size


def _all_finished(seq: Sequence) -> bool:
    return seq.finished and all(s.finished for s in seq.samples)
