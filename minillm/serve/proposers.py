"""A draft model inside the engine: it guesses each speculating decode's next tokens.

With ``SchedulerConfig(speculative_tokens=γ)`` a decoding sequence carries up to γ guesses,
which the target verifies in the step's forward pass (chapter 11). Prompt lookup guesses
while the scheduler plans the step (``SchedulerConfig.drafter``). A draft model guesses
with forward passes of its own, so the engine asks in two phases:

1. the scheduler reserves blocks for γ guesses (:meth:`DraftModelProposer.guesses` gives it
   γ placeholders);
2. before the target's forward pass, :meth:`DraftModelProposer.propose` fills them in for
   every speculating sequence of the step at once: one batched draft pass per guess.

The draft keeps its own paged pool with the target's geometry, indexed by the **same**
block tables: a sequence's block holds the target's keys and values in one pool and the
draft's in the other, and copy-on-write copies apply to both. For each sequence the
proposer remembers how many of its leading tokens have draft keys and values; after a
verification only the accepted guesses stay valid, and since the target's
``num_computed`` counts exactly those, the draft's count is the smaller of the two (a
preemption or a fork, which start from 0, need nothing more). The first proposal of a
sequence catches the draft up on its whole prompt.

A guess is sampled from the draft's distribution under the request's own sampling
parameters, with a generator of its own (seeded seed + 1: not the target's stream); the
distributions go with the guesses (``Sequence.draft_probs``) so rejection sampling keeps
the target's distribution exactly.
"""

from __future__ import annotations

import torch

from ..attention.paged import slot_mapping
from ..model import Transformer
from ..speculative import probabilities
from .executors.batch import SequenceWork, SlotMapping, flat_batch
from .runner import ModelRunner
from .scheduler import Step
from .sequence import Sequence

PENDING = -1  # a guess the draft model has yet to make (placeholders reserve the blocks)


class DraftModelProposer:
    def __init__(self, model: Transformer, num_blocks: int, block_size: int,
                 slot_mapping: SlotMapping = slot_mapping, executor: str = "auto"):
        self.model = model
        self.runner = ModelRunner(model, num_blocks, block_size, slot_mapping, executor)
        self.known: dict[int, int] = {}  # sequence -> leading tokens with draft keys/values
        self.generators: dict[int, torch.Generator] = {}

    def guesses(self, seq: Sequence, gamma: int) -> list[int]:
        """The scheduler's question: γ guesses, to be made in :meth:`propose`."""
        return [PENDING] * gamma

    @torch.inference_mode()
    def propose(self, step: Step) -> None:
        """Fill in the guesses of the step's speculating sequences, γ batched draft passes."""
        seqs = [seq for seq, _ in step.work if seq.draft and seq.draft[0] == PENDING]
        if not seqs:
            return
        self.runner.cache.copy_blocks(step.copies)
        feeds = {}  # sequence id -> (tokens to feed the draft, the first one's position)
        for seq in seqs:
            known = min(self.known.get(seq.id, 0), seq.num_computed)
            feeds[seq.id] = (seq.tokens[known:], known)
        dists: dict[int, list[torch.Tensor]] = {seq.id: [] for seq in seqs}
        for guess in range(max(len(seq.draft) for seq in seqs)):
            active = sorted((seq for seq in seqs if guess < len(seq.draft)),
                            key=lambda seq: len(feeds[seq.id][0]) != 1)  # decodes first
            work = [SequenceWork(*feeds[seq.id], seq.block_table, 1) for seq in active]
            logits = self.runner.forward(flat_batch(work, [], self.runner.cache.block_size,
                                                    self.runner.slot_mapping,
                                                    self.model.device))
            for seq, row in zip(active, logits, strict=True):
                probs = probabilities(row, seq.params)
                token = int(probs.argmax() if seq.params.greedy else
                            torch.multinomial(probs, 1, generator=self._generator(seq)))
                seq.draft[guess] = token
                dists[seq.id].append(probs)
                tokens, start = feeds[seq.id]
                feeds[seq.id] = ([token], start + len(tokens))
                self.known[seq.id] = start + len(tokens)
        for seq in seqs:
            seq.draft_probs = torch.stack(dists[seq.id])

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
