"""The model runner: turns one scheduled step into one forward pass, and samples.

    scheduler (what runs this step) -> runner (how it is laid out) -> executor (how it is
    computed) -> model

It owns the model's paged KV cache, the executors and the sampler. For each step it

1. lays the scheduled work out flat (:meth:`prepare`): for every sequence its next
   uncomputed tokens and this step's guesses, decodes first, with positions, pool slots,
   block tables and context lengths (:class:`~.paged_cache.AttentionMetadata`);
2. picks the first executor that supports the step (:mod:`.executors`): a decode-only step
   goes to the native or compiled executor when the engine has one, anything else
   (prefill chunks, speculative verification without a native executor) to the eager one;
3. samples one token for every sequence whose tokens are now all computed
   (:class:`~.sampler.Sampler`); a prefill chunk that does not reach the end of its prompt
   samples nothing.

It returns what it computed (:class:`RunResult`) and changes no sequence. Built with
``keep_hidden`` (an engine with an EAGLE draft head, :mod:`minillm.draft_head`), the
result also holds the target's final hidden states at every sampling sequence's logits
rows; compiled decode graphs do not return those, so such a runner does not use them.

The model it runs is prepared for its executors once, when the runner is built
(:func:`minillm.prepare.prepare_model`: e.g. the compiled executor's layout), so the model
the caller passed in is never changed. ``slot_mapping`` is the function that says where
each new token's keys and values go in the pool
(:func:`minillm.attention.paged.slot_mapping`); chapter 12 passes the learner's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..attention.paged import slot_mapping
from ..model import Transformer
from ..prepare import Plan, prepare_model
from .executors import Executor, make_executors, resolve_executor
from .executors.batch import FlatBatch, SequenceWork, SlotMapping, flat_batch
from .latent_pool import make_pool
from .paged_cache import DecodeAttention
from .sampler import Sampled, Sampler
from .sequence import Sequence
from .step import NO_DRAFT, Draft, Step


@dataclass(frozen=True)
class RunResult:
    """What one step computed: each sequence's new tokens (:class:`~.sampler.Sampled`),
    which executor ran the forward pass and how long that took; with ``keep_hidden``,
    ``hidden``: sequence id -> (position of its first logits row, the target's final hidden
    states at its logits rows [rows, hidden])."""

    sampled: dict[int, Sampled]
    executor: str
    forward_seconds: float
    hidden: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: Transformer, num_blocks: int, block_size: int,
                 slot_mapping: SlotMapping = slot_mapping, executor: str = "auto",
                 sampler: Sampler | None = None,
                 decode_attention: DecodeAttention | None = None,
                 kv_cache_dtype: str | None = None, keep_hidden: bool = False):
        """``slot_mapping(block_table, start, count, block_size)``: the pool slots of a
        sequence's tokens ``start .. start + count - 1``. ``executor``: auto, eager,
        compiled or native (:mod:`.executors`). ``sampler``: how each step's tokens are
        chosen (:class:`~.sampler.Sampler`, with the engine's verifier and constraints).
        ``decode_attention``: every sequence's attention (decodes, speculative
        verifications, prefill chunks) read through the block tables
        (:class:`~.paged_cache.PagedKVCache`); it runs in eager steps only, so every step
        is then eager. ``kv_cache_dtype``: float32 (None) or int8, how the pool stores keys
        and values (:mod:`minillm.attention.kv_quant`). ``keep_hidden``: return the final
        hidden states too (no compiled executor then)."""
        if decode_attention is not None:
            if executor not in ("auto", "eager"):
                raise ValueError(f"decode_attention= runs in eager steps, not the {executor} "
                                 "executor's: leave executor='auto' (or 'eager')")
            executor = "eager"
        if keep_hidden and executor == "compiled":
            raise ValueError("a draft head reads the target's hidden states, which compiled "
                             "decode graphs do not return: use executor='auto', 'native' or "
                             "'eager'")
        executor = resolve_executor(model, executor, kv_cache_dtype)
        if keep_hidden and executor == "compiled":
            executor = "eager"  # auto's pick returns no hidden states
        self.keep_hidden = keep_hidden
        self.model = prepare_model(model, Plan(executor=executor))
        self.slot_mapping = slot_mapping
        self.cache = make_pool(self.model.config, num_blocks, block_size, self.model.dtype,
                               self.model.device, decode_attention, kv_cache_dtype)
        self.executors = make_executors(self.model, self.cache, executor)
        self.sampler = sampler or Sampler()

    @property
    def executor_names(self) -> list[str]:
        return [e.name for e in self.executors]

    @torch.inference_mode()
    def run(self, step: Step, drafts: dict[int, Draft]) -> RunResult:
        """Compute the step's tokens and sample: {sequence id: its new tokens} (one sampled
        token, after the accepted guesses of a speculative decode)."""
        batch, sampling = self.prepare(step, drafts)
        executor = self.executor_for(batch)
        started = time.perf_counter()
        logits = self.forward(batch, executor)
        seconds = time.perf_counter() - started
        hidden = self._hidden(batch, sampling, drafts, executor) if self.keep_hidden else {}
        return RunResult(self.sampler.sample(sampling, drafts, logits), executor.name, seconds,
                         hidden)

    @staticmethod
    def _hidden(batch: FlatBatch, sampling: list[Sequence], drafts: dict[int, Draft],
                executor: Executor) -> dict[int, tuple[int, torch.Tensor]]:
        """The executor's final hidden states, split by sequence like the logits rows."""
        hidden, first = {}, 0
        for seq in sampling:
            rows = 1 + len(drafts.get(seq.id, NO_DRAFT).tokens)
            position = int(batch.positions[batch.logits_at[first]])
            hidden[seq.id] = (position, executor.last_hidden[first:first + rows])
            first += rows
        return hidden

    def prepare(self, step: Step, drafts: dict[int, Draft]
                ) -> tuple[FlatBatch, list[Sequence]]:
        """The step as one flat batch (decodes first), and the sequences that sample."""
        items, sampling = [], []
        for seq, n in step.work:
            guesses = list(drafts[seq.id].tokens) if seq.id in drafts else []
            done = seq.num_computed + n == seq.num_tokens
            items.append((SequenceWork(seq.next_tokens(n) + guesses, seq.num_computed,
                                       seq.block_table, 1 + len(guesses) if done else 0), seq))
        items.sort(key=lambda item: len(item[0].tokens) != 1)  # decodes first, in order
        for item, seq in items:
            if item.logits_rows:  # all in: logits for what follows (and at each guess)
                sampling.append(seq)
        batch = flat_batch([item for item, _ in items], step.copies, self.cache.block_size,
                           self.slot_mapping, self.model.device)
        return batch, sampling

    def executor_for(self, batch: FlatBatch) -> Executor:
        """The first executor that supports ``batch`` (the last, eager, supports all)."""
        return next(e for e in self.executors if e.supports(batch.metadata))

    @torch.inference_mode()
    def forward(self, batch: FlatBatch, executor: Executor | None = None) -> torch.Tensor:
        """One forward pass over ``batch``: its cache copies, then the model (with
        ``executor``, by default the first that supports it); logits at
        ``batch.logits_at``. (Under tensor parallelism every rank runs this with the same
        batch: :mod:`.parallel_runner`.)"""
        self.cache.copy_blocks(batch.copies)
        return (executor or self.executor_for(batch))(batch)

    def close(self) -> None:
        """Release what the runner holds beyond memory (one process: nothing)."""

    def forget(self, seq: Sequence) -> None:
        """Drop a finished sequence's generator."""
        self.sampler.forget(seq)
