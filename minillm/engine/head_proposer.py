"""Guesses from an EAGLE draft head (:mod:`minillm.draft_head`) inside the engine.

The head reads the target's final hidden state f at each sequence's last accepted token,
so the runner returns those (``ModelRunner(keep_hidden=True)``: the hidden states at every
logits row) and the engine hands them to :meth:`DraftHeadProposer.observe` after each
step. A step with guesses g1..gk leaves features at positions p..p+k; the target accepts
n of the guesses, so its ``num_computed`` becomes p + n + 1 and the features at positions
below it are the ones to continue from, the last at the last accepted token.

The head's own attention history: one small layer, so instead of a paged pool it keeps,
per sequence, a dense tensor of its keys and values for the positions it has read with the
target's features (position t read [f_{t-1} ; e(tok_t)]). It starts at the first token
the target sampled (the prompt's features never reach the runner's logits rows, and the
head is trained the same way: :mod:`minillm.draft_head.train`), and the keys of a chain's
guesses, made from the head's own features, are dropped after the step: the next proposal
first reads the accepted positions with the target's features.

Guesses are drawn from the head's distribution under the request's sampling parameters
(its own generator, seeded seed + 1, as a draft model's), over its K tokens only; the
distribution handed to rejection sampling is over the whole vocabulary and zero outside
the K, so verification keeps the target's distribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..draft_head.head import DraftHead, KeyValues
from ..model import Transformer
from .sequence import Sequence
from .step import Draft, Step


@dataclass
class _Track:
    """What the proposer keeps for one sequence: the target's features at positions
    ``first ..`` and the head's keys and values at positions ``start .. start + len``."""

    features: torch.Tensor
    first: int
    past: KeyValues | None = None
    start: int = 0

    def add(self, first: int, rows: torch.Tensor) -> None:
        """Features at positions ``first ..``: they replace any from ``first`` on."""
        if self.first <= first <= self.first + len(self.features):
            self.features = torch.cat([self.features[:first - self.first], rows])
        else:
            self.features, self.first = rows, first

    def has_feature(self, position: int) -> bool:
        return self.first <= position < self.first + len(self.features)

    @property
    def end(self) -> int:
        """The first position the head has no keys for."""
        return self.start + (0 if self.past is None else self.past[0].shape[-2])

    def keep_before(self, position: int) -> None:
        """Drop the head's keys from ``position`` on (all of them if it has none before)."""
        if self.past is None or position <= self.start:
            self.past, self.start = None, position
        else:
            keep = position - self.start
            self.past = (self.past[0][..., :keep, :], self.past[1][..., :keep, :])


class DraftHeadProposer:
    """Chains of guesses from a draft head over the target's hidden states."""

    def __init__(self, head: DraftHead, target: Transformer):
        head.check_target(target)
        self.head = head.eval()
        self.embed = target.embed_tokens
        self.tracks: dict[int, _Track] = {}
        self.generators: dict[int, torch.Generator] = {}

    def observe(self, hidden: dict[int, tuple[int, torch.Tensor]]) -> None:
        """A step's final hidden states (``RunResult.hidden``)."""
        for seq_id, (first, rows) in hidden.items():
            rows = rows.float()
            if seq_id in self.tracks:
                self.tracks[seq_id].add(first, rows)
            else:
                self.tracks[seq_id] = _Track(rows, first)

    def guess_count(self, seq: Sequence, gamma: int) -> int:
        """γ once the target's feature at the last computed token is known, else none."""
        track = self.tracks.get(seq.id)
        return gamma if track is not None and track.has_feature(seq.num_computed - 1) else 0

    @torch.inference_mode()
    def propose(self, step: Step) -> dict[int, Draft]:
        seqs = {seq.id: seq for seq, _ in step.work}
        return {seq_id: self._chain(seqs[seq_id], slots) for seq_id, slots in step.guesses.items()}

    def forget(self, seq: Sequence) -> None:
        self.tracks.pop(seq.id, None)
        self.generators.pop(seq.id, None)

    def _chain(self, seq: Sequence, slots: int) -> Draft:
        """Read the accepted positions, then guess ``slots`` tokens, each from the head's
        feature at the one before."""
        g, past = self._catch_up(seq)
        position, tokens, dists = seq.num_computed, [], []
        for guess in range(slots):
            probs = self.head.proposal(self.head.logits(g), seq.params)
            token = int(probs.argmax() if seq.params.greedy else
                        torch.multinomial(probs, 1, generator=self._generator(seq)))
            tokens.append(token)
            dists.append(probs)
            if guess + 1 < slots:
                position += 1
                out, past = self.head.extend(g[None], self._embed([token]),
                                             torch.tensor([position]), past)
                g = out[-1]
        return Draft(tuple(tokens), torch.stack(dists))

    def _catch_up(self, seq: Sequence) -> tuple[torch.Tensor, KeyValues]:
        """The head reads positions up to the newest token (num_computed) with the target's
        features; -> its feature there, and its keys and values."""
        track, newest = self.tracks[seq.id], seq.num_computed
        track.features = track.features[:newest - track.first]  # the accepted ones
        track.keep_before(newest)  # the newest token's keys are made again below
        if not track.has_feature(track.end - 1):  # a gap (e.g. a recomputed sequence): restart
            track.past, track.start = None, track.first + 1
        positions = torch.arange(track.end, newest + 1)
        features = track.features[track.end - 1 - track.first:newest - track.first]
        out, track.past = self.head.extend(features, self._embed(seq.tokens[track.end:newest + 1]),
                                           positions, track.past)
        track.features, track.first = track.features[-1:], newest - 1
        return out[-1], track.past

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        return self.embed(torch.tensor(tokens)).float()

    def _generator(self, seq: Sequence) -> torch.Generator:
        if seq.id not in self.generators:
            generator = seq.params.make_generator(self.head.vocab.device)
            if seq.params.seed is not None:
                generator.manual_seed(seq.params.seed + 1)  # not the target's random stream
            self.generators[seq.id] = generator
        return self.generators[seq.id]
