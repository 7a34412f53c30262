"""Who guesses for speculative decoding inside the engine (chapter 11).

With ``SchedulerConfig(speculative_tokens=γ)`` a decoding sequence may carry up to γ
guesses, which the target verifies in the step's forward pass. The engine asks a proposer
in two phases (:class:`~.step.Proposer`):

1. while scheduling, :meth:`guess_count`: how many guesses it can make for a sequence, so
   the scheduler can give it that many slots from what the step's planned work leaves
   (token budget and free blocks: :mod:`.scheduler`);
2. before the target's forward pass, :meth:`propose`: the guesses themselves, as values
   (:class:`~.step.Draft`); the proposer changes no sequence.

:class:`PromptLookupProposer` looks the guesses up in the sequence's own tokens
(``SchedulerConfig.drafter``, by default :func:`~minillm.speculative.lookup_ngram`): free,
and only as many as the lookup finds. :class:`DraftModelProposer` runs a smaller model,
one batched draft pass per guess for every speculating sequence of the step.

The draft model keeps its own paged pool with the target's geometry, indexed by the
**same** block tables: a sequence's block holds the target's keys and values in one pool
and the draft's in the other, and copy-on-write copies apply to both. For each sequence
the proposer remembers how many of its leading tokens have draft keys and values; after a
verification only the accepted guesses stay valid, and since the target's
``num_computed`` counts exactly those, the draft's count is the smaller of the two (a
preemption or a fork, which start from 0, need nothing more). The first proposal of a
sequence catches the draft up on its whole prompt.

A guess is sampled from the draft's distribution under the request's own sampling
parameters, with a generator of its own (seeded seed + 1: not the target's stream); the
distributions go with the guesses (``Draft.probs``) so rejection sampling keeps the
target's distribution exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attention.paged import slot_mapping
from ..model import Transformer
from ..speculative import probabilities
from .block_manager import released_tokens
from .executors.batch import SequenceWork, SlotMapping, flat_batch
from .runner import ModelRunner
from .sequence import Sequence
from .step import Draft, Step


class PromptLookupProposer:
    """Guesses looked up in the sequence's own tokens by ``drafter(tokens, γ)``."""

    def __init__(self, drafter: Callable[[list[int], int], list[int]]):
        self.drafter = drafter
        self.found: dict[int, list[int]] = {}  # this step's lookups, until propose()

    def guess_count(self, seq: Sequence, gamma: int) -> int:
        self.found[seq.id] = list(self.drafter(seq.tokens, gamma))[:gamma]
        return len(self.found[seq.id])

    def propose(self, step: Step) -> dict[int, Draft]:
        found, self.found = self.found, {}
        return {seq_id: Draft(tuple(found[seq_id][:slots]))
                for seq_id, slots in step.guesses.items()}

    def forget(self, seq: Sequence) -> None:
        self.found.pop(seq.id, None)


class DraftModelProposer:
    """Guesses sampled from a smaller model that shares the target's tokenizer."""

    def __init__(self, model: Transformer, num_blocks: int, block_size: int,
                 slot_mapping: SlotMapping = slot_mapping, executor: str = "auto"):
        self.model = model
        self.runner = ModelRunner(model, num_blocks, block_size, slot_mapping, executor)
        self.known: dict[int, int] = {}  # sequence -> leading tokens with draft keys/values
        self.generators: dict[int, torch.Generator] = {}

    def guess_count(self, seq: Sequence, gamma: int) -> int:
        return gamma

    @torch.inference_mode()
    def propose(self, step: Step) -> dict[int, Draft]:
        """The guesses of the step's speculating sequences: one batched draft pass per
        guess slot."""
        slots = step.guesses
        seqs = [seq for seq, _ in step.work if seq.id in slots]
        if not seqs:
            return {}
        self.runner.cache.copy_blocks(step.copies)
        feeds = {}  # sequence id -> (tokens to feed the draft, the first one's position)
        for seq in seqs:  # (never into blocks released behind a sliding window)
            known = max(min(self.known.get(seq.id, 0), seq.num_computed),
                        released_tokens(seq.block_table, self.runner.cache.block_size))
            feeds[seq.id] = (seq.tokens[known:], known)
        guesses: dict[int, list[int]] = {seq.id: [] for seq in seqs}
        dists: dict[int, list[torch.Tensor]] = {seq.id: [] for seq in seqs}
        for guess in range(max(slots.values())):
            active = sorted((seq for seq in seqs if guess < slots[seq.id]),
                            key=lambda seq: len(feeds[seq.id][0]) != 1)  # decodes first
            work = [SequenceWork(*feeds[seq.id], seq.block_table, 1) for seq in active]
            logits = self.runner.forward(flat_batch(work, [], self.runner.cache.block_size,
                                                    self.runner.slot_mapping,
                                                    self.model.device))
            for seq, row in zip(active, logits, strict=True):
                probs = probabilities(row, seq.params)
                token = int(probs.argmax() if seq.params.greedy else
                            torch.multinomial(probs, 1, generator=self._generator(seq)))
                guesses[seq.id].append(token)
                dists[seq.id].append(probs)
                tokens, start = feeds[seq.id]
                feeds[seq.id] = ([token], start + len(tokens))
                self.known[seq.id] = start + len(tokens)
        return {seq.id: Draft(tuple(guesses[seq.id]), torch.stack(dists[seq.id]))
                for seq in seqs}

    def forget(self, seq: Sequence) -> None:
        """A finished sequence: drop what the proposer kept for it."""
        self.known.pop(seq.id, None)
        self.generators.pop(seq.id, None)

    def _generator(self, seq: Sequence) -> torch.Generator:
        if seq.id not in self.generators:
            generator = seq.params.make_generator(self.model.device)
            if seq.params.seed is not None:
                generator.manual_seed(seq.params.seed + 1)  # not the target's random stream
            self.generators[seq.id] = generator
        return self.generators[seq.id]
