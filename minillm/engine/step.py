"""One engine step as the scheduler plans it, and the guesses a proposer adds to it.

:class:`Step` is what the scheduler decided: which sequences advance by how many tokens,
how many guess slots each speculating decode got, the copy-on-write copies to make first,
and who was preempted. A :class:`Proposer` then fills the slots with :class:`Draft` s
(prompt lookup, or a draft model's own forward passes: :mod:`.proposers`), and the runner
computes the step (:mod:`.runner`). The proposer and the runner return values; only the
scheduler changes sequences (:meth:`~.scheduler.Scheduler.apply`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .sequence import Sequence


@dataclass
class Step:
    """One forward pass: ``(sequence, planned tokens)`` pairs, prefill chunks included; the
    guess slots each speculating decode got (sequence id -> slots); the cache blocks to
    copy first (copy-on-write); the requests preempted to make room, each with the tokens
    it had computed and those it is expected to compute again."""

    work: list[tuple[Sequence, int]] = field(default_factory=list)
    guesses: dict[int, int] = field(default_factory=dict)
    copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[tuple[Sequence, int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.work) + sum(self.guesses.values())


@dataclass(frozen=True)
class Draft:
    """A decode's guesses for this step, and the distributions they were drawn from
    [guesses, vocab] (None: certain guesses, as prompt lookup's: q is one-hot)."""

    tokens: tuple[int, ...] = ()
    probs: torch.Tensor | None = None


NO_DRAFT = Draft()  # a sequence with no guesses this step


class Proposer(Protocol):
    """Who guesses for speculating decodes (chapter 11)."""

    def guess_count(self, seq: Sequence, gamma: int) -> int:
        """How many guesses (at most ``gamma``) it can make for ``seq`` this step."""

    def propose(self, step: Step) -> dict[int, Draft]:
        """The guesses of every sequence with slots in ``step.guesses`` (at most that many)."""

    def forget(self, seq: Sequence) -> None:
        """``seq`` finished: drop what was kept for it."""
