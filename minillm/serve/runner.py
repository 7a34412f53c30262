"""The model runner: turns one scheduled step into one forward pass, and samples.

    scheduler (what runs this step) -> runner (how it is laid out) -> executor (how it is
    computed) -> model

It owns the model's paged KV cache, the executors and the sampler (nothing patches the
model). For each step it

1. lays the scheduled work out flat (:meth:`prepare`): for every sequence its next
   uncomputed tokens, decodes first, with positions, pool slots, block tables and context
   lengths (:class:`~minillm.serve.paged_cache.AttentionMetadata`);
2. picks the first executor that supports the step (:mod:`.executors`): a decode-only step
   goes to the native or compiled executor when the engine has one, anything else
   (prefill chunks, speculative verification) to the eager one;
3. samples one token for every sequence whose tokens are now all computed
   (:class:`~.sampler.Sampler`); a prefill chunk that does not reach the end of its prompt
   samples nothing.

``slot_mapping`` is the function that says where each new token's keys and values go in
the pool (:func:`minillm.attention.paged.slot_mapping`); chapter 12 passes the learner's.
"""

from __future__ import annotations

import time

import torch

from ..attention.paged import slot_mapping
from ..model import Transformer
from .executors import make_executors
from .executors.batch import FlatBatch, SequenceWork, SlotMapping, flat_batch
from .paged_cache import DecodeAttention, PagedKVCache
from .sampler import Sampler
from .scheduler import Step
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model: Transformer, num_blocks: int, block_size: int,
                 slot_mapping: SlotMapping = slot_mapping, executor: str = "auto",
                 sampler: Sampler | None = None,
                 decode_attention: DecodeAttention | None = None):
        """``slot_mapping(block_table, start, count, block_size)``: the pool slots of a
        sequence's tokens ``start .. start + count - 1``. ``executor``: auto, eager,
        compiled or native (:mod:`.executors`). ``sampler``: how each step's tokens are
        chosen (:class:`~.sampler.Sampler`, with the engine's verifier and constraints).
        ``decode_attention``: each decode's attention read through its block table
        (:class:`~.paged_cache.PagedKVCache`); it runs in eager steps only, so every step
        is then eager."""
        if decode_attention is not None:
            if executor not in ("auto", "eager"):
                raise ValueError(f"decode_attention= runs in eager steps, not the {executor} "
                                 "executor's: leave executor='auto' (or 'eager')")
            executor = "eager"
        self.model = model
        self.slot_mapping = slot_mapping
        self.cache = PagedKVCache(model.config, num_blocks, block_size, model.dtype,
                                  model.device, decode_attention)
        self.executors = make_executors(model, self.cache, executor)
        self.sampler = sampler or Sampler()
        self.last_executor = ""  # which executor computed the last step ...
        self.last_forward_seconds = 0.0  # ... and how long its forward pass took

    @property
    def executor_names(self) -> list[str]:
        return [e.name for e in self.executors]

    @torch.inference_mode()
    def run(self, step: Step) -> dict[int, list[int]]:
        """Compute the step's tokens; returns {sequence id: its new tokens} (one sampled
        token, after the accepted guesses of a speculative decode)."""
        batch, sampled = self.prepare(step)
        return self.sampler.sample(sampled, self.forward(batch))

    def prepare(self, step: Step) -> tuple[FlatBatch, list[Sequence]]:
        """The step as one flat batch (decodes first), and the sequences that sample."""
        work = sorted(step.work, key=lambda item: item[1] != 1)  # decodes first, in order
        items, sampled = [], []
        for seq, n in work:
            done = seq.num_computed + n == seq.num_tokens + len(seq.draft)
            items.append(SequenceWork(seq.next_tokens(n), seq.num_computed, seq.block_table,
                                      1 + len(seq.draft) if done else 0))
            if done:  # all in: logits for what follows (and at each guess)
                sampled.append(seq)
        batch = flat_batch(items, step.copies, self.cache.block_size, self.slot_mapping,
                           self.model.device)
        return batch, sampled

    @torch.inference_mode()
    def forward(self, batch: FlatBatch) -> torch.Tensor:
        """One forward pass over ``batch`` with the first executor that supports it: its
        cache copies, then the model; logits at ``batch.logits_at``. (Under tensor
        parallelism every rank runs this with the same batch: :mod:`minillm.parallel.engine`.)"""
        started = time.perf_counter()
        self.cache.copy_blocks(batch.copies)
        executor = next(e for e in self.executors if e.supports(batch.metadata))
        logits = executor(batch)
        self.last_executor, self.last_forward_seconds = executor.name, \
            time.perf_counter() - started
        return logits

    def close(self) -> None:
        """Release what the runner holds beyond memory (one process: nothing)."""

    def forget(self, seq: Sequence) -> None:
        """Drop a finished sequence's generator."""
        self.sampler.forget(seq)
