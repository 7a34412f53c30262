"""Speculative decoding: a cheap draft proposes γ tokens, the target checks them in one pass.

Decoding is memory-bound: checking γ + 1 tokens in one forward costs the target about as
much as generating one (the weights are read once either way). So let a cheap *draft*
(a smaller model, or a lookup in the prompt) guess γ tokens, run the target once over
them, and keep the longest prefix the target agrees with — plus one token from the target
itself. Rejection sampling makes it **lossless** (Leviathan et al. 2023, Algorithm 1;
Chen et al. 2023): with target probabilities p and draft probabilities q,

* accept the draft's token x with probability min(1, p(x) / q(x));
* at the first rejection, sample instead from the residual norm(max(0, p − q)) and stop;
* if all γ are accepted, sample a bonus token from the target's next distribution.

Every emitted token is then distributed exactly as if the target had sampled it alone.
Greedy decoding is the same rule with one-hot p: a draft token survives iff it is the
target's argmax, and the correction is the argmax — so one code path serves both.

The same temperature / top-k / top-p transform (:func:`minillm.sampling.process_logits`)
turns the target's and the draft's logits into p and q. After each check only the
accepted guesses count as computed in the target's KV cache, and the draft's keeps what
of its guesses survived.

This module is the math: distributions, rejection sampling, greedy verification, prompt
lookup and the expected gain. The engine runs it (:mod:`minillm.engine.proposers` guess,
its sampler checks with :func:`check_drafts`), and
:func:`minillm.speculative_generate.speculative_generate` is the engine with speculation
for one request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .sampling import SamplingParams, process_logits


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a token is drawn from under ``params``: [..., vocab] -> [..., vocab].
    Greedy is the one-hot of the argmax (ties: the first, as ``argmax``)."""
    flat = logits.reshape(-1, logits.shape[-1])
    processed = process_logits(flat, params)
    if params.greedy:
        probs = F.one_hot(processed.argmax(-1), flat.shape[-1]).float()
    else:
        probs = torch.softmax(processed, dim=-1)
    return probs.reshape(logits.shape)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)) over the last dimension: where the target wants more mass than
    the draft gave. Sampling from it after a rejection makes up exactly the missing mass."""
    positive = (p - q).clamp(min=0)
    return positive / positive.sum(-1, keepdim=True)


def verify(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling of γ >= 1 drafted tokens, for a batch of rows.

    p [rows, γ + 1, vocab]: the target's distributions after each draft prefix (the last
    one follows all γ drafts); q [rows, γ, vocab]: the draft's; draft [rows, γ]: its tokens.
    Returns (accepted [rows]: how many drafts survive, next_token [rows]: the residual
    sample at the first rejection, or the bonus sample from p's last row when all survive).
    Draws ``rand(rows, γ)`` then one multinomial, in that order (chapter 11's exercise
    matches it token for token).
    """
    rows, gamma = draft.shape
    p_draft = p[:, :gamma].gather(-1, draft[..., None])[..., 0]
    q_draft = q.gather(-1, draft[..., None])[..., 0]
    u = torch.rand(rows, gamma, generator=generator, device=p.device)
    kept = u * q_draft < p_draft  # u < p/q without dividing (q of a drafted token is > 0)
    accepted = kept.long().cumprod(-1).sum(-1)
    index = torch.arange(rows, device=p.device)
    at = accepted.clamp(max=gamma - 1)
    dist = torch.where((accepted < gamma)[:, None], residual(p[index, at], q[index, at]),
                       p[index, gamma])
    return accepted, torch.multinomial(dist, 1, generator=generator)[:, 0]


def verify_greedy(choices: list[int], draft: list[int]) -> tuple[int, int]:
    """Greedy verification: drafts survive while each equals the target's own choice after
    its prefix (``choices[i]``, the argmax after the first i drafts); the next token is the
    target's choice after the survivors (the correction, or the bonus when all survive).
    What :func:`verify` gives with one-hot p, without building any distribution."""
    accepted = next((i for i, (d, c) in enumerate(zip(draft, choices, strict=False)) if d != c),
                    len(draft))
    return accepted, choices[accepted]


def lookup_ngram(tokens: Sequence[int], gamma: int, max_ngram: int = 3,
                 min_ngram: int = 1) -> list[int]:
    """Prompt lookup decoding (Saxena 2023): find the latest earlier occurrence of the
    context's last n tokens (n = ``max_ngram`` down to ``min_ngram``) and return up to
    ``gamma`` tokens that followed it (none if no n-gram recurs)."""
    tokens = list(tokens)
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + gamma]
    return []


@dataclass(frozen=True)
class PromptLookup:
    """:func:`lookup_ngram` as the draft: free to run, and good when the answer copies its
    input (rewriting, editing, extracting). A one-token match is nearly always found and
    rarely right in free text, where each wasted guess still costs a longer verification:
    ``min_ngram=2`` proposes less often (``benchmarks/speculative.py`` measures both)."""

    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, "
                             f"{self.max_ngram}")

    def drafter(self, tokens: Sequence[int], gamma: int) -> list[int]:
        """The engine's prompt-lookup drafter with these n-gram bounds."""
        return lookup_ngram(tokens, gamma, self.max_ngram, self.min_ngram)


def check_drafts(logits: torch.Tensor, drafted: list[int], q: torch.Tensor | None,
                 params: SamplingParams, generator: torch.Generator | None,
                 verifier=None) -> tuple[int, int]:
    """How many of the ``drafted`` tokens the target keeps, and its own next token, from
    its logits [len(drafted) + 1, vocab] at the newest verified token and at each guess.
    Greedy requests compare tokens (:func:`verify_greedy`); sampled ones go through
    rejection sampling (``verifier``, by default :func:`verify`) against the draft's
    probabilities ``q`` [len(drafted), vocab]. The engine's sampler checks every
    speculating decode's guesses here."""
    if params.greedy and verifier is None:
        return verify_greedy(process_logits(logits, params).argmax(-1).tolist(), drafted)
    p = probabilities(logits, params)
    if not drafted:
        return 0, int(torch.multinomial(p[-1], 1, generator=generator))
    accepted, extra = (verifier or verify)(p[None], q[None].to(p),
                                           torch.tensor([drafted], device=p.device), generator)
    return int(accepted), int(extra)


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """E[tokens per target call] = (1 − α^(γ+1)) / (1 − α) for i.i.d. acceptance α
    (Leviathan et al. 2023, eq. 1)."""
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
