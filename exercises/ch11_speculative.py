# Generated from solutions/ch11_speculative.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 11: speculative decoding — greedy verification, the residual distribution, rejection
sampling of a batch of drafts, the caches after a verification, and the expected speedup."""

from __future__ import annotations

import torch


def verify_greedy(choices: list[int], draft: list[int]) -> tuple[int, int]:
    """Exercise 11.1: Greedy verification: how many drafted tokens survive, and the next token.

    ``draft``: the γ drafted tokens; ``choices``: the target's greedy token after the
    context and each prefix of the draft (γ + 1 of them: ``choices[i]`` follows the first
    i drafts). Drafts survive while each equals the target's choice at its position; the
    first mismatch and everything after it are discarded. Returns (accepted, next_token):
    next_token is the target's choice after the survivors — the correction at the first
    mismatch, or the bonus token when all survive. An empty draft gives (0, choices[0]).
    """
    raise NotImplementedError("Exercise 11.1: Greedy verification: how many drafted tokens survive, and the next token")


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exercise 11.2: The distribution to sample from after a rejection: norm(max(0, p − q)).

    p, q: [rows, vocab] the target's and the draft's distributions at the rejected position
    (each row sums to 1, and p ≠ q, so the positive part is not all zero). Returns
    [rows, vocab] rows that sum to 1 (Leviathan et al. 2023, Algorithm 1).
    """
    raise NotImplementedError("Exercise 11.2: The distribution to sample from after a rejection: norm(max(0, p − q))")


def verify(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 11.3: Rejection sampling of γ drafted tokens, for a batch of rows.

    p [rows, γ + 1, vocab]: the target's distributions after each prefix of the draft (the
    last one follows all γ drafts); q [rows, γ, vocab]: the draft's distributions, from
    which draft [rows, γ] (int64) was sampled; γ >= 1. For each row: the i-th draft x
    survives if u_i < p_i(x) / q_i(x), and only while all before it survived; at the first
    rejection (position j) the next token is sampled from residual(p_j, q_j); if all γ
    survive, it is a bonus token sampled from p_γ. Returns (accepted [rows] int64,
    next_token [rows] int64).
    Randomness, in this order, from ``generator``: ``u = torch.rand(rows, γ)``, then ONE
    ``torch.multinomial(dist, 1)`` over a [rows, vocab] tensor holding each row's residual
    or bonus distribution (so your tokens equal the library's for the same seed).
    """
    raise NotImplementedError("Exercise 11.3: Rejection sampling of γ drafted tokens, for a batch of rows")


def cache_lengths_after_verification(context: int, gamma: int,
                                     accepted: int) -> tuple[int, int]:
    """Exercise 11.4: How many tokens each KV cache keeps after one round of speculation.

    A round starts with ``context`` verified tokens and both caches holding the first
    ``context - 1`` (the newest token is not fed yet). The draft feeds the newest token
    and its first γ − 1 guesses (it samples γ; the last is never fed); the target feeds
    the newest token and all γ guesses in one forward. After ``accepted`` guesses survive
    and one more token is emitted, the context has ``context + accepted + 1`` tokens.
    Returns (target_length, draft_length): the longest prefix of each cache that holds
    only verified tokens, but never more than the next round's start (new context − 1).
    """
    raise NotImplementedError("Exercise 11.4: How many tokens each KV cache keeps after one round of speculation")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Exercise 11.5: Expected tokens per target call with γ drafts and acceptance rate α.

    Each draft survives with probability α independently, while all before it survived;
    every call also emits one token of the target's (correction or bonus). So
    E = 1 + α + α² + ... + α^γ = (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023, eq. 1);
    α = 1 gives γ + 1, α = 0 gives 1.
    """
    raise NotImplementedError("Exercise 11.5: Expected tokens per target call with γ drafts and acceptance rate α")


def speedup(alpha: float, gamma: int, cost: float) -> float:
    """Exercise 11.5: Predicted speedup over plain decoding: expected tokens / (γ·c + 1).

    One round costs γ draft steps (``cost`` c each, in target steps) plus one target
    forward, taken to cost one decode step (Leviathan et al. 2023, Theorem 3.8).
    """
    raise NotImplementedError("Exercise 11.5: Predicted speedup over plain decoding: expected tokens / (γ·c + 1)")
