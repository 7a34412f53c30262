"""The engine's sampler: each sequence's next tokens from its rows of a step's logits.

Every sequence whose tokens are all computed gets logits at its newest token (and, for a
speculative decode, at each guess: chapter 11). Each sequence samples with its own seeded
generator, so its tokens do not depend on what else shares its batches; when a prompt is
in, a request's other samples (``n > 1``) draw their first tokens from the same logits.

Greedy requests are most of a benchmark's and many a server's: one argmax over the whole
step's logits serves all of them (a greedy request with no penalty or logit bias needs no
processing of its logits), and only the others go through
:func:`~minillm.sampling.sample` row by row.

A request with a constraint (``SamplingParams.structured``, chapter 16) has its rows
masked first (:mod:`.structured`), so the argmax and the draws see only the tokens its
grammar allows; its matcher then follows the tokens the step kept.

A decode that carries guesses keeps the accepted prefix and one more token of the
target's: greedy ones compare tokens, sampled ones go through rejection sampling against
the draft model's distributions, or the lookup's one-hot q
(:func:`~minillm.speculative.check_drafts`).

The sampler changes no sequence: it returns each one's new tokens (:class:`Sampled`), and
the scheduler applies them (:meth:`~.scheduler.Scheduler.apply`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..sampling import TokenLogprob, sample, token_logprob
from ..speculative import check_drafts, verify_greedy
from .sequence import Sequence
from .step import NO_DRAFT, Draft
from .structured import UNWRITABLE, StructuredOutputs


@dataclass(slots=True)
class Sampled:
    """A sequence's new tokens from one step: its accepted guesses, one token of the
    target's, then the tokens its grammar forced (``forced`` of them, jump-forward), with a
    log-probability per sampled token when its request asked for them."""

    tokens: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    forced: int = 0
    error: str | None = None  # it cannot go on (its constraint allows no token): why


class Sampler:
    def __init__(self, verifier=None, structured: StructuredOutputs | None = None):
        """``verifier``: the rejection-sampling rule with
        :func:`~minillm.speculative.verify`'s signature (default: that one; chapter 11
        passes the learner's). ``structured``: the engine's constraints (chapter 16),
        needed once a request sets ``SamplingParams.structured``."""
        self.generators: dict[int, torch.Generator] = {}
        self.verifier = verifier
        self.structured = structured

    def sample(self, sequences: list[Sequence], drafts: dict[int, Draft],
               logits: torch.Tensor) -> dict[int, Sampled]:
        """New tokens of each sequence (and of a request's unforked samples) from
        ``logits``, whose rows follow ``sequences``: 1 + its guesses rows each."""
        guesses = [drafts.get(seq.id, NO_DRAFT) for seq in sequences]
        walked = self._mask(sequences, guesses, logits)
        plain = any(seq.params.plain_greedy for seq in sequences) and self.verifier is None
        choices = logits.argmax(-1).tolist() if plain else None
        new, first = {}, 0
        for seq, draft in zip(sequences, guesses, strict=True):
            rows = 1 + len(draft.tokens)
            own = logits[first:first + rows]
            if seq.id in walked and not torch.isfinite(own[0]).any():  # a dead end
                new |= {s.id: Sampled([], error=UNWRITABLE)
                        for s in (seq, *(seq.unforked_samples if not seq.output else ()))}
                first += rows
                continue
            if seq.params.plain_greedy and self.verifier is None:
                tokens = _greedy_tokens(draft, choices[first:first + rows])
            elif draft.tokens:
                tokens = self._verify(seq, draft, own)
            else:
                tokens = [self._sample_row(seq, own[0])]
            first += rows
            new[seq.id] = Sampled(tokens, _logprobs(seq, own, tokens)
                                  if seq.params.logprobs is not None else [])
            if not seq.output:  # its prompt is in: its other samples draw from the same logits
                for s in seq.unforked_samples:
                    token = [self._sample_row(s, own[0])]
                    new[s.id] = Sampled(token, _logprobs(s, own, token))
                    if s.params.structured is not None:
                        self.structured.follow(s, 0, token)
            if seq.id in walked:
                forced = self._follow(seq, draft, walked[seq.id], tokens)
                new[seq.id].tokens += forced
                new[seq.id].forced = len(forced)
        return new

    def _mask(self, sequences: list[Sequence], drafts: list[Draft], logits: torch.Tensor
              ) -> dict[int, int]:
        """Mask the rows of constrained sequences in place (a request's unforked samples
        share its row and start where it does); {sequence id: guesses walked}."""
        walked, first = {}, 0
        for seq, draft in zip(sequences, drafts, strict=True):
            rows = 1 + len(draft.tokens)
            if seq.params.structured is not None:
                walked[seq.id] = self.structured.mask(seq, draft.tokens,
                                                      logits[first:first + rows])
            first += rows
        return walked

    def _follow(self, seq: Sequence, draft: Draft, walked: int, tokens: list[int]
                ) -> list[int]:
        """Move ``seq``'s matcher past its new ``tokens``; returns the tokens its grammar
        forces next (jump-forward), which join its output without a forward pass. Not
        with guesses or recorded log-probabilities (those follow logits rows)."""
        self.structured.follow(seq, walked, tokens)
        if draft.tokens or seq.params.logprobs is not None or tokens[-1] in seq.stop_tokens:
            return []
        return self.structured.jump_forward(seq)

    def forget(self, seq: Sequence) -> None:
        """Drop a finished sequence's generator (and matcher)."""
        self.generators.pop(seq.id, None)
        if self.structured is not None:
            self.structured.forget(seq)

    def _generator(self, seq: Sequence, device) -> torch.Generator:
        if seq.id not in self.generators:
            self.generators[seq.id] = seq.params.make_generator(device)
        return self.generators[seq.id]

    def _sample_row(self, seq: Sequence, logits: torch.Tensor) -> int:
        params = seq.params
        previous = (torch.tensor([seq.tokens], device=logits.device)
                    if params.repetition_penalty != 1.0 else None)
        output = (torch.tensor([seq.output], dtype=torch.long, device=logits.device)
                  if params.presence_penalty or params.frequency_penalty else None)
        return int(sample(logits[None], params, self._generator(seq, logits.device),
                          previous, output=output)[0])

    def _verify(self, seq: Sequence, draft: Draft, logits: torch.Tensor) -> list[int]:
        """The accepted prefix of the guesses and one token of the target's, from the
        logits [1 + guesses, vocab] at its newest token and at each guess, against the
        draft model's distributions q (a lookup's guesses are certain: q is one-hot)."""
        guesses = list(draft.tokens)
        q = draft.probs if draft.probs is not None else \
            F.one_hot(torch.tensor(guesses, device=logits.device), logits.shape[-1])
        accepted, extra = check_drafts(logits, guesses, q, seq.params,
                                       self._generator(seq, logits.device), self.verifier)
        return guesses[:accepted] + [extra]


def _greedy_tokens(draft: Draft, choices: list[int]) -> list[int]:
    """A greedy sequence's new tokens from the argmax at each of its rows."""
    if not draft.tokens:
        return choices[:1]
    accepted, extra = verify_greedy(choices, list(draft.tokens))
    return list(draft.tokens[:accepted]) + [extra]


def _logprobs(seq: Sequence, logits: torch.Tensor, tokens: list[int]) -> list[TokenLogprob]:
    """With ``params.logprobs``, each new token's log-probability from the logits row that
    chose it (row i for the i-th token: a speculative step's rows follow its guesses)."""
    if seq.params.logprobs is None:
        return []
    return [token_logprob(logits[i], token, seq.params.logprobs)
            for i, token in enumerate(tokens)]
