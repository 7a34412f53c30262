"""Plausible wrong answers to chapter 11's draft-head lab; the graded tests must catch each
one. Each mutant replaces the solution function named before its ``__``."""

import torch
import torch.nn.functional as F

from minillm.draft_head.features import target_logits as full_logits
from minillm.draft_head.train import CLIP_NORM


def _solution():
    import solutions.ch11_draft_head as solution

    return solution


# -- 11.6 --------------------------------------------------------------------------------------

def restricted_kl__reverse(target_logits, head_logits, vocab, valid):
    """KL(q || p_K): the mode-seeking direction, not the forward KL from the target."""
    log_p = F.log_softmax(target_logits[..., vocab], -1)
    log_q = F.log_softmax(head_logits, -1)
    return (log_q.exp() * (log_q - log_p)).sum(-1)[valid].mean()


def restricted_kl__not_renormalised(target_logits, head_logits, vocab, valid):
    """Takes p over the whole vocabulary at the K ids: p_K no longer sums to 1."""
    log_p = F.log_softmax(target_logits, -1)[..., vocab]
    log_q = F.log_softmax(head_logits, -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)[valid].mean()


def restricted_kl__first_k_ids(target_logits, head_logits, vocab, valid):
    """Reads the target's first K ids instead of the ids in ``vocab``."""
    log_p = F.log_softmax(target_logits[..., :len(vocab)], -1)
    log_q = F.log_softmax(head_logits, -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)[valid].mean()


def restricted_kl__cross_entropy(target_logits, head_logits, vocab, valid):
    """−Σ p_K log q: the same gradient, but not zero when the head is perfect."""
    p = torch.softmax(target_logits[..., vocab], -1)
    return -(p * F.log_softmax(head_logits, -1)).sum(-1)[valid].mean()


def restricted_kl__every_position(target_logits, head_logits, vocab, valid):
    """Averages over every position, padding and chainless ones too."""
    log_p = F.log_softmax(target_logits[..., vocab], -1)
    log_q = F.log_softmax(head_logits, -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def restricted_kl__summed(target_logits, head_logits, vocab, valid):
    """Sums over the valid positions instead of averaging."""
    log_p = F.log_softmax(target_logits[..., vocab], -1)
    log_q = F.log_softmax(head_logits, -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)[valid].sum()


# -- 11.7 --------------------------------------------------------------------------------------

def _mask(length, step, first, chain):
    t = torch.arange(length)[:, None]
    i = torch.arange(length)[None, :]
    parts = [first(i, t)] + [chain(i, t, j) for j in range(2, step + 1)]
    return torch.cat(parts, dim=1)


def unrolled_mask__target_keys_up_to_t(length, step):
    """Every pass sees pass 1's keys up to its own index: the chain reads target features
    of the very positions it is guessing."""
    return _mask(length, step, lambda i, t: i <= t, lambda i, t, j: i == t - step + j)


def unrolled_mask__causal_everywhere(length, step):
    """Every pass's keys are causal (<= t), as if the passes were one longer sequence."""
    return _mask(length, step, lambda i, t: i <= t, lambda i, t, j: i <= t)


def unrolled_mask__chain_one_late(length, step):
    """The chain's earlier guesses are looked up one index late (j − 1)."""
    return _mask(length, step, lambda i, t: i <= t - step + 1,
                 lambda i, t, j: i == t - step + j - int(j < step))


def unrolled_mask__no_earlier_guesses(length, step):
    """Pass s sees pass 1's keys and its own key, not the guesses between them."""
    return _mask(length, step, lambda i, t: i <= t - step + 1,
                 lambda i, t, j: (i == t) & (j == step))


# -- 11.8 --------------------------------------------------------------------------------------

def _step(head, target, batch, optimizer, depth, *, own_features=True, detach_chain=False,
          shift=True, all_keys=True, chainless=False, zero=True, clip=True, reduce="mean",
          teacher_grad=False):
    solution = _solution()
    embeddings = target.embed_tokens(batch.tokens).float().detach()
    if teacher_grad:  # the target's norm and lm_head, autograd on
        teacher = target.norm(batch.features[:, 1:]) @ target.lm_head.weight.float().T
    else:
        teacher = full_logits(target, batch.features[:, 1:])
    length = batch.tokens.shape[1]
    features, keys, values, losses = batch.features[:, :-1], [], [], []
    for step in range(1, depth + 1):
        x, q, k, v = head.project(features, embeddings, batch.positions)
        keys, values = (keys + [k], values + [v]) if all_keys else ([k], [v])
        mask = solution.unrolled_mask(length, step if all_keys else 1)
        g = head.finish(x, q, torch.cat(keys, -2), torch.cat(values, -2), mask)
        valid = batch.real & (torch.arange(length) >= (0 if chainless else step - 1))
        losses.append(solution.restricted_kl(teacher, head.logits(g), head.vocab, valid))
        fed = g.detach() if detach_chain else g
        if own_features:
            features = torch.cat([torch.zeros_like(fed[:, :1]), fed[:, :-1]], 1) if shift else fed
    loss = torch.stack(losses).mean() if reduce == "mean" else torch.stack(losses).sum()
    if zero:
        optimizer.zero_grad()
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(head.parameters(), CLIP_NORM)
    optimizer.step()
    return float(loss.detach())


def train_step__teacher_features_every_pass(head, target, batch, optimizer, depth):
    """Every pass reads the target's features (teacher forcing): never its own guesses."""
    return _step(head, target, batch, optimizer, depth, own_features=False)


def train_step__detached_chain(head, target, batch, optimizer, depth):
    """Detaches the head's output before feeding it back: no gradient through the chain."""
    return _step(head, target, batch, optimizer, depth, detach_chain=True)


def train_step__unshifted_feedback(head, target, batch, optimizer, depth):
    """Feeds g_t back at index t instead of t + 1: the guess reads its own answer."""
    return _step(head, target, batch, optimizer, depth, shift=False)


def train_step__keys_of_this_pass_only(head, target, batch, optimizer, depth):
    """Each pass attends causally over its own keys only, not the target-fed ones."""
    return _step(head, target, batch, optimizer, depth, all_keys=False)


def train_step__counts_chainless_positions(head, target, batch, optimizer, depth):
    """Scores pass s at indices t < s − 1, where no chain of s − 1 guesses exists."""
    return _step(head, target, batch, optimizer, depth, chainless=True)


def train_step__no_zero_grad(head, target, batch, optimizer, depth):
    """Never zeroes the gradients: the previous step's add to this one's."""
    return _step(head, target, batch, optimizer, depth, zero=False)


def train_step__no_clipping(head, target, batch, optimizer, depth):
    """Steps with the raw gradients, their norm never clipped to CLIP_NORM."""
    return _step(head, target, batch, optimizer, depth, clip=False)


def train_step__summed_passes(head, target, batch, optimizer, depth):
    """Sums the passes' losses instead of averaging them."""
    return _step(head, target, batch, optimizer, depth, reduce="sum")


def train_step__teacher_with_gradients(head, target, batch, optimizer, depth):
    """Computes the target's logits with gradients on: the frozen target gets them too."""
    return _step(head, target, batch, optimizer, depth, teacher_grad=True)
