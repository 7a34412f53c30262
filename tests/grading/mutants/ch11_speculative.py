"""Plausible wrong answers to chapter 11 (speculative decoding); the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``."""

import torch


def _solution():
    import solutions.ch11_speculative as solution

    return solution


def verify_greedy__counts_every_match(choices, draft):
    """Counts all positions where draft and target agree, not just the leading run."""
    accepted = sum(d == c for d, c in zip(draft, choices, strict=False))
    return accepted, choices[accepted]


def verify_greedy__returns_the_last_survivor(choices, draft):
    """Emits the last accepted draft again instead of the target's next choice."""
    accepted = 0
    while accepted < len(draft) and draft[accepted] == choices[accepted]:
        accepted += 1
    return accepted, draft[accepted - 1] if accepted else choices[0]


def verify_greedy__no_bonus(choices, draft):
    """Stops one short when every draft survives (drops the free bonus token's slot)."""
    accepted = 0
    while accepted < len(draft) - 1 and draft[accepted] == choices[accepted]:
        accepted += 1
    return accepted, choices[accepted]


def residual__no_clamp(p, q):
    """Normalises p − q without clipping the negative part at zero."""
    diff = p - q
    return diff / diff.sum(-1, keepdim=True).clamp(min=1e-12)


def residual__q_minus_p(p, q):
    """norm(max(0, q − p)): where the draft over-proposed, the opposite of what is missing."""
    positive = (q - p).clamp(min=0)
    return positive / positive.sum(-1, keepdim=True)


def residual__not_normalised(p, q):
    """max(0, p − q) without dividing by its sum (multinomial would not mind; a
    distribution must sum to 1)."""
    return (p - q).clamp(min=0)


def _verify(p, q, draft, generator, *, chain=True, resample_from_p=False, bonus_from_residual=False,
            deterministic=False):
    rows, gamma = draft.shape
    p_draft = p[:, :gamma].gather(-1, draft[..., None])[..., 0]
    q_draft = q.gather(-1, draft[..., None])[..., 0]
    u = torch.rand(rows, gamma, generator=generator)
    if deterministic:
        u = torch.zeros_like(u) + 0.999999
    kept = (u * q_draft < p_draft).long()
    accepted = (kept.cumprod(-1) if chain else kept).sum(-1)
    index = torch.arange(rows)
    at = accepted.clamp(max=gamma - 1)
    rejected = accepted < gamma
    if bonus_from_residual:
        rejected = torch.ones_like(rejected)
    after = p[index, at] if resample_from_p else _solution().residual(p[index, at], q[index, at])
    dist = torch.where(rejected[:, None], after, p[index, gamma])
    return accepted, torch.multinomial(dist, 1, generator=generator)[:, 0]


def verify__counts_accepts_after_a_rejection(p, q, draft, generator=None):
    """Counts every accepted draft, even after an earlier one was rejected."""
    return _verify(p, q, draft, generator, chain=False)


def verify__resamples_from_p(p, q, draft, generator=None):
    """After a rejection samples from p instead of the residual: double-counts q's share."""
    return _verify(p, q, draft, generator, resample_from_p=True)


def verify__bonus_from_the_residual(p, q, draft, generator=None):
    """When all drafts survive, samples from the last position's residual instead of p[γ]."""
    return _verify(p, q, draft, generator, bonus_from_residual=True)


def verify__accepts_when_p_exceeds_q(p, q, draft, generator=None):
    """Accepts iff p(x) >= q(x), no coin flip: greedy-like, biased towards the draft."""
    return _verify(p, q, draft, generator, deterministic=True)


def verify__residual_at_the_wrong_position(p, q, draft, generator=None):
    """Builds the residual from the position before the rejection (an off-by-one)."""
    rows, gamma = draft.shape
    p_draft = p[:, :gamma].gather(-1, draft[..., None])[..., 0]
    q_draft = q.gather(-1, draft[..., None])[..., 0]
    u = torch.rand(rows, gamma, generator=generator)
    accepted = (u * q_draft < p_draft).long().cumprod(-1).sum(-1)
    index = torch.arange(rows)
    at = (accepted - 1).clamp(min=0, max=gamma - 1)
    dist = torch.where((accepted < gamma)[:, None],
                       _solution().residual(p[index, at], q[index, at]), p[index, gamma])
    return accepted, torch.multinomial(dist, 1, generator=generator)[:, 0]


def cache_lengths_after_verification__draft_keeps_everything(context, gamma, accepted):
    """Truncates only the target: the draft keeps its rejected guesses."""
    return context + accepted, context - 1 + gamma


def cache_lengths_after_verification__keeps_the_emitted_token(context, gamma, accepted):
    """Counts the newly emitted token as cached, though no cache has seen it."""
    return context + accepted + 1, min(context - 1 + gamma, context + accepted + 1)


def cache_lengths_after_verification__draft_like_target(context, gamma, accepted):
    """Gives the draft the target's length, past what it fed when all guesses survive."""
    return context + accepted, context + accepted


def expected_tokens__exponent_gamma(alpha, gamma):
    """(1 − α^γ) / (1 − α): forgets the token every call emits besides the drafts."""
    return float(gamma) if alpha == 1 else (1 - alpha**gamma) / (1 - alpha)


def expected_tokens__linear(alpha, gamma):
    """1 + α·γ: as if drafts were accepted independently of the ones before them."""
    return 1 + alpha * gamma


def expected_tokens__divides_by_zero_at_one(alpha, gamma):
    """The closed form even at α = 1 (0/0)."""
    try:
        return (1 - alpha ** (gamma + 1)) / (1 - alpha)
    except ZeroDivisionError:
        return float("nan")


def speedup__forgets_the_target_call(alpha, gamma, cost):
    """Divides by the drafts' cost only (γ·c), as if verification were free."""
    return _solution().expected_tokens(alpha, gamma) / max(gamma * cost, 1e-9)


def speedup__draft_cost_per_emitted_token(alpha, gamma, cost):
    """Charges one draft step per emitted token instead of γ per round."""
    expected = _solution().expected_tokens(alpha, gamma)
    return expected / (expected * cost + 1)
