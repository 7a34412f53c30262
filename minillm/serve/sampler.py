"""The engine's sampler: each sequence's next tokens from its rows of a step's logits.

Every sequence whose tokens are all computed gets logits at its newest token (and, for a
speculative decode, at each guess: chapter 11). Each sequence samples with its own seeded
generator, so its tokens do not depend on what else shares its batches; when a prompt is
in, a request's other samples (``n > 1``) draw their first tokens from the same logits.

Greedy requests are most of a benchmark's and many a server's: one argmax over the whole
step's logits serves all of them (a greedy request without a repetition penalty needs no
processing of its logits), and only the others go through
:func:`~minillm.sampling.sample` row by row.

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


class Sampler:
    def __init__(self, verifier=None):
        """``verifier``: the rejection-sampling rule with
        :func:`~minillm.speculative.verify`'s signature (default: that one; chapter 11
        passes the learner's)."""
        self.generators: dict[int, torch.Generator] = {}
        self.verifier = verifier

    def sample(self, sequences: list[Sequence], logits: torch.Tensor) -> dict[int, list[int]]:
        """New tokens of each sequence (and of a request's unforked samples) from
        ``logits``, whose rows follow ``sequences``: 1 + len(draft) rows each."""
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
        return new

    def forget(self, seq: Sequence) -> None:
        """Drop a finished sequence's generator."""
        self.generators.pop(seq.id, None)

    def _generator(self, seq: Sequence, device) -> torch.Generator:
        if seq.id not in self.generators:
            self.generators[seq.id] = seq.params.make_generator(device)
        return self.generators[seq.id]

    def _sample_row(self, seq: Sequence, logits: torch.Tensor) -> int:
        previous = (torch.tensor([seq.tokens], device=logits.device)
                    if seq.params.repetition_penalty != 1.0 else None)
        return int(sample(logits[None], seq.params, self._generator(seq, logits.device),
                          previous)[0])

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
    return seq.params.greedy and seq.params.repetition_penalty == 1.0


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
