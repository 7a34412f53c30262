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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..sampling import sample, token_logprob
from ..speculative import check_drafts, verify_greedy
from .sequence import Sequence
from .structured import StructuredOutputs


class Sampler:
    def __init__(self, verifier=None, structured: StructuredOutputs | None = None):
        """``verifier``: the rejection-sampling rule with
        :func:`~minillm.speculative.verify`'s signature (default: that one; chapter 11
        passes the learner's). ``structured``: the engine's constraints (chapter 16),
        needed once a request sets ``SamplingParams.structured``."""
        self.generators: dict[int, torch.Generator] = {}
        self.verifier = verifier
        self.structured = structured

    def sample(self, sequences: list[Sequence], logits: torch.Tensor) -> dict[int, list[int]]:
        """New tokens of each sequence (and of a request's unforked samples) from
        ``logits``, whose rows follow ``sequences``: 1 + len(draft) rows each."""
        walked = self._mask(sequences, logits)
        choices = logits.argmax(-1).tolist() if any(map(_plain_greedy, sequences)) else None
        new, first = {}, 0
        for seq in sequences:
            rows = 1 + len(seq.draft)
            own = logits[first:first + rows]
            if _plain_greedy(seq) and self.verifier is None:
                greedy = choices[first:first + rows]
                new[seq.id] = _greedy_tokens(seq, greedy)
            elif seq.draft:
                new[seq.id] = self._verify(seq, own)
            else:
                new[seq.id] = [self._sample_row(seq, own[0])]
            first += rows
            _record_logprobs(seq, own, new[seq.id])
            if not seq.output:  # its prompt is in: its other samples draw from the same logits
                for s in seq.unforked_samples:
                    new[s.id] = [self._sample_row(s, own[0])]
                    _record_logprobs(s, own, new[s.id])
                    if s.params.structured is not None:
                        self.structured.follow(s, 0, new[s.id])
            if seq.id in walked:
                new[seq.id] += self._follow(seq, walked[seq.id], new[seq.id])
        return new

    def _mask(self, sequences: list[Sequence], logits: torch.Tensor) -> dict[int, int]:
        """Mask the rows of constrained sequences in place (a request's unforked samples
        share its row and start where it does); {sequence id: guesses walked}."""
        walked, first = {}, 0
        for seq in sequences:
            rows = 1 + len(seq.draft)
            if seq.params.structured is not None:
                walked[seq.id] = self.structured.mask(seq, logits[first:first + rows])
            first += rows
        return walked

    def _follow(self, seq: Sequence, walked: int, tokens: list[int]) -> list[int]:
        """Move ``seq``'s matcher past its new ``tokens``; returns the tokens its grammar
        forces next (jump-forward), which join its output without a forward pass. Not
        with guesses or recorded log-probabilities (those follow logits rows)."""
        if seq.params.structured is None:
            return []
        self.structured.follow(seq, walked, tokens)
        if seq.draft or seq.params.logprobs is not None or tokens[-1] in seq.stop_tokens:
            return []
        forced = self.structured.jump_forward(seq)
        seq.num_forced += len(forced)
        return forced

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

    def _verify(self, seq: Sequence, logits: torch.Tensor) -> list[int]:
        """The accepted prefix of ``seq.draft`` and one token of the target's, from the
        logits [1 + guesses, vocab] at its newest token and at each guess, against the
        draft model's distributions q (a lookup's guesses are certain: q is one-hot)."""
        q = seq.draft_probs if seq.draft_probs is not None else \
            F.one_hot(torch.tensor(seq.draft, device=logits.device), logits.shape[-1])
        accepted, extra = check_drafts(logits, seq.draft, q, seq.params,
                                       self._generator(seq, logits.device), self.verifier)
        return seq.draft[:accepted] + [extra]


def _plain_greedy(seq: Sequence) -> bool:
    """Greedy with nothing to apply to its logits first: its token is the argmax, and so
    are its forked samples' (they share its parameters)."""
    return seq.params.plain_greedy


def _greedy_tokens(seq: Sequence, choices: list[int]) -> list[int]:
    """A greedy sequence's new tokens from the argmax at each of its rows."""
    if not seq.draft:
        return choices[:1]
    accepted, extra = verify_greedy(choices, seq.draft)
    return seq.draft[:accepted] + [extra]


def _record_logprobs(seq: Sequence, logits: torch.Tensor, tokens: list[int]) -> None:
    """With ``params.logprobs``, each new token's log-probability from the logits row that
    chose it (row i for the i-th token: a speculative step's rows follow its guesses)."""
    if seq.params.logprobs is not None:
        seq.logprobs += [token_logprob(logits[i], token, seq.params.logprobs)
                         for i, token in enumerate(tokens)]
