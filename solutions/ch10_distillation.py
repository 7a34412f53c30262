"""Chapter 10: knowledge distillation — the KD loss with T², the top-k loss the trainer uses,
total variation (the divergence speculative decoding's acceptance is made of), and the
agreement a draft is judged by."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
            mask: torch.Tensor, alpha: float, temperature: float) -> torch.Tensor:
    """Exercise 10.1: The KD loss α·T²·KL(p_T ‖ q_T) + (1 − α)·CE, a mean over real tokens.

    student_logits, teacher_logits: [batch, seq, vocab]; targets: [batch, seq] the true next
    tokens; mask: [batch, seq] bool, True for real tokens (False: padding, which must count
    for nothing). p_T = softmax(teacher / T), q_T = softmax(student / T); the cross-entropy
    is the student's ordinary one (temperature 1) on ``targets``. Returns a 0-dim float32
    tensor: the sum over real tokens divided by their NUMBER (not by the batch size).
    Hint: select the real positions first (``logits[mask]`` is [tokens, vocab]); work in
    float32 with ``log_softmax``.
    """
    ### BEGIN SOLUTION
    student, teacher, y = student_logits[mask].float(), teacher_logits[mask].float(), targets[mask]
    log_p = F.log_softmax(teacher / temperature, dim=-1)
    log_q = F.log_softmax(student / temperature, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    ce = F.cross_entropy(student, y, reduction="none")
    return (alpha * temperature**2 * kl + (1 - alpha) * ce).mean()
    ### END SOLUTION


def sparse_kd_loss(student_logits: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
                   targets: torch.Tensor, *, alpha: float = 0.5, temperature: float = 2.0,
                   kind: str = "forward") -> torch.Tensor:
    """Exercise 10.2: The KD loss with the teacher given by its top-k logits (as trained on).

    student_logits: [batch, seq, vocab]; values, indices: [batch, seq, k] the teacher's k
    largest logits and their token ids; targets: [batch, seq]. Every position is real.
    The soft target p_T is softmax(values / T): the teacher renormalised over its top k.
    The student's log q_T is taken over its WHOLE vocabulary, then read at ``indices``.
    Returns the mean over positions of α·T²·Σ_k p_T (log p_T − log q_T) + (1 − α)·CE.
    ``kind`` is accepted for the library's signature; only "forward" is asked for.
    """
    ### BEGIN SOLUTION
    log_p = F.log_softmax(values.float() / temperature, dim=-1)
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1).gather(-1, indices.long())
    soft = (log_p.exp() * (log_p - log_q)).sum(-1)
    hard = F.cross_entropy(student_logits.flatten(0, -2).float(), targets.flatten(),
                           reduction="none").view_as(soft)
    return (alpha * temperature**2 * soft + (1 - alpha) * hard).mean()
    ### END SOLUTION


def total_variation(teacher_logits: torch.Tensor, student_logits: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """Exercise 10.3: Total variation ½ Σ |p − q| between next-token distributions, per position.

    [..., vocab] logits -> [...]; p and q are the softmaxes at ``temperature``.
    Speculative decoding accepts a draft's token with probability 1 − TV(p, q).
    """
    ### BEGIN SOLUTION
    p = F.softmax(teacher_logits.float() / temperature, dim=-1)
    q = F.softmax(student_logits.float() / temperature, dim=-1)
    return 0.5 * (p - q).abs().sum(-1)
    ### END SOLUTION


def greedy_agreement(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                     mask: torch.Tensor) -> float:
    """Exercise 10.4: How often the student's greedy token is the teacher's, over the real tokens.

    logits [batch, seq, vocab], mask [batch, seq] bool. The fraction of real positions
    where the argmaxes agree (ties: the first index, as ``argmax``), pooled over all real
    positions (not a mean of per-row fractions). This is greedy speculative decoding's
    acceptance rate, teacher-forced.
    """
    ### BEGIN SOLUTION
    same = student_logits.argmax(-1) == teacher_logits.argmax(-1)
    return float(same[mask].float().mean())
    ### END SOLUTION
