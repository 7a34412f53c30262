"""The model runner: turns one scheduled step into one forward pass, and samples.

It owns the model and the paged KV cache (nothing patches the model). For each step it
flattens the scheduled work — for every sequence, its next ``n`` uncomputed tokens — into
token ids, positions and pool slots, describes them to the cache
(:class:`~minillm.serve.paged_cache.AttentionMetadata`), runs
:meth:`~minillm.model.Transformer.forward_flat`, and samples one token for every sequence
whose tokens are now all computed (a prefill chunk that does not reach the end of its
prompt samples nothing); when a prompt is in, a request's other samples (``n > 1``) draw
their first tokens from the same logits. Each sequence samples with its own seeded
generator, so its tokens do not depend on what else shares its batches.

A decode that carries speculative guesses (``seq.draft``, chapter 11) gets logits at its
newest token and at every guess, from the same forward pass; greedy requests keep the
guesses that equal the target's choices, sampled ones go through rejection sampling with
the lookup's one-hot q, and either way one more token comes from the target.

``slot_mapping`` is the function that says where each new token's keys and values go in
the pool (:func:`minillm.attention.paged.slot_mapping`); chapter 12 passes the learner's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention.paged import slot_mapping
from ..model import Transformer
from ..sampling import sample, token_logprob
from ..speculative import check_drafts
from .paged_cache import AttentionMetadata, PagedKVCache
from .scheduler import Step
from .sequence import Sequence

SlotMapping = Callable[[list[int], int, int, int], list[int]]


@dataclass
class FlatBatch:
    """Everything one forward pass of the engine needs, sampling aside."""

    copies: list[tuple[int, int]]  # copy-on-write block copies to do first
    token_ids: torch.Tensor  # [tokens] the new tokens of every sequence, in order
    positions: torch.Tensor  # [tokens] each token's position in its sequence
    logits_at: torch.Tensor  # [rows] the tokens whose next-token logits are wanted
    metadata: AttentionMetadata


class ModelRunner:
    def __init__(self, model: Transformer, num_blocks: int, block_size: int,
                 slot_mapping: SlotMapping = slot_mapping):
        """``slot_mapping(block_table, start, count, block_size)``: the pool slots of a
        sequence's tokens ``start .. start + count - 1``."""
        self.model = model
        self.slot_mapping = slot_mapping
        self.cache = PagedKVCache(model.config, num_blocks, block_size, model.dtype,
                                  model.device)
        self.generators: dict[int, torch.Generator] = {}

    @torch.inference_mode()
    def run(self, step: Step) -> dict[int, list[int]]:
        """Compute the step's tokens; returns {sequence id: its new tokens} (one sampled
        token, after the accepted guesses of a speculative decode)."""
        tokens, positions, slots, rows, sampled = [], [], [], [], []
        for seq, n in step.work:
            start = seq.num_computed
            tokens += (seq.tokens + seq.draft)[start:start + n]
            positions += range(start, start + n)
            slots += self.slot_mapping(seq.block_table, start, n, self.cache.block_size)
            if start + n == seq.num_tokens + len(seq.draft):  # all in: logits for what follows
                rows += range(len(tokens) - 1 - len(seq.draft), len(tokens))
                sampled.append(seq)
        device = self.model.device
        logits = self.forward(FlatBatch(
            step.copies, torch.tensor(tokens, device=device),
            torch.tensor(positions, device=device),
            torch.tensor(rows, dtype=torch.long, device=device),
            self._metadata(step, slots, device)))
        new, first = {}, 0
        for seq in sampled:
            own = logits[first:first + 1 + len(seq.draft)]
            first += len(own)
            new[seq.id] = self._verify(seq, own) if seq.draft else [self._sample(seq, own[0])]
            _record_logprobs(seq, own, new[seq.id])
            if not seq.output:  # its prompt is in: its other samples draw from the same logits
                for s in seq.unforked_samples:
                    new[s.id] = [self._sample(s, own[0])]
                    _record_logprobs(s, own, new[s.id])
        return new

    @torch.inference_mode()
    def forward(self, batch: FlatBatch) -> torch.Tensor:
        """One forward pass over ``batch``: its cache copies, then the model; logits at
        ``batch.logits_at``. (Under tensor parallelism every rank runs this with the same
        batch: :mod:`minillm.parallel.engine`.)"""
        self.cache.copy_blocks(batch.copies)
        self.cache.metadata = batch.metadata
        return self.model.forward_flat(batch.token_ids, batch.positions, self.cache,
                                       batch.logits_at)

    def _metadata(self, step: Step, slots: list[int], device) -> AttentionMetadata:
        tables = [seq.block_table for seq, _ in step.work]
        width = max(len(table) for table in tables)
        return AttentionMetadata(
            query_lens=[n for _, n in step.work],
            context_lens=torch.tensor([seq.num_computed + n for seq, n in step.work],
                                      device=device),
            slot_mapping=torch.tensor(slots, device=device),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                      device=device))

    def _generator(self, seq: Sequence, device) -> torch.Generator:
        if seq.id not in self.generators:
            self.generators[seq.id] = seq.params.make_generator(device)
        return self.generators[seq.id]

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> int:
        previous = torch.tensor([seq.tokens], device=logits.device)
        return int(sample(logits[None], seq.params, self._generator(seq, logits.device),
                          previous)[0])

    def _verify(self, seq: Sequence, logits: torch.Tensor) -> list[int]:
        """The accepted prefix of ``seq.draft`` and one token of the target's, from the
        logits [1 + guesses, vocab] at its newest token and at each guess (the lookup's
        guesses are certain: q is one-hot)."""
        q = F.one_hot(torch.tensor(seq.draft, device=logits.device), logits.shape[-1])
        accepted, extra = check_drafts(logits, seq.draft, q, seq.params,
                                       self._generator(seq, logits.device))
        return seq.draft[:accepted] + [extra]

    def close(self) -> None:
        """Release what the runner holds beyond memory (one process: nothing)."""

    def forget(self, seq: Sequence) -> None:
        """Drop a finished sequence's generator."""
        self.generators.pop(seq.id, None)


def _record_logprobs(seq: Sequence, logits: torch.Tensor, tokens: list[int]) -> None:
    """With ``params.logprobs``, each new token's log-probability from the logits row that
    chose it (row i for the i-th token: a speculative step's rows follow its guesses)."""
    if seq.params.logprobs is not None:
        seq.logprobs += [token_logprob(logits[i], token, seq.params.logprobs)
                         for i, token in enumerate(tokens)]
