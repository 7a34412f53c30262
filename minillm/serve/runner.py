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

``slot_mapping`` is the function that says where each new token's keys and values go in
the pool (:func:`minillm.attention.paged.slot_mapping`); chapter 12 passes the learner's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attention.paged import slot_mapping
from ..model import Transformer
from ..sampling import sample
from .paged_cache import AttentionMetadata, PagedKVCache
from .scheduler import Step
from .sequence import Sequence

SlotMapping = Callable[[list[int], int, int, int], list[int]]


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
    def run(self, step: Step) -> dict[int, int]:
        """Compute the step's tokens; returns {sequence id: sampled token}."""
        self.cache.copy_blocks(step.copies)
        tokens, positions, slots, last_rows, sampled = [], [], [], [], []
        for seq, n in step.work:
            start = seq.num_computed
            tokens += seq.tokens[start:start + n]
            positions += range(start, start + n)
            slots += self.slot_mapping(seq.block_table, start, n, self.cache.block_size)
            if start + n == seq.num_tokens:  # the whole sequence is in: its next token
                last_rows.append(len(tokens) - 1)
                sampled.append(seq)
        device = self.model.device
        self.cache.metadata = self._metadata(step, slots, device)
        logits = self.model.forward_flat(torch.tensor(tokens, device=device),
                                         torch.tensor(positions, device=device), self.cache,
                                         torch.tensor(last_rows, dtype=torch.long, device=device))
        tokens = {}
        for seq, row in zip(sampled, logits, strict=True):
            tokens[seq.id] = self._sample(seq, row)
            if not seq.output:  # its prompt is in: its other samples draw from the same logits
                tokens |= {s.id: self._sample(s, row) for s in seq.unforked_samples}
        return tokens

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

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> int:
        if seq.id not in self.generators:
            self.generators[seq.id] = seq.params.make_generator(logits.device)
        previous = torch.tensor([seq.tokens], device=logits.device)
        return int(sample(logits[None], seq.params, self.generators[seq.id], previous)[0])

    def forget(self, seq: Sequence) -> None:
        """Drop a finished sequence's generator."""
        self.generators.pop(seq.id, None)
